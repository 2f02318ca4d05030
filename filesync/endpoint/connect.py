"""Which endpoint serves a conduit: the python helper, or the POSIX fallback where the
remote has no python3.

``Endpoints`` is one owner's map of them, one per conduit: started on first use, ended by
``drop_endpoint`` (a conduit released) or ``close`` (the owner closing). Two owners never
share an endpoint, even on one conduit."""

from __future__ import annotations

import weakref
from collections.abc import Callable

from filesync.core.exclude import ExcludeRule
from filesync.endpoint.contract import Endpoint
from filesync.endpoint.helper import HelperEndpoint, NoPython
from filesync.endpoint.idle import IDLE_TIMEOUT, IdleConduit
from filesync.transport.base import Conduit


class Endpoints:
    """The endpoint of each conduit one owner uses (see the module docstring). Weakly
    keyed: a conduit nobody holds any more takes its entry with it."""

    def __init__(self) -> None:
        self._open: weakref.WeakKeyDictionary[Conduit, Endpoint] = weakref.WeakKeyDictionary()

    def __len__(self) -> int:
        return len(self._open)

    async def endpoint_for(
        self,
        conduit: Conduit,
        log: Callable[[str], None] | None = None,
        list_first: tuple[str, ExcludeRule] | None = None,
        watch: bool = False,
        idle: float = IDLE_TIMEOUT,
    ) -> Endpoint:
        """The conduit's endpoint, started on first use (``list_first``, ``watch``: see
        ``HelperEndpoint.start``; the POSIX fallback needs neither; ``idle``: the idle
        deadline, ``filesync.endpoint.idle``)."""
        endpoint = self._open.get(conduit)
        if endpoint is None:
            endpoint = self._open[conduit] = await open_endpoint(
                IdleConduit(conduit, idle), log, list_first, watch)
        elif isinstance(wrapped := getattr(endpoint, "conduit", None), IdleConduit):
            wrapped.idle = idle
        endpoint.watch = watch
        return endpoint

    async def drop_endpoint(self, conduit: Conduit, *, polite: bool = True) -> None:
        """End the conduit's endpoint: with ``bye``, or (not polite) by killing it."""
        endpoint = self._open.pop(conduit, None)
        if endpoint is not None:
            if not polite:
                endpoint.broken = True
            await endpoint.close()

    async def close(self) -> None:
        """End every endpoint politely (their conduits stay open: their owner's to close)."""
        for conduit in list(self._open):
            await self.drop_endpoint(conduit)


async def open_endpoint(
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
        # Imported here: most runs never fall back, and its modules (tarfile, decimal,
        # secrets) would stay in every long watch's memory for nothing.
        from filesync.endpoint.posix import PosixEndpoint
        return await PosixEndpoint.start(conduit)
