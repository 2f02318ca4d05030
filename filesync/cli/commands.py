"""The subcommands behind the CLI: typed request in, conduits from the pool, passes run,
results printed. Nothing here sees the parsed arguments (``filesync.cli.main`` turns them
into a ``Request`` first).

Guarantees: the passes of ``--config`` and of a LOCAL that is not a directory come from
the session's planner (``filesync.session.passes.plan_passes``), the library's one code
for mappings (single files, upload-only, nested roots, state dirs); a plan it refuses
(``BadMapping``, ``PatternError``) stops the whole command before any pass on any remote.
A LOCAL directory is one pass, its first listing sent right behind the remote helper."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from filesync.cli.config import load_config
from filesync.cli.jsonout import document, pair_json
from filesync.cli.settings import Request
from filesync.core.exclude import ExcludeRule
from filesync.core.reconcile import Action, Direction, Kind, settle
from filesync.endpoint.connect import drop_session, session_for
from filesync.endpoint.contract import Endpoint
from filesync.errors import ConnectionLost, FilesyncError, UsageError
from filesync.host.shared_scan import HostScans
from filesync.mapping import Mapping
from filesync.session.passes import Call, Rules, direction_of, join_remote, plan_passes
from filesync.session.selfsync import refuse_self_sync
from filesync.sync.changes import ChangeAction
from filesync.sync.engine import Options, Report, plan_row, run_pass
from filesync.sync.progress import tty_progress
from filesync.transport.base import Conduit
from filesync.transport.pool import Conduits
from filesync.transport.target import Target, parse_remote, via_error


class SessionConduits(Conduits):
    """The CLI's pool: a conduit per run; releasing it ends the helper session on it."""

    async def end(self, conduit: Conduit, healthy: bool) -> None:
        await drop_session(conduit, polite=healthy)


_DIRECTIONS = {"push": Direction.PUSH, "pull": Direction.PULL}
#: The commands whose passes can come from the session's planner (any mapping, a file's
#: included); resolve and undo work on a directory pair.
_PLANNED = ("push", "pull", "sync", "status")


def _options(req: Request, direction: Direction, local: Path) -> Options:
    """Engine options of a directory pass: the request's settings, log and progress."""
    out = req.output
    return req.settings.options(direction, local, log=out.log(),
                                progress=tty_progress(not (out.json or out.quiet)))


PlanFilter = Callable[[list[Action]], list[Action]]


@dataclass(frozen=True)
class Pass:
    """One pass as ``run_pass`` takes it."""

    local: Path
    remote: str
    opts: Options
    plan_filter: PlanFilter | None = None


@dataclass
class Job:
    """Passes that share one connection: one remote, one or more mappings.

    ``rows`` are the passes as reported, (label, local, remote path), known before any
    connection; ``plan`` turns the connection into those passes, one per row in order
    (``remote_plan``: it talks to the remote to do so, so a kept connection that died
    idle shows up there, not in the first pass).
    """

    target: Target
    rows: list[tuple[str, Path, str]]
    plan: Callable[[Conduit], Awaitable[list[Pass]]]
    remote_plan: bool = False


async def run_command(req: Request, conduits: Conduits | None = None) -> int:
    """Run push/pull/sync/status/resolve/undo, getting conduits from ``conduits``."""
    pool = conduits or SessionConduits()
    if req.config is not None:
        return await _run_jobs(req, _config_jobs(req), pool)
    assert req.local is not None and req.targets  # Request's contract without --config
    if req.command == "undo":
        return await _undo(req, req.local, req.targets[0], pool)
    local = req.local
    if req.command in _PLANNED and not local.is_dir():
        # A single file (or a LOCAL not there yet, which the remote side then decides):
        # the session's planner, as for a mapping of the library or of --config.
        return await _run_jobs(req, [_planned_job(req, t, [Mapping(local, t.path)], "")
                                     for t in req.targets], pool)
    direction = _DIRECTIONS.get(req.command, Direction.SYNC)
    plan_filter = _resolve_filter(req) if req.command == "resolve" else None
    jobs = [Job(t, [(t.label(), local, t.path)], _fixed(
        [Pass(local, t.path, _options(req, direction, local), plan_filter)]))
        for t in req.targets]
    return await _run_jobs(req, jobs, pool)


Ready = tuple[Conduit, bool, list[Pass]]  # a job's conduit, whether kept idle, its passes


@dataclass(frozen=True)
class Refused:
    """A job whose plan was refused: the command stops before any pass."""

    error: UsageError


def _fixed(passes: list[Pass]) -> Callable[[Conduit], Awaitable[list[Pass]]]:
    async def plan(_conduit: Conduit) -> list[Pass]:
        return passes

    return plan


async def _undo(req: Request, local: Path, target: Target, pool: Conduits) -> int:
    from filesync.sync.undo import undo_last

    opts = _options(req, Direction.PULL, local)
    try:
        conduit, _ = await pool.acquire(target, req.connect)
        healthy = False
        try:
            restored = await undo_last(conduit, local, target.path, opts)
            healthy = True
        finally:
            await pool.release(conduit, healthy)
    except FilesyncError as exc:
        raise via_error(target, exc) from exc.__cause__
    _print_undo(req, restored)
    return 0


def _config_jobs(req: Request) -> list[Job]:
    """One job per remote of the file, its passes planned by the session's planner."""
    assert req.config is not None
    if req.command not in _PLANNED:
        raise UsageError(f"--config works with push, pull, sync and status, not {req.command}")
    config = load_config(req.config, via=req.via)
    mappings = [Mapping(s.mapping.local, s.mapping.remote, s.mapping.mode, exclude=s.exclude)
                for s in config.mappings]
    labels = [f"{req.config} (mapping {n})" for n in range(1, len(mappings) + 1)]
    return [_planned_job(req, config.target(remote, config.mappings[0]), mappings,
                         parse_remote(remote, config.via).path, labels)
            for remote in config.remotes]


def _planned_job(req: Request, target: Target, mappings: list[Mapping], base: str,
                 labels: list[str] | None = None) -> Job:
    """The job of ``mappings`` on ``target``: its passes come from the session's planner
    (``filesync.session.passes.plan_passes``), run once the remote's connection is up, so
    single-file and upload-only mappings, nested ownership and state dirs are the
    library's, to the letter."""
    call = Call(req.command)
    settings, log = req.settings, req.output.log()
    rules = Rules(settings.exclude, settings.default_excludes)
    for i, m in enumerate(mappings):
        # The patterns given here are checked before any connection, so a bad one is a
        # usage error even when no remote answers; the planner builds the real rules.
        ExcludeRule.build(settings.exclude, default_excludes=False,
                          more=[(labels[i] if labels else "--exclude", m.exclude)])
    progress = tty_progress(not (req.output.json or req.output.quiet))

    async def plan(conduit: Conduit) -> list[Pass]:
        endpoint = await session_for(conduit, log, watch=settings.watch,
                                     idle=settings.idle_timeout)
        specs = await plan_passes(call, mappings, endpoint, base, rules,
                                  settings.state_path(), labels=labels)
        return [Pass(s.local_root, s.remote_path,
                     settings.pass_options(s.direction, s.rule, s.state_dir, log=log,
                                           progress=progress, rename=s.rename),
                     s.plan_filter())
                for s in specs]

    rows = []
    for m in mappings:
        if direction_of(call, m) is not None:
            where = replace(target, path=join_remote(base, m.remote))
            rows.append((where.label(), _shown_local(m.local), where.path))
    return Job(target, rows, plan, remote_plan=True)


def _shown_local(text: str) -> Path:
    """A mapping's local path as reported: resolved as the planner resolves it."""
    path = Path(os.path.abspath(text))
    return path.resolve() if path.is_dir() else path.parent.resolve() / path.name


async def _run_jobs(req: Request, jobs: list[Job], pool: Conduits) -> int:
    """Connect and plan every job (concurrently), then run them (concurrently). A job
    whose remote cannot be reached fails alone; a plan refused as a usage error (a bad
    mapping or pattern) refuses the whole command before any pass runs."""
    copts, timeout = req.connect, req.settings.timeout

    async def connect(job: Job) -> Ready | FilesyncError | Refused:
        try:
            conduit, reused = await pool.acquire(job.target, copts)
        except FilesyncError as exc:
            return exc
        try:
            try:
                passes = await job.plan(conduit)
            except ConnectionLost:
                if not (reused and job.remote_plan):
                    raise
                # A kept connection died while idle: plan again on a new one.
                await pool.release(conduit, False)
                conduit, reused = await pool.acquire(job.target, copts)
                passes = await job.plan(conduit)
        except UsageError as exc:
            await pool.release(conduit, True)
            return Refused(exc)
        except FilesyncError as exc:
            await pool.release(conduit, False)
            return exc
        except BaseException:
            await pool.release(conduit, False)
            raise
        assert len(passes) == len(job.rows)
        return conduit, reused and not job.remote_plan, passes

    async def one(job: Job, ready: Ready | FilesyncError) -> list[PairResult]:
        if isinstance(ready, FilesyncError):
            return [PairResult(label, local, path, via_error(job.target, ready))
                    for label, local, path in job.rows]
        conduit, reused, passes = ready
        guard = None if req.plan_only else _self_sync_guard(req)
        out: list[Report | FilesyncError] = []
        try:
            for p in passes:
                try:
                    try:
                        run = run_pass(conduit, p.local, p.remote, p.opts, p.plan_filter, guard)
                        out.append(await _deadline(run, timeout))
                    except ConnectionLost:
                        if not reused:
                            raise
                        # A kept connection died while idle (a server restart, an evicted NAT
                        # entry); the failed pass changed nothing, so it runs on a new one.
                        await pool.release(conduit, False)
                        conduit, reused = await pool.acquire(job.target, copts)
                        run = run_pass(conduit, p.local, p.remote, p.opts, p.plan_filter, guard)
                        out.append(await _deadline(run, timeout))
                except FilesyncError as exc:
                    out.append(exc)
                reused = False
        except BaseException:
            await pool.release(conduit, False)
            raise
        await pool.release(conduit, not any(isinstance(r, ConnectionLost) for r in out))
        return [PairResult(label, local, path,
                           via_error(job.target, r) if isinstance(r, FilesyncError) else r)
                for (label, local, path), r in zip(job.rows, out, strict=True)]

    started = time.monotonic()
    readies = await asyncio.gather(*(connect(j) for j in jobs))
    refused = [r.error for r in readies if isinstance(r, Refused)]
    if refused:
        for r in readies:
            if isinstance(r, tuple):
                await pool.release(r[0], True)
        raise refused[0]
    readies = _share_host_scans(readies)
    runs = (one(j, r) for j, r in zip(jobs, readies, strict=True) if not isinstance(r, Refused))
    results = [r for rs in await asyncio.gather(*runs) for r in rs]
    return _print_results(req, results, time.monotonic() - started)


@dataclass
class PairResult:
    """One pair's outcome: its report, or the error that stopped it."""

    label: str
    local: Path
    remote: str
    result: Report | FilesyncError

    def to_json(self, plan: bool) -> dict[str, Any]:
        r = self.result
        if isinstance(r, Report):
            return pair_json(self.label, str(self.local), self.remote, r.to_json(plan))
        # A pass that failed part way (TransferFailed) reports what it did confirm.
        report = getattr(r, "report", None)
        fields = (report if isinstance(report, Report) else Report()).to_json(plan)
        return pair_json(self.label, str(self.local), self.remote, fields,
                         r.message, r.exit_code)


def _self_sync_guard(req: Request) -> Callable[[Endpoint, Path, str], Awaitable[None]]:
    """The self-sync check (``filesync.session.selfsync``) as a job's passes run it: once
    per pair of roots and remote session, while both sides walk, before anything is
    applied."""
    checked: dict[tuple[Path, str], Endpoint] = {}
    log = req.output.log()

    async def guard(endpoint: Endpoint, local_root: Path, remote_root: str) -> None:
        if checked.get((local_root, remote_root)) is not endpoint:
            await refuse_self_sync(endpoint, local_root, remote_root, log)
            checked[local_root, remote_root] = endpoint

    return guard


def _share_host_scans(
    readies: list[Ready | FilesyncError | Refused],
) -> list[Ready | FilesyncError | Refused]:
    """Planned passes of different jobs run at once: where two read the same local root,
    every pass of the command shares one ``HostScans`` (one walk, hash and read per file)."""
    planned = [r for r in readies if isinstance(r, tuple)]
    roots = Counter(local for _c, _r, passes in planned for local in {p.local for p in passes})
    if all(n == 1 for n in roots.values()):
        return readies
    shared = HostScans(roots)
    return [(r[0], r[1], [replace(p, opts=replace(p.opts, host_scans=shared)) for p in r[2]])
            if isinstance(r, tuple) else r for r in readies]


async def _deadline(run: Awaitable[Report], seconds: float) -> Report:
    """Bound a pass by ``--timeout``; cancelling only stops I/O, the journal stays whole."""
    if seconds <= 0:
        return await run
    try:
        return await asyncio.wait_for(run, seconds)
    except TimeoutError:
        raise FilesyncError(
            f"the run took longer than --timeout {seconds:g} s; rerun to continue "
            "(nothing was half-applied) or raise the limit"
        ) from None


def _print_results(req: Request, results: list[PairResult], seconds: float) -> int:
    """Print every pair's outcome (one JSON document for all with ``--json``); returns the
    exit code: the worst of the pairs'."""
    errors = [(p, p.result) for p in results if isinstance(p.result, FilesyncError)]
    many = len(results) > 1
    for p, exc in errors:
        print(f"filesync: error: {p.label + ': ' if many else ''}{exc.message}",
              file=sys.stderr)
    code = max((exc.exit_code for _, exc in errors), default=0)
    if req.output.json:
        error = None
        if errors:
            p, first = errors[0]
            more = f" (and {len(errors) - 1} more failed)" if len(errors) > 1 else ""
            error = f"{p.label + ': ' if many else ''}{first.message}{more}"
        pairs = [p.to_json(req.plan_only) for p in results]
        print(json.dumps(document(pairs, seconds, req.plan_only, error,
                                  code if errors else None)))
        return code
    for p in results:
        if isinstance(p.result, Report):
            _print_report(req, p.result, f"[{p.label}] " if many else "")
    return code


def _resolve_filter(req: Request) -> Any:
    """Turn the plan into the one step that settles PATH in favour of --keep."""
    path, keep = req.path, req.keep

    def only(plan: list[Action]) -> list[Action]:
        match = [a for a in plan if a.path == path]
        if not match or match[0].kind is not Kind.CONFLICT:
            raise FilesyncError(
                f"{path!r} is not in conflict; run 'filesync status LOCAL REMOTE' to list conflicts"
            )
        return settle(match[0], keep_local=keep == "local")

    return only


#: The ``-v`` item marks, like ``rsync -i``: ``>`` host to remote, ``<`` remote to host.
ITEM_MARKS = {
    ChangeAction.UPLOAD: ">f",
    ChangeAction.DOWNLOAD: "<f",
    ChangeAction.DELETE_REMOTE: ">*deleting",
    ChangeAction.DELETE_LOCAL: "<*deleting",
}


def _print_report(req: Request, report: Report, prefix: str = "") -> None:
    """The human report of one pass, each line after ``prefix`` (the pair, when there are
    several); ``-v`` adds a line per file (README, docs/json.md)."""
    if req.plan_only:
        for a in report.plan:
            print(f"{prefix}{plan_row(a)['action']:<28} {a.path}")
        for c in report.open_conflicts:
            print(f"{prefix}{'open conflict':<28} {c.path}  (remote version: {c.saved_to})")
        if not report.plan and not report.open_conflicts:
            print(f"{prefix}in sync")
        return
    if req.output.quiet:
        return
    if req.output.verbose:
        # Every conflict has its saved copy in ``conflicts``, a push conflict's included.
        for change in report.changes:
            if change.action is not ChangeAction.CONFLICT:
                print(f"{prefix}{ITEM_MARKS[change.action]} {_shown(change.path)}")
        for conflict in report.conflicts:
            print(f"{prefix}!conflict {_shown(conflict['path'])} -> "
                  f"{_shown(conflict['saved_to'])}")
        for s in report.skipped:
            print(f"{prefix}skipped: {_shown(s.path)}: {_shown(s.reason)}")
    else:
        for conflict in report.conflicts:
            print(f"{prefix}conflict: {conflict['path']} (remote version saved to "
                  f"{conflict['saved_to']})")
    print(
        f"{prefix}{req.command}: {report.uploaded} uploaded, {report.downloaded} downloaded, "
        f"{report.deleted_remote} deleted remote, {report.deleted_local} deleted local, "
        f"{len(report.conflicts)} conflicts, {len(report.skipped)} skipped, "
        f"{report.excluded} excluded ({report.seconds:.2f} s)"
    )


def _shown(text: str) -> str:
    """A name for the terminal: skipped names come from the remote and may hold control
    characters (terminal escapes, newlines) or undecodable bytes; those are escaped."""
    return text if text.isprintable() else ascii(text)[1:-1]


def _print_undo(req: Request, restored: list[str]) -> None:
    if req.output.json:
        print(json.dumps({"restored": restored}))
    elif not req.output.quiet:
        for path in restored:
            print(f"restored: {path}")
        print(f"undo: {len(restored)} files restored")
