"""Continuous two-way sync: a ``sync`` pass whenever either side changes, until stopped.

``AsyncSession.watch`` (and ``Session.watch``, ``filesync watch``) run ``WatchLoop``.

Guarantees:

- the passes are the session's own ``sync`` calls (conflicts keep both versions, the
  journal keeps an interrupted pass whole, the safety guards apply), serialized with
  the session's other calls; ``watch`` returns once the first pass is done and both
  sides are watched;
- a change on either side leads to a pass: on the host through ``HostWatcher`` (the
  watches of the session's watched host trees, excluded trees never watched), on the
  remote through the helper's ``wait`` (``filesync.endpoint.wait``); a change made during
  a pass leads to one more. A burst of writes settles before the pass starts (quiet for
  ``filesync.host.watched.STEP_MS`` on the host, ``SETTLE`` on the remote); a file still
  being written when a pass reads it is either caught by the torn-read checks or sent
  again by the pass its next write causes;
- where a side cannot be watched (no native watcher, the watch limit, the POSIX
  fallback) the loop polls it with a pass every ``POLL`` seconds, said once through the
  session's ``log``; nothing is left unwatched silently;
- a lost connection (or a pass refused by another run's lock) is said once through
  ``log``, then the pass is retried with backoff (``BACKOFF``) on a new connection; the
  first pass after it starts a new helper, whose listing is a full walk, so what changed
  meanwhile on either side is found. A session built on a single ``Conduit`` cannot
  reconnect: the loop stops with the error;
- a safety guard (a vanished root, a mass delete) stops the loop with its
  ``SafetyRefusal``, nothing propagated; ``stop()`` runs one last pass, then returns;
  ``AsyncSession.close`` stops every watch first.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from filesync.core.exclude import ExcludeRule
from filesync.core.reconcile import Direction
from filesync.endpoint.contract import Endpoint
from filesync.endpoint.wait import wait_change
from filesync.errors import FilesyncError, LockBusy, SafetyRefusal, TransportError
from filesync.host import heap
from filesync.host.watcher import HostWatcher
from filesync.mapping import Mapping
from filesync.session.passes import Call, PassSpec, Rules, as_list, plan_passes
from filesync.sync.engine import Report
from filesync.sync.warm import WarmState
from filesync.transport.base import Conduit

#: The longest one ``wait`` on the helper lasts before it is asked again (seconds).
WAIT = 30.0
#: Quiet time that ends a burst of remote changes (seconds).
SETTLE = 0.03
#: Seconds between passes for a side that cannot be watched.
POLL = 2.0
#: Seconds between retries after a lost connection (the last one repeats).
BACKOFF = (0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0)

R = TypeVar("R", bound=Report)
R_co = TypeVar("R_co", bound=Report, covariant=True)


class WatchedSession(Protocol[R_co]):
    """What the loop uses of an ``AsyncSession`` (named here: the session imports the loop)."""

    @property
    def state_dir(self) -> Path: ...
    @property
    def _log(self) -> Callable[[str], None] | None: ...
    @property
    def _conduit(self) -> Conduit | None: ...
    @property
    def _base(self) -> str: ...
    @property
    def _rules(self) -> Rules: ...
    @property
    def _source(self) -> object: ...
    @property
    def _watches(self) -> list[Any]: ...
    @property
    def _warm(self) -> WarmState: ...
    def _serial(self) -> asyncio.Lock: ...
    async def _connection(self) -> Conduit: ...
    async def _endpoint(self, conduit: Conduit) -> Endpoint: ...
    async def _forget_connection(self) -> None: ...
    async def sync(self, mappings: Sequence[Mapping], *, keep_going: bool = False) -> R_co: ...


class WatchLoop(Generic[R]):
    """One running watch of ``mappings`` on ``session`` (see the module docstring).

    ``passes`` counts the passes run; ``error`` is what stopped the loop, if anything.
    """

    def __init__(self, session: WatchedSession[R], mappings: Mapping | Sequence[Mapping],
                 on_report: Callable[[R], None] | None = None, *,
                 force_polling: bool = False) -> None:
        self.session = session
        self.mappings: list[Mapping] = as_list(mappings)
        self.on_report = on_report
        self.force_polling = force_polling
        self.passes = 0
        self.error: BaseException | None = None
        self.host: HostWatcher | None = None
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()
        self._host_dirty = False
        self._waiting = False
        self._polled_remote = False
        self._task: asyncio.Task[None] | None = None

    # -- the public face --------------------------------------------------------------

    async def start(self) -> None:
        """Run the first pass, start watching both sides, and return (the loop runs on
        as a task of the current event loop)."""
        loop = asyncio.get_running_loop()

        def host_changed() -> None:
            loop.call_soon_threadsafe(self._on_host)

        await self._one_pass(retry=False)
        specs = await self._specs()
        # The watches of the session's own watched listings wake the loop too: one
        # watch per host tree.
        self.host = HostWatcher([(s.local_root, s.rule) for s in specs], host_changed,
                                self._log, trees=self.session._warm.trees,
                                force_polling=self.force_polling)
        await loop.run_in_executor(None, self.host.start)
        # Changes between the first pass and the watch: one more pass catches them.
        self._host_dirty = True
        self._task = asyncio.ensure_future(self._run(specs))

    async def stop(self) -> None:
        """Stop watching, after one last pass; raises what stopped the loop, if anything."""
        self._stop.set()
        self._wake.set()
        if self._task is not None:
            await asyncio.shield(self._task)
        if self.error is not None:
            raise self.error

    async def wait(self) -> None:
        """Wait for the loop to end (``stop``, or an error, which is raised)."""
        if self._task is not None:
            await asyncio.shield(self._task)
        if self.error is not None:
            raise self.error

    @property
    def running(self) -> bool:
        """True from the start until the loop ended (``stop``, or an error)."""
        return self._task is not None and not self._task.done()

    def interrupt(self) -> None:
        """Another call wants the session: end a wait on the helper now."""
        if self._waiting:
            self._wake.set()

    # -- the loop ---------------------------------------------------------------------

    def _on_host(self) -> None:
        self._host_dirty = True
        self._wake.set()

    def _log(self, message: str) -> None:
        if self.session._log is not None:
            self.session._log(message)

    async def _specs(self) -> list[PassSpec]:
        session = self.session
        async with session._serial():
            conduit = await session._connection()
            endpoint = await session._endpoint(conduit)
            return await plan_passes(Call.SYNC, self.mappings, endpoint, session._base,
                                     session._rules, session.state_dir)

    async def _run(self, specs: list[PassSpec]) -> None:
        remote = [(s.remote_root, s.rule) for s in specs if s.direction is Direction.SYNC]
        try:
            while not self._stop.is_set():
                if await self._changed(remote) and not self._stop.is_set():
                    await self._one_pass(retry=True)
            await self._one_pass(retry=False)  # the last pass
        except BaseException as exc:
            self.error = exc
            if not isinstance(exc, Exception):
                raise
        finally:
            self._waiting = False
            if self.host is not None:
                await asyncio.get_running_loop().run_in_executor(None, self.host.stop)
            with contextlib.suppress(ValueError):
                self.session._watches.remove(self)

    async def _changed(self, remote: list[tuple[str, ExcludeRule]]) -> bool:
        """Wait for a reason to run a pass; False when a wait ran out with none."""
        if self._host_dirty:
            return True
        session = self.session
        async with session._serial():
            self._wake.clear()
            if self._host_dirty or self._stop.is_set():
                return True
            conduit = session._conduit
            if not remote or conduit is None or not conduit.alive:
                waited = None  # nothing to wait on there; a lost connection: the pass says so
            else:
                endpoint = await session._endpoint(conduit)
                self._waiting = True
                try:
                    waited = await wait_change(endpoint, remote, WAIT, SETTLE, self._wake)
                except TransportError:
                    return True  # the pass finds the connection gone and says so
                finally:
                    self._waiting = False
                if waited is not None and waited.watched == len(remote):
                    self._polled_remote = False
                    return waited.changed or waited.woken
                if not self._polled_remote:
                    self._polled_remote = True
                    self._log("the remote tree cannot be watched there; polling it every "
                              f"{POLL:g} s instead")
        if not remote:
            await self._wake.wait()  # push-only mappings: the host alone drives the passes
            return True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), POLL)
        return True

    async def _one_pass(self, *, retry: bool) -> None:
        """One ``sync`` of the mappings; with ``retry``, a lost connection is said once
        and the pass retried with backoff until it runs or the loop is stopped."""
        lost = 0
        while True:
            self._host_dirty = False
            try:
                report = await self.session.sync(self.mappings)
            except SafetyRefusal:
                raise
            except (TransportError, LockBusy) as exc:
                if not retry or isinstance(self.session._source, Conduit):
                    raise
                if self._stop.is_set():
                    retry = False  # one more try, the last pass
                    continue
                if not lost:
                    self._log(f"{_what(exc)}: {exc.message}; retrying until it is back")
                async with self.session._serial():
                    await self.session._forget_connection()
                delay = BACKOFF[min(lost, len(BACKOFF) - 1)]
                lost += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), delay)
                continue
            if lost:
                self._log(f"connected again after {lost} retr{'y' if lost == 1 else 'ies'}")
            self.passes += 1
            # The pass's transient copies are freed by now: give their pages back, so
            # an hours-long watch holds what it keeps, not its largest pass's peak.
            heap.trim()
            if self.on_report is not None:
                self.on_report(report)
            return


def _what(exc: FilesyncError) -> str:
    return "the pair is locked by another run" if isinstance(exc, LockBusy) \
        else "the connection was lost"
