"""One pass over one pair: scan both sides, reconcile, then transition.

``run_pass`` builds the pass's frozen inputs once and runs the steps in order, each
reading those inputs and returning what it found: the host's recovery
(``plan.recover_host``), the seal check (``seal.check``: a pass on the sealed listings
ends here), the scan, the remote versions, the fetch and the plan (``filesync.sync.plan``),
the transition (``filesync.sync.transition``), retention, and the seal a clean pass
leaves (``seal.seal_for``). What each returns is folded into the ``Report``. The guards
(``filesync.core.guards``) refuse the whole run before anything changes. The transition
re-checks every target against the scan before touching it: the remote helper refuses to
replace or delete a file whose size or mtime moved, and the host apply does the same
through the journal. Whatever was not confirmed is not recorded, so the next run picks
it up again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from filesync.core import deferred
from filesync.core.exclude import ExcludeRule
from filesync.core.guards import check_deletions, check_roots
from filesync.core.model import Skipped
from filesync.core.reconcile import Action
from filesync.endpoint.contract import Endpoint
from filesync.endpoint.renamed import RenamedEndpoint
from filesync.errors import FilesyncError
from filesync.host.retention import Pruned, prune_runs, run_of
from filesync.host.shared_scan import HostScans
from filesync.host.state import ConflictRecord, open_pair
from filesync.sync import plan as planning
from filesync.sync import seal as sealing
from filesync.sync.changes import Change, ChangeAction, CountsChanges
from filesync.sync.inputs import Options, PassInputs
from filesync.sync.staging import StagingSink
from filesync.sync.warm import WarmState
from filesync.transport.base import Conduit

if TYPE_CHECKING:
    from filesync.sync.transition import Transitioned


@dataclass
class Report(CountsChanges):
    """What a pass did: ``changes`` names each file done (``filesync.sync.changes``), the
    counters (``uploaded``, ``downloaded``, ``deleted_local``, ``deleted_remote``) are
    counted from them, ``conflicts`` and ``skipped`` say why others were not.

    A dry run (and ``status``) changes nothing: ``changes`` stays empty and ``plan``
    carries what would be done, with ``open_conflicts``. ``docs/json.md`` documents
    ``to_json``'s fields.
    """

    conflicts: list[dict[str, str]] = field(default_factory=list)
    excluded: int = 0
    skipped: list[Skipped] = field(default_factory=list)
    bytes_sent: int = 0
    bytes_received: int = 0
    seconds: float = 0.0
    plan: list[Action] = field(default_factory=list)
    open_conflicts: list[ConflictRecord] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    #: run dirs of ``conflicts/`` and ``undo/`` dropped by retention this pass
    pruned: list[Pruned] = field(default_factory=list)
    #: one per file confirmed done, sorted by path; empty for a dry run
    changes: list[Change] = field(default_factory=list)

    def to_json(self, plan: bool = False) -> dict[str, Any]:
        """The pass's JSON fields (``docs/json.md``); ``plan``: add the plan's fields."""
        out: dict[str, Any] = {
            "files": [{"path": c.path, "action": c.action.value, "bytes": c.bytes}
                      for c in self.changes],
            "uploaded": self.uploaded,
            "downloaded": self.downloaded,
            "deleted_local": self.deleted_local,
            "deleted_remote": self.deleted_remote,
            "conflicts": self.conflicts,
            "excluded": self.excluded,
            "skipped": [{"path": s.path, "reason": s.reason} for s in self.skipped],
            "bytes_sent": self.bytes_sent,
            "bytes_received": self.bytes_received,
            "seconds": round(self.seconds, 4),
            "pruned": [{"path": str(p.path), "bytes": p.bytes} for p in self.pruned],
        }
        if plan:
            out["plan"] = [plan_row(a) for a in self.plan]
            out["open_conflicts"] = [c.path for c in self.open_conflicts]
        return out

    def fold(self, done: Transitioned) -> None:
        """Add what a transition did."""
        self.conflicts += done.conflicts
        self.skipped += done.skipped
        self.errors += done.errors
        self.changes += done.changes


async def run_pass(
    conduit: Conduit,
    local_root: Path,
    remote_path: str,
    opts: Options,
    plan_filter: Callable[[list[Action]], list[Action]] | None = None,
    guard: Callable[[Endpoint, Path, str], Awaitable[None]] | None = None,
    *,
    warm: WarmState | None = None,
    host_scans: HostScans | None = None,
    walk: planning.Walk | None = None,
) -> Report:
    """Run one pass; see ``filesync.sync.transition`` for how the plan is carried out.

    ``guard`` runs with the conduit's endpoint, the local root and the resolved remote
    root while the state opens and both sides list (so of the endpoint it may ask only
    ``any_exists``, which waits behind the pending listing); it is awaited before anything
    is fetched, recovered or applied, so raising there ends the pass with nothing changed
    (the self-sync check).
    ``warm``: the owner's warm state the pass uses and adds to (``filesync.sync.warm``);
    None runs it cold: the endpoint it starts on the conduit is ended when it returns,
    and nothing is kept. ``host_scans``: the walks and reads shared with the other passes
    of a fan-out (``filesync.host.shared_scan``). ``walk``: the host walk its caller
    started ahead (``planning.start_walk``; the runner's, with the job), taken when it is
    the walk this pass would start and shares none; else the pass starts its own before
    the helper. Either way the pass has joined every walk it took when it returns."""
    owner = warm if warm is not None else WarmState(keep_state=False)
    # The host walks while the helper starts (on a fresh conduit: while ssh still logs in).
    # (A fan-out's passes share one walk instead: ``HostScans``, taken by ``scan``.)
    if host_scans is not None:
        walk = None
    elif walk is None or not walk.fits(local_root, opts.rule, owner.trees):
        walk = planning.start_walk(local_root, opts.rule, owner.trees)
    try:
        return await _run(conduit, local_root, remote_path, opts, plan_filter, guard, owner,
                          host_scans, walk)
    finally:
        try:
            if walk is not None:
                await walk.join()  # a pass that failed before its scan left it walking
        finally:
            if warm is None:
                await owner.close()


async def _run(
    conduit: Conduit,
    local_root: Path,
    remote_path: str,
    opts: Options,
    plan_filter: Callable[[list[Action]], list[Action]] | None,
    guard: Callable[[Endpoint, Path, str], Awaitable[None]] | None,
    warm: WarmState,
    host_scans: HostScans | None,
    walk: planning.Walk | None,
) -> Report:
    started = time.monotonic()
    planning.require_local_source(opts.direction, local_root)
    sent0, recv0 = conduit.bytes_sent, conduit.bytes_received
    # The first listing rides behind the helper's source: no round trip is waited for.
    endpoint = remote = await warm.endpoints.endpoint_for(
        conduit, opts.log, first_listing(remote_path, opts), warm.watching, opts.idle_timeout)
    if opts.rename is not None:
        endpoint = RenamedEndpoint(endpoint, opts.rename)
    ok = False
    report = Report()
    try:
        remote_root = endpoint.resolve_root(remote_path)
        # The helper walks while the state is opened and the host is walked.
        await endpoint.prefetch_list(remote_root, opts.rule)
        # The guard's round trip runs while the state opens and both sides list.
        checking = (asyncio.ensure_future(guard(remote, local_root, remote_root))
                    if guard is not None else None)
        try:
            state = await open_pair(
                opts.state_dir, str(local_root), conduit.identity, remote_root,
                lock_timeout=opts.lock_timeout, lock_option=opts.lock_option,
                pool=warm.states, log=opts.log, umask=opts.umask,
            )
            try:
                run_id = f"{time.time_ns():020d}-{os.getpid()}"
                inputs = PassInputs(opts, endpoint, state, local_root, remote_root, run_id,
                                    time.time_ns(), StagingSink(state.staging / run_id, opts.umask),
                                    warm.memo(str(local_root), remote_root), warm.trees,
                                    host_scans)
                try:
                    await _pass(inputs, report, plan_filter, walk, checking)
                    ok = True
                finally:
                    shutil.rmtree(inputs.sink.dir, ignore_errors=True)
                    state.drop_staging_if_empty()
            finally:
                state.close()
        finally:
            if checking is not None and not checking.done():
                checking.cancel()  # its own ``finally`` removes what it wrote
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await checking
    finally:
        if not ok:
            # A pass that failed may have left the stream mid-request: never reuse it.
            await warm.endpoints.drop_endpoint(conduit, polite=False)
    report.bytes_sent = conduit.bytes_sent - sent0
    report.bytes_received = conduit.bytes_received - recv0
    report.seconds = time.monotonic() - started
    if report.errors:
        raise TransferFailed(report)
    return report


async def _pass(
    inputs: PassInputs, report: Report,
    plan_filter: Callable[[list[Action]], list[Action]] | None,
    walk: planning.Walk | None,
    checking: Awaitable[None] | None = None,
) -> None:
    if checking is not None and inputs.state.journal_path.exists():
        await checking  # the recovery in ``scan`` changes the host tree
    walk = await planning.recover_host(inputs, walk)
    try:
        await _after_recovery(inputs, report, plan_filter, walk, checking)
    finally:
        if walk is not None:
            await walk.join()  # (a new one, if the recovery started it) a failure left walking


async def _after_recovery(
    inputs: PassInputs, report: Report,
    plan_filter: Callable[[list[Action]], list[Action]] | None,
    walk: planning.Walk | None,
    checking: Awaitable[None] | None,
) -> None:
    opts = inputs.opts
    sealed = await sealing.check(inputs, walk)
    if isinstance(sealed, sealing.Sealed):
        if checking is not None:
            await checking
        report.excluded = sealed.excluded
        report.open_conflicts = list(inputs.state.conflicts().values())
        return
    scans = await planning.scan(inputs, walk, sealed, sealing.host_digest(inputs))
    if checking is not None:
        await checking  # before anything is fetched or applied
    report.excluded = scans.excluded
    planning.require_remote_source(inputs, scans)
    check_roots(opts.direction, len(scans.ancestors), len(scans.local.listing.files()),
                len(scans.remote.files()), str(inputs.local_root), inputs.remote_root,
                opts.force, local_excluded=scans.local.listing.excluded,
                remote_excluded=scans.remote.excluded)
    versions = planning.remote_versions(inputs, scans)
    await planning.fetch(inputs, versions.fetch)
    planned = planning.plan(inputs, scans, versions)
    if plan_filter is not None:
        planned = replace(planned, actions=plan_filter(list(planned.actions)))
    report.skipped += planned.skipped
    check_deletions(planned.actions, len(scans.ancestors), opts.force)
    report.plan = list(planned.actions)
    # The helper's walk for the seal, asked once the remote is changed: it runs while
    # the host side is recorded, not after it.
    asked: asyncio.Future[str] | None = None

    async def ask_seal() -> None:
        nonlocal asked
        asked = asyncio.ensure_future(
            inputs.endpoint.seal_digest(inputs.remote_root, opts.rule))
        await asyncio.sleep(0)  # its request goes out before the host-side steps

    ahead = not opts.dry_run and sealing.asks_remote(inputs, scans, planned,
                                                      whole_plan=plan_filter is None)
    try:
        if not opts.dry_run:
            # Loaded here: a sealed no-op returns above, and never loads the transition
            # (host writes, journal apply, conflict saving).
            transitioned: Transitioned = await deferred.load(
                "filesync.sync.transition").transition(inputs, scans, planned,
                                                       ask_seal if ahead else None)
            report.fold(transitioned)
        report.open_conflicts = list(inputs.state.conflicts().values())
        if not opts.dry_run:
            report.pruned = _retain(inputs, report.open_conflicts)
        if scans.carry is not None:
            scans.carry.keep()
        clean = not (report.skipped or report.errors or report.open_conflicts)
        seal = await sealing.seal_for(inputs, scans, planned, clean, asked=asked)
        if asked is not None:
            await asked  # its reply is read even when unused: the stream stays in step
    except BaseException:
        if asked is not None and not asked.done():
            asked.cancel()  # the pass failed: its endpoint is dropped (``_run``)
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asked
        raise
    if seal is not None:
        inputs.state.put_seal(seal)  # the last write of the pass: every write drops it


def _retain(inputs: PassInputs, open_conflicts: list[ConflictRecord]) -> list[Pruned]:
    """Bound ``conflicts/`` and ``undo/`` (``filesync.host.retention``) after a pass that
    added a run to either: only a new run can take them over their bounds."""
    state, opts = inputs.state, inputs.opts
    dirs = (state.conflicts_dir, state.undo_dir)
    if not any((d / inputs.run_id).exists() for d in dirs):
        return []
    opened = {run_of(c.saved_to, state.conflicts_dir) for c in open_conflicts}
    pruned = prune_runs(state.conflicts_dir, opts.keep_runs, opts.keep_bytes,
                        {r for r in opened if r is not None})
    pruned += prune_runs(state.undo_dir, opts.keep_runs, opts.keep_bytes)
    if pruned and opts.log is not None:
        opts.log(f"retention: dropped {len(pruned)} old runs of saved copies "
                 f"({sum(p.bytes for p in pruned)} bytes; kept the last {opts.keep_runs} "
                 f"runs, at most {opts.keep_bytes} bytes each, and every open conflict)")
    return pruned


def first_listing(remote_path: str, opts: Options) -> tuple[str, ExcludeRule]:
    """What a pass has its helper list first: its remote path as written, under the rule
    the remote side is listed by (the rename's, where the pass renames)."""
    return remote_path, opts.rule if opts.rename is None else opts.rename.rule


def plan_row(a: Action) -> dict[str, str]:
    """A planned step as JSON: a push conflict reads ``conflict -> upload``."""
    action = a.kind.value if a.then is None else f"{a.kind.value} -> {a.then.value}"
    return {"path": a.path, "action": action}


class TransferFailed(FilesyncError):
    """Some transfers failed; the confirmed ones are recorded, the rest retried next run."""

    def __init__(self, report: Report) -> None:
        first = report.errors[0]
        more = f" (and {len(report.errors) - 1} more)" if len(report.errors) > 1 else ""
        super().__init__(f"{first}{more}; fix the cause and rerun, nothing was half-applied")
        self.report = report


__all__ = ["Change", "ChangeAction", "Options", "Report", "TransferFailed", "first_listing",
           "plan_row", "run_pass"]
