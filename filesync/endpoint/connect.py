"""Which endpoint serves a conduit: the python helper, or the POSIX fallback where the
remote has no python3; one per conduit, kept until ``drop_session``."""

from __future__ import annotations

import weakref
from collections.abc import Callable

from filesync.core.exclude import ExcludeRule
from filesync.endpoint.contract import Endpoint
from filesync.endpoint.helper import HelperEndpoint, NoPython
from filesync.endpoint.idle import IDLE_TIMEOUT, IdleConduit
from filesync.endpoint.posix import PosixEndpoint
from filesync.transport.base import Conduit

_SESSIONS: weakref.WeakKeyDictionary[Conduit, Endpoint] = weakref.WeakKeyDictionary()


async def session_for(
    conduit: Conduit,
    log: Callable[[str], None] | None = None,
    list_first: tuple[str, ExcludeRule] | None = None,
    watch: bool = False,
    idle: float = IDLE_TIMEOUT,
) -> Endpoint:
    """The conduit's endpoint, started on first use (``list_first``, ``watch``: see
    ``HelperEndpoint.start``; the POSIX fallback needs neither; ``idle``: the idle
    deadline, ``filesync.endpoint.idle``)."""
    session = _SESSIONS.get(conduit)
    if session is None:
        session = _SESSIONS[conduit] = await open_session(
            IdleConduit(conduit, idle), log, list_first, watch)
    elif isinstance(wrapped := getattr(session, "conduit", None), IdleConduit):
        wrapped.idle = idle
    session.watch = watch
    return session


async def drop_session(conduit: Conduit, *, polite: bool = True) -> None:
    """End the conduit's helper session: with ``bye``, or (not polite) by killing it."""
    session = _SESSIONS.pop(conduit, None)
    if session is not None:
        if not polite:
            session.broken = True
        await session.close()


async def open_session(
    conduit: Conduit,
    log: Callable[[str], None] | None = None,
    list_first: tuple[str, ExcludeRule] | None = None,
    watch: bool = False,
) -> Endpoint:
    """Start the python3 helper on the remote, or the POSIX fallback where it has none."""
    try:
        if list_first is None:
            return await HelperEndpoint.start(conduit)
        return await HelperEndpoint.start(conduit, list_first=list_first, watch=watch)
    except NoPython as exc:
        if log is not None:
            log(f"{exc.why}: using the POSIX fallback (sh, find, tar)")
        return await PosixEndpoint.start(conduit)
