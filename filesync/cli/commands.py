"""The subcommands behind the CLI: typed request in, conduits from the pool, passes run,
results printed. Nothing here sees the parsed arguments (``filesync.cli.main`` turns them
into a ``Request`` first)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from filesync.cli.config import load_config
from filesync.cli.jsonout import document, pair_json
from filesync.cli.settings import Request, local_root
from filesync.core.reconcile import Action, Direction, Kind
from filesync.endpoint.connect import drop_session
from filesync.errors import ConnectionLost, FilesyncError, UsageError
from filesync.host.shared_scan import HostScans
from filesync.mapping import UPLOAD_ONLY
from filesync.sync.changes import ChangeAction
from filesync.sync.engine import Options, Report, plan_row, run_pass
from filesync.sync.progress import tty_progress
from filesync.transport.base import Conduit
from filesync.transport.pool import Conduits
from filesync.transport.target import Target, via_error


class SessionConduits(Conduits):
    """The CLI's pool: a conduit per run; releasing it ends the helper session on it."""

    async def end(self, conduit: Conduit, healthy: bool) -> None:
        await drop_session(conduit, polite=healthy)


_DIRECTIONS = {"push": Direction.PUSH, "pull": Direction.PULL}


def _options(req: Request, direction: Direction, local: Path,
             extra: Sequence[tuple[str, Sequence[str]]] = ()) -> Options:
    """Engine options of one pass: the request's settings, its log and progress display."""
    out = req.output
    return req.settings.options(direction, local, extra=extra, log=out.log(),
                                progress=tty_progress(not (out.json or out.quiet)))


@dataclass
class Job:
    """Passes that share one connection: one remote, one or more mappings."""

    target: Target
    passes: list[tuple[str, Path, str, Options]]  # (label, local root, remote path, opts)


async def run_command(req: Request, conduits: Conduits | None = None) -> int:
    """Run push/pull/sync/status/resolve/undo, getting conduits from ``conduits``."""
    pool = conduits or SessionConduits()
    if req.config is not None:
        return await _run_jobs(req, _config_jobs(req), pool)
    assert req.local is not None and req.targets  # Request's contract without --config
    if req.command == "undo":
        return await _undo(req, req.local, req.targets[0], pool)
    direction = _DIRECTIONS.get(req.command, Direction.SYNC)
    jobs = [Job(t, [(t.label(), req.local, t.path, _options(req, direction, req.local))])
            for t in req.targets]
    return await _run_jobs(req, jobs, pool)


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
    assert req.config is not None
    if req.command not in ("push", "pull", "sync", "status"):
        raise UsageError(f"--config works with push, pull, sync and status, not {req.command}")
    config = load_config(req.config, via=req.via)
    direction = _DIRECTIONS.get(req.command, Direction.SYNC)
    jobs = []
    for remote in config.remotes:
        passes = []
        for number, spec in enumerate(config.mappings, 1):
            mine = direction
            if spec.mapping.mode == UPLOAD_ONLY:
                if direction is Direction.PULL:
                    continue  # upload-only: never written back
                mine = Direction.PUSH
            local = local_root(spec.mapping.local)
            target = config.target(remote, spec)
            where = f"{req.config} (mapping {number}"
            opts = _options(req, mine, local, [
                (where + ")", spec.exclude),
                (where + ", a nested mapping's root)", config.nested_excludes(spec))])
            passes.append((target.label(), local, target.path, opts))
        jobs.append(Job(config.target(remote, config.mappings[0]), passes))
    return jobs


async def _run_jobs(req: Request, jobs: list[Job], pool: Conduits) -> int:
    plan_filter = _resolve_filter(req) if req.command == "resolve" else None
    copts, timeout = req.connect, req.settings.timeout
    jobs = _share_host_scans(jobs)

    async def one(job: Job) -> list[PairResult]:
        out: list[Report | FilesyncError] = []
        try:
            conduit, reused = await pool.acquire(job.target, copts)
        except FilesyncError as exc:
            return [PairResult(label, local, path, via_error(job.target, exc))
                    for label, local, path, _ in job.passes]
        try:
            for _label, local, path, opts in job.passes:
                try:
                    try:
                        run = run_pass(conduit, local, path, opts, plan_filter)
                        out.append(await _deadline(run, timeout))
                    except ConnectionLost:
                        if not reused:
                            raise
                        # A kept connection died while idle (a server restart, an evicted NAT
                        # entry); the failed pass changed nothing, so it runs on a new one.
                        await pool.release(conduit, False)
                        conduit, reused = await pool.acquire(job.target, copts)
                        run = run_pass(conduit, local, path, opts, plan_filter)
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
                for (label, local, path, _), r in zip(job.passes, out, strict=True)]

    started = time.monotonic()
    results = [r for rs in await asyncio.gather(*(one(j) for j in jobs)) for r in rs]
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


def _share_host_scans(jobs: list[Job]) -> list[Job]:
    """Passes of different jobs run at once: where two read the same local root, every
    pass of the command shares one ``HostScans`` (one walk, hash and read per file)."""
    roots = Counter(local for job in jobs for local in {p[1] for p in job.passes})
    if all(n == 1 for n in roots.values()):
        return jobs
    shared = HostScans(roots)
    return [Job(j.target, [(label, local, path, replace(opts, host_scans=shared))
                           for label, local, path, opts in j.passes]) for j in jobs]


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
        return [Action(path, Kind.UPLOAD if keep == "local" else Kind.DOWNLOAD)]

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
