"""The subcommands behind the CLI: typed request in, conduits from the pool, passes run,
results printed. Nothing here sees the parsed arguments (``filesync.cli.main`` turns them
into a ``Request`` first).

Guarantees: the passes of ``--config`` and of a LOCAL that is not a directory come from
the session's planner (``filesync.session.passes.plan_passes``), the library's one code
for mappings (single files, upload-only, nested roots, state dirs); a plan it refuses
(``BadMapping``, ``PatternError``) stops the whole command before any pass on any remote.
A LOCAL directory is one pass, its first listing sent right behind the remote helper."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from filesync.cli.config import load_config
from filesync.cli.jsonout import document, pair_json
from filesync.cli.settings import Request
from filesync.core.exclude import ExcludeRule
from filesync.core.reconcile import Action, Direction, Kind, settle
from filesync.errors import FilesyncError, UsageError
from filesync.mapping import Mapping
from filesync.session.passes import Call, Rules, direction_of, join_remote, plan_passes
from filesync.session.runner import (
    Deadline,
    EndpointConduits,
    Job,
    PassRun,
    Plan,
    PlanFilter,
    Runner,
)
from filesync.session.terms import (
    ChangeAction,
    Options,
    Progress,
    Report,
    plan_row,
    tty_progress,
)
from filesync.transport.base import Conduit
from filesync.transport.target import Target, parse_remote, via_error

_DIRECTIONS = {"push": Direction.PUSH, "pull": Direction.PULL}
#: The commands whose passes can come from the session's planner (any mapping, a file's
#: included); resolve and undo work on a directory pair.
_PLANNED = ("push", "pull", "sync", "status")


def _options(req: Request, direction: Direction, local: Path) -> Options:
    """Engine options of a directory pass: the request's settings, log and progress."""
    out = req.output
    return req.settings.options(direction, local, log=out.log(), progress=_progress(req),
                                warn=out.warn, env=req.env, umask=req.umask)


def _progress(req: Request) -> Progress | None:
    """A progress bar when the output is for a person at a terminal."""
    out = req.output
    return tty_progress(not (out.json or out.quiet) and out.sink.terminal())


@dataclass(frozen=True)
class Pairs:
    """A runner job and the pairs it runs as reported, (label, local, remote path), known
    before any connection: one per pass of the job, in order."""

    job: Job
    rows: list[tuple[str, Path, str]]


async def run_command(req: Request, pool: EndpointConduits) -> int:
    """Run push/pull/sync/status/resolve/undo through the runner, getting conduits from
    ``pool`` (warm state from its owner); prints the results, returns the exit code."""
    runner = Runner(pool, pool.warm, req.connect, log=req.output.log())
    if req.config is not None:
        return await _run(req, runner, _config_jobs(req))
    assert req.local is not None and req.targets  # Request's contract without --config
    if req.command == "undo":
        return await _undo(req, runner, req.local, req.targets[0])
    local = req.local
    if req.command in _PLANNED and not local.is_dir():
        # A single file (or a LOCAL not there yet, which the remote side then decides):
        # the session's planner, as for a mapping of the library or of --config.
        return await _run(req, runner, [_planned_job(req, t, [Mapping(local, t.path)], "")
                                        for t in req.targets])
    direction = _DIRECTIONS.get(req.command, Direction.SYNC)
    plan_filter = _resolve_filter(req) if req.command == "resolve" else None
    jobs = [_directory_job(t, local, _options(req, direction, local), plan_filter)
            for t in req.targets]
    return await _run(req, runner, jobs)


def _directory_job(target: Target, local: Path, opts: Options,
                   plan_filter: PlanFilter | None) -> Pairs:
    """The one pass of a directory pair, known before the connection: its listing is
    asked for in the same write as the helper's source, and its host walk starts with
    the job."""
    run = PassRun(local, target.path, opts, plan_filter)
    return Pairs(Job(target, _fixed([run]), run),
                 [(target.label(), local, target.path)])


def _fixed(passes: list[PassRun]) -> Plan:
    async def plan(_conduit: Conduit, _endpoint: object) -> list[PassRun]:
        return passes

    return plan


async def _undo(req: Request, runner: Runner, local: Path, target: Target) -> int:
    opts = _options(req, Direction.PULL, local)
    try:
        restored = await runner.undo(target, local, opts)
    except FilesyncError as exc:
        raise via_error(target, exc) from exc.__cause__
    _print_undo(req, restored)
    return 0


def _config_jobs(req: Request) -> list[Pairs]:
    """One job per remote of the file, its passes planned by the session's planner."""
    assert req.config is not None
    if req.command not in _PLANNED:
        raise UsageError(f"--config works with push, pull, sync and status, not {req.command}")
    config = load_config(req.config, via=req.via, env=req.env)
    mappings = [Mapping(s.mapping.local, s.mapping.remote, s.mapping.mode, exclude=s.exclude)
                for s in config.mappings]
    labels = [f"{req.config} (mapping {n})" for n in range(1, len(mappings) + 1)]
    return [_planned_job(req, config.target(remote, config.mappings[0]), mappings,
                         parse_remote(remote, config.via).path, labels)
            for remote in config.remotes]


def _planned_job(req: Request, target: Target, mappings: list[Mapping], base: str,
                 labels: list[str] | None = None) -> Pairs:
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
    progress = _progress(req)

    async def plan(_conduit: Conduit, endpoint: Any) -> list[PassRun]:
        specs = await plan_passes(call, mappings, endpoint, base, rules,
                                  settings.state_path(req.env), labels=labels)
        return [PassRun(s.local_root, s.remote_path,
                        settings.pass_options(s.direction, s.rule, s.state_dir, log=log,
                                              progress=progress, rename=s.rename,
                                              warn=req.output.warn, umask=req.umask),
                        s.plan_filter(), s.remote_root)
                for s in specs]

    rows = []
    for m in mappings:
        if direction_of(call, m) is not None:
            where = replace(target, path=join_remote(base, m.remote))
            rows.append((where.label(), _shown_local(m.local), where.path))
    return Pairs(Job(target, plan), rows)


def _shown_local(text: str) -> Path:
    """A mapping's local path as reported: resolved as the planner resolves it."""
    path = Path(os.path.abspath(text))
    return path.resolve() if path.is_dir() else path.parent.resolve() / path.name


async def _run(req: Request, runner: Runner, jobs: list[Pairs]) -> int:
    """Run every job (``filesync.session.runner``: connected and planned concurrently, a
    refused plan refusing the whole command, then run concurrently; a job whose remote
    cannot be reached fails alone), then print each pair's outcome."""
    timeout = req.settings.timeout
    deadline = Deadline(timeout, lambda: FilesyncError(
        f"the run took longer than --timeout {timeout:g} s; rerun to continue "
        "(nothing was half-applied) or raise the limit")) if timeout > 0 else None
    started = time.monotonic()
    outcomes = await runner.run([p.job for p in jobs], guard=not req.plan_only,
                                deadline=deadline, idle=req.settings.idle_timeout)
    results: list[PairResult] = []
    for pairs, outcome in zip(jobs, outcomes, strict=True):
        done = [r for _p, r in outcome.passes]
        if outcome.error is not None:
            done += [outcome.error] * (len(pairs.rows) - len(done))
        assert len(done) == len(pairs.rows)
        results += [PairResult(label, local, path, via_error(pairs.job.target, r)
                               if isinstance(r, FilesyncError) else r)
                    for (label, local, path), r in zip(pairs.rows, done, strict=True)]
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


def _print_results(req: Request, results: list[PairResult], seconds: float) -> int:
    """Print every pair's outcome (one JSON document for all with ``--json``); returns the
    exit code: the worst of the pairs'."""
    errors = [(p, p.result) for p in results if isinstance(p.result, FilesyncError)]
    many = len(results) > 1
    for p, exc in errors:
        req.output.error(f"filesync: error: {p.label + ': ' if many else ''}{exc.message}")
    code = max((exc.exit_code for _, exc in errors), default=0)
    if req.output.json:
        error = None
        if errors:
            p, first = errors[0]
            more = f" (and {len(errors) - 1} more failed)" if len(errors) > 1 else ""
            error = f"{p.label + ': ' if many else ''}{first.message}{more}"
        pairs = [p.to_json(req.plan_only) for p in results]
        req.output.print(json.dumps(document(pairs, seconds, req.plan_only, error,
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
    line = req.output.print
    if req.plan_only:
        for a in report.plan:
            line(f"{prefix}{plan_row(a)['action']:<28} {a.path}")
        for c in report.open_conflicts:
            line(f"{prefix}{'open conflict':<28} {c.path}  (remote version: {c.saved_to})")
        if not report.plan and not report.open_conflicts:
            line(f"{prefix}in sync")
        return
    if req.output.quiet:
        return
    if req.output.verbose:
        # Every conflict has its saved copy in ``conflicts``, a push conflict's included.
        for change in report.changes:
            if change.action is not ChangeAction.CONFLICT:
                line(f"{prefix}{ITEM_MARKS[change.action]} {_shown(change.path)}")
        for conflict in report.conflicts:
            line(f"{prefix}!conflict {_shown(conflict['path'])} -> "
                 f"{_shown(conflict['saved_to'])}")
        for s in report.skipped:
            line(f"{prefix}skipped: {_shown(s.path)}: {_shown(s.reason)}")
    else:
        for conflict in report.conflicts:
            line(f"{prefix}conflict: {conflict['path']} (remote version saved to "
                 f"{conflict['saved_to']})")
    line(
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
    line = req.output.print
    if req.output.json:
        line(json.dumps({"restored": restored}))
    elif not req.output.quiet:
        for path in restored:
            line(f"restored: {path}")
        line(f"undo: {len(restored)} files restored")
