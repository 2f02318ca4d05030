"""``AsyncSession``: push, pull, sync and status of mappings over one kept connection.

Guarantees:

- one connection for the session's life, opened on the first call (``conduit=``: a
  ``Conduit``, or a factory called for it); a connection found dead is replaced on the
  next call, and a call whose connection, opened by an earlier call, is lost before its
  first pass is done runs once more on a new one (passes are idempotent: what was done
  is recorded). The calls run through ``filesync.session.runner``, as the CLI's do;
- calls are serialized (one at a time, in the order they were made); a call after
  ``close()`` raises ``SessionClosed``; ``close()`` waits for the running call, then ends
  the remote helper and the connection, and is safe to call twice;
- before any pass of ``push``, ``pull`` or ``sync`` runs, every mapping of the call is
  planned (``BadMapping``) and checked against self-sync (``SelfSync``): either refusal
  leaves both sides as they were. ``status`` runs the passes dry: nothing changes;
- an ``AsyncSession`` belongs to the event loop of its first call (its connection does);
  code without one loop for the session's life uses ``Session``;
- passes run in mapping order and the first failure is raised (the passes before it are
  done and recorded); with ``keep_going=True`` a pass's ``FilesyncError``, or a mapping's
  ``BadMapping`` (it names the mapping), is kept in ``report.failed`` and the other
  passes run (a lost connection and ``SelfSync`` are still raised);
  ``timeout`` bounds a whole call (``SessionTimeout``): a pass cut
  by it leaves nothing half-applied (the engine journals every change);
- a pass waits up to ``lock_timeout`` (60 s; 0: not at all) for another run of its pair
  (a session in another thread or process), sleeping on the loop; then ``LockBusy``,
  whose message names ``lock_timeout``;
- a call raises only ``FilesyncError``s: anything else becomes ``InternalError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import re
import shlex
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from filesync.core.reconcile import Direction
from filesync.endpoint.contract import Endpoint
from filesync.errors import (
    ConnectionLost,
    FilesyncError,
    InternalError,
    SelfSync,
    SessionClosed,
    SessionTimeout,
    ShutdownError,
    UsageError,
)
from filesync.mapping import Mapping
from filesync.session.passes import Call, PassSpec, Rules, as_list, plan_passes, state_dir_of
from filesync.session.runner import Deadline, Job, PassRun, Runner, load_deferred
from filesync.session.watch import WatchLoop
from filesync.sync.engine import Options, Report
from filesync.sync.warm import WarmState
from filesync.transport.base import Conduit
from filesync.transport.local import CommandConduit
from filesync.transport.pool import Conduits
from filesync.transport.ssh.options import check_ssh_options
from filesync.transport.target import ConnectOptions, Target, open_conduit, parse_remote

# A session's call may run at interpreter teardown, when nothing can be imported any more.
load_deferred()

#: Where a session's connection comes from: a conduit, or a factory that opens one.
ConduitSource = Conduit | Callable[[], Awaitable[Conduit]]
StrPath = str | os.PathLike[str]
Mappings = Mapping | Sequence[Mapping]


@dataclass
class SessionReport(Report):
    """A ``Report`` summed over the passes of one call, plus each pass's own.

    Counters are sums; lists are joined in mapping order, their paths relative to each
    pass's root (the mapping's directory, or a single file's parent). ``passes`` pairs
    each mapping that ran with its ``Report`` (``pull`` leaves upload-only ones out);
    ``failed`` each mapping whose pass failed with its error (only with ``keep_going``).
    """

    passes: list[tuple[Mapping, Report]] = field(default_factory=list)
    failed: list[tuple[Mapping, FilesyncError]] = field(default_factory=list)

    def add(self, mapping: Mapping, report: Report) -> None:
        """Add one pass's ``report`` for ``mapping``: its sums and lists join this one's."""
        self.passes.append((mapping, report))
        for name in ("excluded", "bytes_sent", "bytes_received"):
            setattr(self, name, getattr(self, name) + getattr(report, name))
        self.seconds += report.seconds
        self.conflicts += report.conflicts
        self.skipped += report.skipped
        self.plan += report.plan
        self.open_conflicts += report.open_conflicts
        self.errors += report.errors
        self.changes += report.changes
        self.pruned += report.pruned


#: What ``watch`` calls with each pass's report.
OnReport = Callable[[SessionReport], None]

_BARE_HOST = re.compile(r"^(?:[^@/:]+@)?(?:\[[^\]/]+\]|[^@/:\[\]~.][^@/:\[\]]*)$")


def remote_target(remote: StrPath) -> Target:
    """The session's remote: ``[user@]host[:base]``, ``ssh://[user@]host[:port][/base]``,
    or a local path or ``file://`` URL (``~`` expanded)."""
    if isinstance(remote, os.PathLike):
        return parse_remote(os.path.expanduser(os.fspath(remote)))
    return parse_remote(f"{remote}:" if _BARE_HOST.match(remote) else remote)


class AsyncSession:
    """Sync mappings with one remote over one connection (see the module docstring).

    ``remote``: ``[user@]host``, ``[user@]host:base``, ``ssh://[user@]host[:port]/base``,
    a local path or ``file://`` URL (the local transport); a mapping's relative remote
    path lies under the base (default: the remote home, or the local path given).
    ``via``: a command that reaches the remote's shell (``"docker exec -i box"``);
    ``remote`` is then the base path there. ``conduit``: a custom transport (a ``Conduit``
    or an async factory of one); ``remote`` is then the base path (default ``"."``).
    ``ssh_options``: more options for the system ssh, such as ``["-o",
    "ControlPath=PATH"]``: a master running there (the caller's own) is ridden, with no
    second login, and never ended by the session.
    """

    def __init__(
        self,
        remote: StrPath | None = None,
        *,
        conduit: ConduitSource | None = None,
        ssh_config: StrPath | None = None,
        identity: StrPath | None = None,
        via: str | Sequence[str] | None = None,
        state_dir: StrPath | None = None,
        exclude: Sequence[str] = (),
        default_excludes: bool = True,
        accept_new_host_key: bool = False,
        timeout: float | None = None,
        lock_timeout: float = 60.0,
        connect_timeout: float = 15.0,
        ssh_options: Sequence[str] = (),
        force: bool = False,
        max_file_size: int = 1 << 30,
        max_pull_bytes: int = 2 << 30,
        watch: bool = False,
        log: Callable[[str], None] | None = None,
    ) -> None:
        if isinstance(exclude, str):
            raise UsageError("exclude takes a list of patterns, not one string")
        self._source = conduit
        self._target: Target | None = None
        self._via: list[str] = []
        self._via_label = ""
        if conduit is not None or via is not None:
            self._base = os.fspath(remote) if remote is not None else "."
            if via is not None:
                self._via = shlex.split(via) if isinstance(via, str) else list(via)
                # The CLI's identity for --via, so both share the pair's state.
                self._via_label = f"via:{via if isinstance(via, str) else shlex.join(via)}"
                if not self._via:
                    raise UsageError("via needs a command, such as via='docker exec -i NAME'")
        elif remote is None:
            raise UsageError("give the session a remote ([user@]host, a path) or a conduit")
        else:
            self._target = remote_target(remote)
            self._base = self._target.path
        self._connect = ConnectOptions(
            ssh_config=_path(ssh_config), identity=_path(identity),
            accept_new_host_key=accept_new_host_key, connect_timeout=connect_timeout, log=log,
            ssh_options=tuple(check_ssh_options(ssh_options)),
        )
        self._rules = Rules(tuple(exclude), default_excludes)
        self.state_dir = state_dir_of(state_dir)
        #: The bound on each call, in seconds (None: none); may be changed between calls.
        self.timeout = timeout
        self._options = Options(Direction.PUSH, state_dir=self.state_dir, force=force,
                                lock_timeout=lock_timeout, lock_option=_lock_option(lock_timeout),
                                max_file_size=max_file_size,
                                max_pull_bytes=max_pull_bytes, log=log)
        #: What this session keeps between its calls, and no other session sees.
        self._warm = WarmState(watch=watch)
        self._log = log
        self._conduit: Conduit | None = None
        #: Runs every call's passes over the session's one kept connection.
        self._runner = Runner(_KeptConnection(self), self._warm, self._connect, log=log,
                              renewable=not isinstance(conduit, Conduit))
        self._lock: asyncio.Lock | None = None
        self._closed = False
        #: The running ``watch`` loops (``filesync.session.watch``).
        self._watches: list[WatchLoop[SessionReport]] = []
        #: How many connections this session opened (one, unless one was lost).
        self.connections_opened = 0

    # -- the calls ----------------------------------------------------------------

    async def push(self, mappings: Mappings, *, keep_going: bool = False) -> SessionReport:
        """Push every mapping (two-way and upload-only): the remote gets the local state.

        On return each host file is on the remote as the pass scanned it (but what it
        skipped, ``report.skipped``), and a remote file the host deleted is gone; a
        remote edit it replaced was saved first (``report.conflicts``); remote-only files
        never pushed are left alone. On a failure the passes before it are done and
        recorded, and nothing is half-applied."""
        return await self._call(Call.PUSH, mappings, keep_going)

    async def pull(self, mappings: Mappings, *, keep_going: bool = False) -> SessionReport:
        """Pull the two-way mappings; upload-only ones are never written back.

        On return a remote change since the last pass is on the host (but what it
        skipped, ``report.skipped``); where the host changed the file too, the host's
        version stays and the remote's is saved (``report.conflicts``). A failure leaves
        nothing half-applied."""
        return await self._call(Call.PULL, mappings, keep_going)

    async def sync(self, mappings: Mappings, *, keep_going: bool = False) -> SessionReport:
        """Sync two-way mappings both ways (conflicts keep both versions); push the rest.

        On return a change made on one side since the last pass is on the other (but
        what it skipped, ``report.skipped``); a file changed differently on both sides is
        an open conflict with both versions kept (an edit against a deletion: the edit
        wins). A failure leaves nothing half-applied."""
        return await self._call(Call.SYNC, mappings, keep_going)

    async def status(self, mappings: Mappings) -> SessionReport:
        """The plan ``sync`` would carry out (``report.plan``), changing nothing."""
        return await self._call(Call.STATUS, mappings)

    async def watch(self, mappings: Mappings, on_report: OnReport | None = None, *,
                    force_polling: bool = False) -> WatchLoop[SessionReport]:
        """Sync ``mappings`` now, then again whenever either side changes, until the
        returned loop's ``stop()`` (which runs a last pass) or ``close()``. ``on_report``
        gets each pass's report; see ``filesync.session.watch`` and docs/library.md."""
        if self._closed:
            raise closed_error()
        self._warm.start_watching()  # both sides' trees stay watched between passes
        loop = WatchLoop(self, mappings, on_report, force_polling=force_polling)
        self._watches.append(loop)
        try:
            await loop.start()
        except BaseException:
            self._watches.remove(loop)
            raise
        return loop

    async def close(self) -> None:
        """Stop every watch (after its last pass), wait for the running call, then end
        the helper and the connection."""
        for loop in list(self._watches):
            with contextlib.suppress(Exception):
                await loop.stop()
        self._closed = True
        async with self._serial():
            conduit, self._conduit = self._conduit, None
            try:
                if conduit is not None:
                    await self._release(conduit, polite=True)
            finally:
                await self._warm.close()

    async def __aenter__(self) -> AsyncSession:
        """The session itself; leaving the block awaits ``close()``."""
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- internals ----------------------------------------------------------------

    def _serial(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    async def _call(self, call: Call, mappings: Mappings,
                    keep_going: bool = False) -> SessionReport:
        items = as_list(mappings)
        if self._closed:
            raise closed_error()
        for loop in self._watches:
            loop.interrupt()
        try:
            return await self._serialized(call, items, keep_going)
        except (FilesyncError, asyncio.CancelledError):
            raise
        except Exception as exc:
            raise unexpected_error(exc) from exc

    async def _serialized(self, call: Call, items: list[Mapping],
                          keep_going: bool) -> SessionReport:
        async with self._serial():
            if self._closed:
                raise closed_error()
            return await self._run(call, items, keep_going)

    async def _run(self, call: Call, items: list[Mapping],
                   keep_going: bool) -> SessionReport:
        """The call's passes, through the runner (``filesync.session.runner``): its retry
        of a connection that died idle, its self-sync guard and its deadline."""
        report = SessionReport()
        specs: list[PassSpec] = []

        async def plan(_conduit: Conduit, endpoint: Endpoint) -> list[PassRun]:
            report.failed.clear()  # planned again on a new connection: afresh
            specs[:] = await plan_passes(call, items, endpoint, self._base, self._rules,
                                         self.state_dir,
                                         failed=report.failed if keep_going else None)
            return [PassRun(s.local_root, s.remote_path, self._pass_options(s, call),
                            s.plan_filter(), s.remote_root) for s in specs]

        timeout = self.timeout
        deadline = None if timeout is None else Deadline(timeout, lambda: SessionTimeout(
            f"the {call.value} took longer than timeout={timeout} s; call again to continue "
            "(nothing was half-applied) or raise the timeout"))
        target = self._target or Target("via", self._base, via=self._via_label)
        (outcome,) = await self._runner.run([Job(target, plan)], guard=call is not Call.STATUS,
                                            deadline=deadline, keep_going=keep_going)
        for spec, (_run, result) in zip(specs, outcome.passes, strict=False):
            if isinstance(result, Report):
                report.add(spec.mapping, result)
            elif not keep_going or isinstance(result, ConnectionLost | SelfSync):
                raise result
            else:
                report.failed.append((spec.mapping, result))
        if outcome.error is not None:
            raise outcome.error
        return report

    def _pass_options(self, spec: PassSpec, call: Call) -> Options:
        return dataclasses.replace(self._options, direction=spec.direction, rule=spec.rule,
                                   state_dir=spec.state_dir, dry_run=call is Call.STATUS,
                                   rename=spec.rename)

    async def _endpoint(self, conduit: Conduit) -> Endpoint:
        """The session's endpoint on ``conduit`` (watching once the session watches)."""
        return await self._warm.endpoints.endpoint_for(conduit, self._log,
                                                       watch=self._warm.watching)

    async def _connection(self) -> Conduit:
        if self._conduit is not None and not self._conduit.alive:
            await self._forget_connection()
        if self._conduit is None:
            self._conduit = await self._open()
            self.connections_opened += 1
        return self._conduit

    async def _open(self) -> Conduit:
        source = self._source
        if isinstance(source, Conduit):
            if self.connections_opened:
                raise ConnectionLost("the session's conduit was lost; open a new session "
                                     "(pass a conduit factory to reconnect on its own)")
            return source
        if source is not None:
            return await source()
        if self._target is None:
            return CommandConduit(self._via, self._via_label)
        return await open_conduit(self._target, self._connect)

    async def _forget_connection(self) -> None:
        conduit, self._conduit = self._conduit, None
        if conduit is not None:
            await self._release(conduit, polite=False)

    async def _release(self, conduit: Conduit, *, polite: bool) -> None:
        try:
            await self._warm.endpoints.drop_endpoint(conduit, polite=polite)
        finally:
            await conduit.close()


class _KeptConnection(Conduits):
    """The session's one connection as the runner's pool: kept from call to call; given
    back unhealthy, it is forgotten (the next call opens a new one)."""

    def __init__(self, session: AsyncSession) -> None:
        super().__init__()
        self._session = session

    async def acquire(self, target: Target, opts: ConnectOptions) -> tuple[Conduit, bool]:
        kept = self._session._conduit
        reused = kept is not None and kept.alive
        return await self._session._connection(), reused

    async def release(self, conduit: Conduit, healthy: bool) -> None:
        if not (healthy and conduit.alive) and conduit is self._session._conduit:
            await self._session._forget_connection()


def unexpected_error(exc: Exception) -> FilesyncError:
    """What a call raises for an exception that is no ``FilesyncError``: one line naming
    it (a caller that catches the documented errors never sees anything else)."""
    what = " ".join(f"{type(exc).__name__}: {exc}".split())
    if sys.is_finalizing():
        return ShutdownError(f"the interpreter is shutting down and the call failed ({what}); "
                             "sync before exit (an atexit hook works) or close() the "
                             "session explicitly")
    return InternalError(f"filesync failed unexpectedly ({what}); both sides are whole, "
                         "call again, and report this with the traceback of __cause__")


def closed_error() -> SessionClosed:
    """The error of a call after ``close()``."""
    return SessionClosed("this filesync session is closed; open a new Session to sync again")


def _lock_option(lock_timeout: float) -> str:
    return (f"raise the session's lock_timeout (it waited {lock_timeout:g} s)" if lock_timeout
            else "give the session a lock_timeout in seconds to wait for it")


def _path(value: StrPath | None) -> Path | None:
    return None if value is None else Path(os.path.expanduser(os.fspath(value)))
