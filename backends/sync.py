"""Sync for a terminal backend that keeps its own command path (``filesync.backends.sync``).

A framework whose backend runs commands through its own SSH or sandbox API replaces its
file-sync manager with one of these: :class:`BackendSync` over a blocking
:class:`filesync.Session` (threaded code), :class:`AsyncBackendSync` over an
:class:`filesync.AsyncSession` (``SSHTerminal`` uses it). Both follow one policy
(:class:`SyncPolicy`):

- ``setup()`` pushes every mapping (two-way and upload-only); a mapping that fails is kept in
  the returned report's ``failed`` and the others are still pushed (``keep_going``); a call
  that cannot run at all (no connection) raises;
- ``before_command()`` pushes again when ``interval`` seconds (by ``clock``) have passed since
  the last push that succeeded, or at once when the last push failed (a failed push is
  retried at the next command, not after the interval); it never raises a ``FilesyncError``:
  a failure is logged and comes back in the report;
- ``teardown()`` pulls the two-way mappings (upload-only ones, such as credentials, are never
  written back) and never raises: it returns the report, its ``failed`` holding each mapping
  that did not come back with the reason;
- self-sync (``filesync.SelfSync``: the remote tree is the local one reached twice, a loopback
  target) turns sync off with one warning (``on_self_sync="disable"``, the default), after
  which every call is a no-op returning an empty report; ``"raise"`` raises it from the call
  that found it (``teardown`` still never raises);
- every call of one helper runs alone (a lock), so threads sharing a backend push once.

The helper never closes the session: the backend does, after ``teardown()``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence

from filesync import (
    TWO_WAY,
    AsyncSession,
    FilesyncError,
    Mapping,
    SelfSync,
    Session,
    SessionReport,
)

__all__ = ["ON_SELF_SYNC", "AsyncBackendSync", "BackendSync", "SyncPolicy", "check_on_self_sync",
           "failed_report"]

log = logging.getLogger(__name__)

#: The values of ``on_self_sync``: turn sync off with one warning, or raise ``SelfSync``.
ON_SELF_SYNC = ("disable", "raise")

Clock = Callable[[], float]


def check_on_self_sync(value: str) -> str:
    """``value`` if it is one of :data:`ON_SELF_SYNC`, else a one-line ``ValueError``."""
    if value not in ON_SELF_SYNC:
        raise ValueError(f"on_self_sync={value!r} is not valid; use 'disable' "
                         "(sync off, the terminal keeps working) or 'raise'")
    return value


class SyncPolicy:
    """When to push and what a failure does: the one rule both helpers (and every terminal)
    follow. Holds no connection; the helpers call it around their session calls."""

    def __init__(self, mappings: Sequence[Mapping], *, interval: float = 5.0,
                 on_self_sync: str = "disable", clock: Clock = time.monotonic) -> None:
        check_on_self_sync(on_self_sync)
        if interval < 0:
            raise ValueError(f"interval={interval!r} must be >= 0 seconds")
        self.mappings = list(mappings)
        self.interval = interval
        self.on_self_sync = on_self_sync
        self._clock = clock
        #: False once self-sync turned sync off: every later call does nothing.
        self.enabled = True
        #: When the next push before a command is due (None: at the next command).
        self._next: float | None = None

    def due(self) -> bool:
        """Whether ``before_command`` pushes now."""
        if not (self.enabled and self.mappings):
            return False
        return self._next is None or self._clock() >= self._next

    def pushed(self, report: SessionReport) -> SessionReport:
        """Record a push's report: the interval starts now, unless a mapping failed."""
        for mapping, error in report.failed:
            log.warning("push of %s failed (retried at the next command): %s",
                        mapping.local, error)
        self._next = None if report.failed else self._clock() + self.interval
        return report

    def push_failed(self, error: FilesyncError) -> SessionReport:
        """A push that could not run: retried at the next command."""
        log.warning("push failed (retried at the next command): %s", error)
        self._next = None
        return failed_report(self.mappings, error)

    def pulled(self, report: SessionReport) -> SessionReport:
        for mapping, error in report.failed:
            log.warning("sync-back of %s failed: %s", mapping.local, error)
        return report

    def pull_failed(self, error: Exception) -> SessionReport:
        log.warning("sync-back failed: %s", error)
        wrapped = error if isinstance(error, FilesyncError) else FilesyncError(
            f"sync-back failed: {error!r}")
        return failed_report([m for m in self.mappings if m.mode == TWO_WAY], wrapped)

    def self_sync(self, error: SelfSync, *, may_raise: bool = True) -> SessionReport:
        """Self-sync found: raise it (``"raise"``, where the call may), else sync off."""
        if self.on_self_sync == "raise" and may_raise:
            raise error
        if self.enabled:
            self.enabled = False
            log.warning("sync is off for this terminal, which keeps working: %s", error)
        return SessionReport()

    def pulls(self) -> list[Mapping]:
        """What ``teardown`` passes to ``pull``: every mapping, while sync is on and one is
        two-way (the pull leaves upload-only ones out, but the nested rule must see them,
        or an outer pull would bring an inner credential back)."""
        if self.enabled and any(m.mode == TWO_WAY for m in self.mappings):
            return self.mappings
        return []


def failed_report(mappings: Sequence[Mapping], error: FilesyncError) -> SessionReport:
    """A report of a call that did not run: every mapping failed with ``error``."""
    report = SessionReport()
    report.failed = [(m, error) for m in mappings]
    return report


class BackendSync:
    """The policy over a blocking :class:`filesync.Session`, for threaded backends."""

    def __init__(self, session: Session, mappings: Sequence[Mapping], *,
                 interval: float = 5.0, on_self_sync: str = "disable",
                 clock: Clock = time.monotonic) -> None:
        self.session = session
        self.policy = SyncPolicy(mappings, interval=interval, on_self_sync=on_self_sync,
                                 clock=clock)
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.policy.enabled

    def setup(self) -> SessionReport:
        """Push every mapping; see the module docstring."""
        with self._lock:
            return self._push()

    def before_command(self) -> SessionReport | None:
        """Push if due (None: nothing was due); never raises a ``FilesyncError``."""
        with self._lock:
            if not self.policy.due():
                return None
            try:
                return self._push()
            except SelfSync:
                raise
            except FilesyncError as exc:
                return self.policy.push_failed(exc)

    def teardown(self) -> SessionReport:
        """Pull the two-way mappings; never raises."""
        with self._lock:
            pulls = self.policy.pulls()
            if not pulls:
                return SessionReport()
            try:
                return self.policy.pulled(self.session.pull(pulls, keep_going=True))
            except SelfSync as exc:
                return self.policy.self_sync(exc, may_raise=False)
            except Exception as exc:  # teardown runs from atexit and reapers: never raise
                return self.policy.pull_failed(exc)

    def _push(self) -> SessionReport:
        if not (self.policy.enabled and self.policy.mappings):
            return SessionReport()
        try:
            return self.policy.pushed(self.session.push(self.policy.mappings,
                                                        keep_going=True))
        except SelfSync as exc:
            return self.policy.self_sync(exc)


class AsyncBackendSync:
    """The policy over an :class:`filesync.AsyncSession`, for asyncio backends."""

    def __init__(self, session: AsyncSession, mappings: Sequence[Mapping], *,
                 interval: float = 5.0, on_self_sync: str = "disable",
                 clock: Clock = time.monotonic) -> None:
        self.session = session
        self.policy = SyncPolicy(mappings, interval=interval, on_self_sync=on_self_sync,
                                 clock=clock)
        self._lock: asyncio.Lock | None = None

    @property
    def enabled(self) -> bool:
        return self.policy.enabled

    async def setup(self) -> SessionReport:
        """Push every mapping; see the module docstring."""
        async with self._serial():
            return await self._push()

    async def before_command(self) -> SessionReport | None:
        """Push if due (None: nothing was due); never raises a ``FilesyncError``."""
        async with self._serial():
            if not self.policy.due():
                return None
            try:
                return await self._push()
            except SelfSync:
                raise
            except FilesyncError as exc:
                return self.policy.push_failed(exc)

    async def teardown(self) -> SessionReport:
        """Pull the two-way mappings; never raises (cancellation still propagates)."""
        async with self._serial():
            pulls = self.policy.pulls()
            if not pulls:
                return SessionReport()
            try:
                return self.policy.pulled(await self.session.pull(pulls, keep_going=True))
            except SelfSync as exc:
                return self.policy.self_sync(exc, may_raise=False)
            except Exception as exc:  # teardown runs on any exit path: never raise
                return self.policy.pull_failed(exc)

    def _serial(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    async def _push(self) -> SessionReport:
        if not (self.policy.enabled and self.policy.mappings):
            return SessionReport()
        try:
            return self.policy.pushed(await self.session.push(self.policy.mappings,
                                                              keep_going=True))
        except SelfSync as exc:
            return self.policy.self_sync(exc)
