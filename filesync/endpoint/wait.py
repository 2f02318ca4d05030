"""Waiting for the remote side to change: the helper's ``wait`` request, as a watch loop
(``filesync.session.watch``) uses it.

Why a long-poll and not a timer: an idle watch must cost next to nothing (the target is
under 1 % of a core with a 100k-file tree) and still see a remote write within a few
hundred milliseconds. A listing every few hundred milliseconds would gather the whole
watched tree each time; a ``wait`` sleeps in the helper's ``select`` on its inotify
descriptors and on its input, and the client sleeps on the reply. Neither side wakes
until something changes, the wait's ``timeout`` passes, or the client has something to
say: ``wake`` ends the wait at once, so a host change or another call on the session is
never held up by it. The helper's keepalives while it waits keep the idle deadline from
firing and show a dead connection as one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from filesync.core.exclude import ExcludeRule
from filesync.endpoint.contract import Endpoint
from filesync.endpoint.helper import HelperEndpoint
from filesync.tree.wire import Op, encode_json, frame


@dataclass(frozen=True)
class Waited:
    """How a wait ended: ``changed`` (a watched root changed), ``woken`` (``wake`` was set
    first), and how many of the roots the helper watches (the others must be polled)."""

    changed: bool
    woken: bool
    watched: int


async def wait_change(
    endpoint: Endpoint,
    roots: Sequence[tuple[str, ExcludeRule]],
    timeout: float,
    settle: float,
    wake: asyncio.Event,
) -> Waited | None:
    """Wait until one of ``roots`` (remote root, rule: as listed with ``watch``) changes,
    ``wake`` is set, or ``timeout`` seconds pass; None where the endpoint cannot wait
    (the POSIX fallback). The caller holds the session's lock (the stream is its)."""
    if not isinstance(endpoint, HelperEndpoint):
        return None
    await endpoint._request({
        "op": Op.WAIT.value, "timeout": timeout, "settle": settle,
        "roots": [{"root": root, **rule.wire()} for root, rule in roots],
    })
    reply = asyncio.ensure_future(endpoint._reply())
    woken = asyncio.ensure_future(wake.wait())
    try:
        await asyncio.wait((reply, woken), return_when=asyncio.FIRST_COMPLETED)
        if not reply.done():
            await endpoint.proc.write(frame(b"J", encode_json({"op": Op.WAKE.value})))
        got = await reply
    except BaseException:
        if not reply.done():
            endpoint.broken = True  # the reply is still owed: the stream is out of step
            reply.cancel()
        raise
    finally:
        woken.cancel()
    watched = got.get("watched")
    return Waited(got.get("changed") is True, wake.is_set(),
                  watched if isinstance(watched, int) else 0)
