"""The one runner of passes: the CLI (fan-out included), ``AsyncSession`` and the agent
all run their passes here, as jobs over a pool of conduits.

A ``Job`` is the passes that share one connection: one target, and a plan that turns the
connection into passes (``PassRun``). ``Runner.run`` runs a list of jobs and returns one
``JobOutcome`` per job, plain values: each pass's ``Report`` or error, or what stopped
the job.

Guarantees:

- every job gets its conduit from the pool (``transport.pool.Conduits``) and gives it
  back, healthy unless a pass lost it; a job whose remote cannot be reached fails alone;
- every job is planned (concurrently) before any pass of any job runs; a plan refused as
  a ``UsageError`` (a bad mapping or pattern) is raised, with nothing run anywhere;
- one retry policy: a kept connection (the pool reused it) that is lost before its job's
  first pass is done died while idle (a server restart, an evicted NAT entry): the job
  runs again, once, on a new connection from the pool; nothing of it was applied, and
  passes are idempotent. Any other failure is the job's result, never retried;
- the self-sync guard (``guard=True``, ``filesync.session.selfsync``): every pair of a
  job is checked before anything of that job is applied (a pass's own pair while it
  lists, the job's other pairs before its first pass), once per pair and connection for
  the runner's life;
- the deadline (``Deadline``) bounds the whole run; the passes it cuts stop between
  journaled steps, nothing half-applied, and get the deadline's error as their result;
- with ``keep_going=False`` a job stops at its first failed pass; a lost connection or a
  self-sync refusal always ends its job, and is then also its ``error`` (the passes it
  left unrun share it);
- a job whose first pass is known before its connection (``Job.first_pass``) has that
  pass's host walk started before anything else of the run, so that it runs while ssh
  logs in and the helper starts; the pass takes it as the walk it would have started
  itself (``run_pass``'s ``walk``). Every walk the runner starts has ended when ``run``
  returns, whatever became of its job (a failed connection or plan, the deadline).

Ordering: a pass's host walk and remote listing are taken before the pair's lock is held
(``run_pass`` starts both before the state opens); what needs the lock follows it: the
state's reads, the recovery of an interrupted apply (after which the host is walked
again) and every write. An early walk keeps those rules: it is only taken sooner.

Passes of different jobs that read one local root share their host walks and reads
(``HostScans``); warm state (endpoints, state, watched trees, memos) is the runner's
owner's (``filesync.sync.warm.WarmState``), passed in.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from filesync.core import deferred
from filesync.core.reconcile import Action
from filesync.endpoint.contract import Endpoint
from filesync.endpoint.idle import IDLE_TIMEOUT
from filesync.endpoint.renamed import RenamedEndpoint
from filesync.errors import ConnectionLost, FilesyncError, SelfSync, UsageError
from filesync.host.shared_scan import HostScans
from filesync.session.selfsync import refuse_self_sync
from filesync.sync import plan as planning
from filesync.sync.engine import Options, Report, first_listing, run_pass
from filesync.sync.warm import WarmState
from filesync.transport.base import Conduit
from filesync.transport.pool import Conduits
from filesync.transport.target import ConnectOptions, Target

if TYPE_CHECKING:
    from filesync.transport.ssh.openssh_login import Pending

PlanFilter = Callable[[list[Action]], list[Action]]


#: What the passes load on first use (``filesync.core.deferred``), so that a CLI run loads
#: only the code it runs (a sealed no-op: no transition, journal, watch or undo code).
DEFERRED = ("filesync.host.journal", "filesync.host.watched",
            "filesync.sync.transition", "filesync.sync.undo")


def load_deferred() -> None:
    """Load now what the passes load on first use: a library session's call may run at
    interpreter teardown (atexit hooks, finalizers), when nothing can be imported."""
    for name in DEFERRED:
        deferred.load(name)


@dataclass(frozen=True)
class PassRun:
    """One pass as the runner runs it (``run_pass``'s arguments). ``remote_root``: the
    remote root resolved, where the planner knew it (the self-sync check of a job's later
    passes runs before its first)."""

    local: Path
    remote: str
    opts: Options
    plan_filter: PlanFilter | None = None
    remote_root: str | None = None


#: What a job's plan is given: its conduit and the endpoint there (the runner's owner's).
Plan = Callable[[Conduit, Endpoint], Awaitable[list[PassRun]]]


@dataclass(frozen=True)
class Job:
    """Passes that share one connection to ``target``, planned once it is up.

    ``first_pass``: the job's first pass, where it is known before the connection (the
    plan is still what runs): its listing request rides behind the helper's source, so
    the remote walks while the helper's hello is still on its way, and its host walk
    starts with the job, so the host is walked while ssh logs in."""

    target: Target
    plan: Plan
    first_pass: PassRun | None = None


@dataclass
class JobOutcome:
    """What became of one job: each pass run, in order, with its report or error; and
    ``error``, what stopped the job before (or between) its passes, if anything."""

    passes: list[tuple[PassRun, Report | FilesyncError]] = field(default_factory=list)
    error: FilesyncError | None = None
    #: the job ran to its end (the deadline cut none of it)
    done: bool = False


@dataclass(frozen=True)
class Deadline:
    """The bound of a whole run: ``seconds`` (> 0), and the error of what it cut."""

    seconds: float
    expired: Callable[[], FilesyncError]


class EndpointConduits(Conduits):
    """A pool whose release also ends the endpoint its owner's warm state started on the
    conduit (a conduit per ``acquire``, as ``Conduits``)."""

    def __init__(self, warm: WarmState, logins: dict[Target, Pending] | None = None) -> None:
        super().__init__(logins)
        self.warm = warm

    async def end(self, conduit: Conduit, healthy: bool) -> None:
        await self.warm.endpoints.drop_endpoint(conduit, polite=healthy)


class Runner:
    """Runs jobs over ``pool`` with the warm state of ``warm`` (see the module docstring).

    ``renewable``: whether the pool can give a new connection for a lost one (a session
    given one bare ``Conduit`` cannot): the retry policy applies only then. ``log``: told
    what the endpoints and the self-sync check have to say.
    """

    def __init__(self, pool: Conduits, warm: WarmState, connect: ConnectOptions, *,
                 log: Callable[[str], None] | None = None, renewable: bool = True) -> None:
        self.pool = pool
        self.warm = warm
        self.connect = connect
        self.log = log
        self.renewable = renewable
        self._checked: weakref.WeakKeyDictionary[Endpoint, set[tuple[Path, str]]] = (
            weakref.WeakKeyDictionary())

    async def run(self, jobs: Sequence[Job], *, guard: bool = True,
                  deadline: Deadline | None = None, keep_going: bool = True,
                  idle: float = IDLE_TIMEOUT) -> list[JobOutcome]:
        """Run ``jobs``; one outcome per job, in order. ``idle``: the endpoints' idle
        deadline (``filesync.endpoint.idle``)."""
        outcomes = [JobOutcome() for _ in jobs]
        work = self._run(jobs, outcomes, _Run(guard, keep_going, idle))
        if deadline is None:
            await work
            return outcomes
        try:
            await asyncio.wait_for(work, deadline.seconds)
        except TimeoutError:
            for outcome in outcomes:
                if outcome.error is None and not outcome.done:
                    outcome.error = deadline.expired()
        return outcomes

    async def undo(self, target: Target, local_root: Path, opts: Options) -> list[str]:
        """Undo the last pull of the pair (``filesync.sync.undo``) on a conduit of the
        pool; returns the restored paths."""
        conduit, _ = await self.pool.acquire(target, self.connect)
        healthy = False
        try:
            # Loaded here: only ``undo`` runs it, and other runs never load it.
            restored: list[str] = await deferred.load("filesync.sync.undo").undo_last(
                conduit, local_root, target.path, opts, self.warm)
            healthy = True
        finally:
            await self.pool.release(conduit, healthy)
        return restored

    async def _run(self, jobs: Sequence[Job], outcomes: list[JobOutcome], how: _Run) -> None:
        walks = _walks_ahead(jobs, self.warm)
        try:
            ready = await asyncio.gather(*(self._plan(j, how, True) for j in jobs))
            refused = [r.error for r in ready if isinstance(r, _Refused)]
            if refused:
                for r in ready:
                    if isinstance(r, _Ready):
                        await self.pool.release(r.conduit, True)
                raise refused[0]
            _share_host_scans([r for r in ready if isinstance(r, _Ready)])
            runs = []
            for job, outcome, r, walk in zip(jobs, outcomes, ready, walks, strict=True):
                if isinstance(r, _Ready):
                    r.walk = walk
                    runs.append(self._passes(job, outcome, r, how))
                else:
                    assert not isinstance(r, _Refused)
                    outcome.error, outcome.done = r, True
            await asyncio.gather(*runs)
        finally:
            for walk in walks:
                if walk is not None:
                    await walk.join()

    async def _plan(self, job: Job, how: _Run, may_retry: bool
                    ) -> _Ready | _Refused | FilesyncError:
        """Connect and plan ``job``; the retry policy's first half (planning)."""
        try:
            conduit, reused = await self.pool.acquire(job.target, self.connect)
        except FilesyncError as exc:
            return exc
        retry = may_retry and reused and self.renewable
        try:
            first = job.first_pass
            endpoint = await self.warm.endpoints.endpoint_for(
                conduit, self.log, first_listing(first.remote, first.opts) if first else None,
                watch=self.warm.watching, idle=how.idle)
            return _Ready(conduit, retry, await job.plan(conduit, endpoint))
        except ConnectionLost as exc:
            await self.pool.release(conduit, False)
            if not retry:
                return exc
            # A kept connection died while idle: plan again on a new one.
            return await self._plan(job, how, False)
        except UsageError as exc:
            await self.pool.release(conduit, True)
            return _Refused(exc)
        except FilesyncError as exc:
            await self.pool.release(conduit, False)
            return exc
        except BaseException:
            await self.pool.release(conduit, False)
            raise

    async def _passes(self, job: Job, outcome: JobOutcome, ready: _Ready, how: _Run) -> None:
        """Run the job's passes; the retry policy's second half (the first pass)."""
        try:
            try:
                await self._job_passes(ready, outcome, how)
            except _DiedIdle:
                # A kept connection died while idle (a server restart, an evicted NAT
                # entry): the failed pass changed nothing; the job runs on a new one.
                await self.pool.release(ready.conduit, False)
                again = await self._plan(job, how, False)
                if not isinstance(again, _Ready):
                    outcome.error = again.error if isinstance(again, _Refused) else again
                    outcome.done = True
                    return
                ready = again
                await self._job_passes(ready, outcome, how)
        except FilesyncError as exc:
            # A refusal before the passes (self-sync) leaves the connection as good as it
            # was; only a lost one is given back unhealthy.
            outcome.error, outcome.done = exc, True
            await self.pool.release(ready.conduit, not isinstance(exc, ConnectionLost))
            return
        except BaseException:
            await self.pool.release(ready.conduit, False)
            raise
        outcome.done = True
        lost = any(isinstance(r, ConnectionLost) for _p, r in outcome.passes)
        await self.pool.release(ready.conduit, not lost)

    async def _job_passes(self, ready: _Ready, outcome: JobOutcome, how: _Run) -> None:
        """The job's passes on its conduit, each one's result into ``outcome``."""
        conduit, passes = ready.conduit, ready.passes
        check = self._guard if how.guard else None
        if how.guard and any(p.remote_root is not None for p in passes[1:]):
            endpoint = await self.warm.endpoints.endpoint_for(conduit, self.log,
                                                              watch=self.warm.watching)
            await _list_ahead(endpoint, passes[0])
            for p in passes[1:]:
                if p.remote_root is not None:
                    await self._guard(endpoint, p.local, p.remote_root)
        for n, p in enumerate(passes):
            try:
                report = await run_pass(conduit, p.local, p.remote, p.opts, p.plan_filter,
                                        check, warm=self.warm, host_scans=ready.shared,
                                        walk=ready.walk if n == 0 else None)
            except ConnectionLost as exc:
                if n == 0 and ready.may_retry:
                    raise _DiedIdle from exc
                # The connection is gone: the job ends here, its later passes with it.
                outcome.passes.append((p, exc))
                outcome.error = exc
                return
            except SelfSync as exc:
                # One tree reached twice: nothing more of the job runs.
                outcome.passes.append((p, exc))
                outcome.error = exc
                return
            except FilesyncError as exc:
                outcome.passes.append((p, exc))
                if not how.keep_going:
                    return
                continue
            outcome.passes.append((p, report))

    async def _guard(self, endpoint: Endpoint, local_root: Path, remote_root: str) -> None:
        checked = self._checked.setdefault(endpoint, set())
        if (local_root, remote_root) not in checked:
            await refuse_self_sync(endpoint, local_root, remote_root, self.log)
            checked.add((local_root, remote_root))


async def _list_ahead(endpoint: Endpoint, first: PassRun) -> None:
    """Send the first pass's listing request before the job's other pairs are checked:
    their probes queue behind it (``Endpoint.any_exists``), so the remote walks meanwhile,
    and the pass takes the reply as if it had asked itself (same root and rule)."""
    if first.remote_root is None:
        return
    opts = first.opts
    ahead = endpoint if opts.rename is None else RenamedEndpoint(endpoint, opts.rename)
    await ahead.prefetch_list(first.remote_root, opts.rule)


@dataclass(frozen=True)
class _Run:
    """How one ``Runner.run`` runs its jobs."""

    guard: bool
    keep_going: bool
    idle: float


@dataclass(frozen=True)
class _Refused:
    """A job whose plan was refused: the run stops before any pass."""

    error: UsageError


class _DiedIdle(Exception):
    """A kept connection was found dead by its job's first pass."""


@dataclass
class _Ready:
    """A job connected and planned."""

    conduit: Conduit
    #: a kept connection not used yet: lost on the first pass, the job runs again
    may_retry: bool
    passes: list[PassRun]
    #: the host scans the run's passes share (a fan-out over one local root), if any
    shared: HostScans | None = None
    #: the host walk started with the job (``Job.first_pass``), for its first pass
    walk: planning.Walk | None = None


def _walks_ahead(jobs: Sequence[Job], warm: WarmState) -> list[planning.Walk | None]:
    """The host walk of each job's known first pass, started now. None for a root that
    the first passes of several jobs read: a fan-out's passes share one walk per root
    (``HostScans``) instead."""
    firsts = [j.first_pass for j in jobs]
    roots = Counter(p.local for p in firsts if p is not None)
    return [planning.start_walk(p.local, p.opts.rule, warm.trees)
            if p is not None and roots[p.local] == 1 else None
            for p in firsts]


def _share_host_scans(ready: list[_Ready]) -> None:
    """Passes of different jobs run at once: where two read the same local root, every
    pass of the run shares one ``HostScans`` (one walk, hash and read per file)."""
    roots = Counter(local for r in ready for local in {p.local for p in r.passes})
    if all(n == 1 for n in roots.values()):
        return
    shared = HostScans(roots)
    for r in ready:
        r.shared = shared


__all__ = ["Deadline", "EndpointConduits", "Job", "JobOutcome", "PassRun", "Plan", "Runner",
           "WarmState"]
