"""The subcommands behind the CLI: build options, open the conduit, run, print."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filesync.cli.config import load_config
from filesync.core.exclude import ExcludeRule
from filesync.core.reconcile import Action, Direction, Kind
from filesync.endpoint.connect import drop_session
from filesync.errors import ConnectionLost, FilesyncError, UsageError
from filesync.host.state import default_state_dir
from filesync.mapping import UPLOAD_ONLY
from filesync.sync.engine import Options, Report, run_pass
from filesync.sync.progress import tty_progress
from filesync.transport.base import Conduit
from filesync.transport.target import ConnectOptions, Target, open_conduit, parse_remote


def _log(args: argparse.Namespace) -> Any:
    if args.verbose and not args.quiet:
        return lambda msg: print(f"filesync: {msg}", file=sys.stderr)
    return None


def _local_root(text: str) -> Path:
    root = Path(text).expanduser()
    if root.exists() and not root.is_dir():
        raise UsageError(f"LOCAL {text!r} is not a directory; give the directory to sync")
    return root.resolve()


def options_from(
    args: argparse.Namespace, direction: Direction, local: Path, extra: Sequence[str] = ()
) -> Options:
    """Engine options from parsed arguments (``extra``: more exclude patterns)."""
    try:
        rule = ExcludeRule.build(
            [*args.exclude, *extra], default_excludes=not args.no_default_excludes, root=local
        )
    except (ValueError, TypeError) as exc:
        raise UsageError(f"bad --exclude pattern ({exc}); use gitignore syntax") from None
    return Options(
        direction=direction,
        rule=rule,
        state_dir=(args.state_dir.expanduser() if args.state_dir else default_state_dir()),
        dry_run=args.dry_run or args.command == "status",
        force=args.force,
        lock_timeout=args.lock_timeout,
        max_file_size=args.max_file_size,
        max_pull_bytes=args.max_pull_bytes,
        log=_log(args),
        progress=tty_progress(not (args.json or args.quiet)),
        watch=getattr(args, "watch", False),
    )


def connect_options(args: argparse.Namespace) -> ConnectOptions:
    return ConnectOptions(
        ssh_config=args.ssh_config,
        identity=args.identity,
        accept_new_host_key=args.accept_new_host_key,
        log=_log(args),
        ssh_client=args.ssh_client,
    )


class Conduits:
    """Where a command gets its conduits: the CLI opens one per remote and closes it after.

    The persistent agent (``filesync.agent``) subclasses this to keep them open between
    commands. ``acquire`` says whether the conduit was reused, so that a pass that finds a
    reused connection dead can be retried once on a fresh one.
    """

    async def acquire(self, target: Target, opts: ConnectOptions) -> tuple[Conduit, bool]:
        return await open_conduit(target, opts), False

    async def release(self, conduit: Conduit, healthy: bool) -> None:
        await drop_session(conduit, polite=healthy)
        await conduit.close()


@dataclass
class Job:
    """Passes that share one connection: one remote, one or more mappings."""

    target: Target
    passes: list[tuple[str, Path, str, Options]]  # (label, local root, remote path, opts)


async def run_command(args: argparse.Namespace, conduits: Conduits | None = None) -> int:
    """Run push/pull/sync/status/resolve/undo, getting conduits from ``conduits``."""
    pool = conduits or Conduits()
    if args.config is not None:
        return await _run_jobs(args, _config_jobs(args), pool)
    if isinstance(args.remote, str):
        args.remote = [args.remote]
    if args.local is None or not args.remote:
        raise UsageError("give LOCAL REMOTE (or --config FILE)")
    local = _local_root(args.local)
    if args.command == "undo":
        return await _undo(args, local, parse_remote(args.remote[0], args.via), pool)
    direction = {"push": Direction.PUSH, "pull": Direction.PULL}.get(args.command, Direction.SYNC)
    jobs = []
    for text in args.remote:
        target = parse_remote(text, args.via)
        opts = options_from(args, direction, local)
        jobs.append(Job(target, [(target.label(), local, target.path, opts)]))
    return await _run_jobs(args, jobs, pool)


async def _undo(args: argparse.Namespace, local: Path, target: Target, pool: Conduits) -> int:
    from filesync.sync.undo import undo_last

    opts = options_from(args, Direction.PULL, local)
    conduit, _ = await pool.acquire(target, connect_options(args))
    healthy = False
    try:
        restored = await undo_last(conduit, local, target.path, opts)
        healthy = True
    finally:
        await pool.release(conduit, healthy)
    _print_undo(args, restored)
    return 0


def _config_jobs(args: argparse.Namespace) -> list[Job]:
    config = load_config(args.config)
    direction = {"push": Direction.PUSH, "pull": Direction.PULL}.get(args.command, Direction.SYNC)
    if args.command not in ("push", "pull", "sync", "status"):
        raise UsageError(f"--config works with push, pull, sync and status, not {args.command}")
    jobs = []
    for remote in config.remotes:
        passes = []
        for spec in config.mappings:
            mine = direction
            if spec.mapping.mode == UPLOAD_ONLY:
                if direction is Direction.PULL:
                    continue  # upload-only: never written back
                mine = Direction.PUSH
            local = _local_root(spec.mapping.local)
            target = config.target(remote, spec)
            opts = options_from(args, mine, local,
                                [*spec.exclude, *config.nested_excludes(spec)])
            passes.append((f"{target.label()}", local, target.path, opts))
        jobs.append(Job(config.target(remote, config.mappings[0]), passes))
    return jobs


async def _run_jobs(args: argparse.Namespace, jobs: list[Job], pool: Conduits) -> int:
    plan_filter = _resolve_filter(args) if args.command == "resolve" else None
    copts = connect_options(args)

    async def one(job: Job) -> list[tuple[str, Report | FilesyncError]]:
        out: list[tuple[str, Report | FilesyncError]] = []
        try:
            conduit, reused = await pool.acquire(job.target, copts)
        except FilesyncError as exc:
            return [(label, exc) for label, *_ in job.passes]
        try:
            for label, local, path, opts in job.passes:
                try:
                    try:
                        run = run_pass(conduit, local, path, opts, plan_filter)
                        out.append((label, await _deadline(run, args.timeout)))
                    except ConnectionLost:
                        if not reused:
                            raise
                        # A kept connection died while idle (a server restart, an evicted NAT
                        # entry); the failed pass changed nothing, so it runs on a new one.
                        await pool.release(conduit, False)
                        conduit, reused = await pool.acquire(job.target, copts)
                        run = run_pass(conduit, local, path, opts, plan_filter)
                        out.append((label, await _deadline(run, args.timeout)))
                except FilesyncError as exc:
                    out.append((label, exc))
                reused = False
        except BaseException:
            await pool.release(conduit, False)
            raise
        await pool.release(conduit, not any(isinstance(r, ConnectionLost) for _, r in out))
        return out

    results = [r for rs in await asyncio.gather(*(one(j) for j in jobs)) for r in rs]
    if len(results) == 1:
        _label, result = results[0]
        if isinstance(result, FilesyncError):
            raise result
        _print_report(args, result)
        return 0
    return _print_many(args, results)


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


def _print_many(args: argparse.Namespace, results: list[tuple[str, Report | FilesyncError]]) -> int:
    """Several pairs: one JSON object with per-pair entries and summed counters."""
    code = 0
    rows: list[dict[str, Any]] = []
    for label, result in results:
        if isinstance(result, FilesyncError):
            code = max(code, result.exit_code)
            rows.append({"remote": label, "error": result.message,
                         "exit_code": result.exit_code})
            print(f"filesync: error: {label}: {result.message}", file=sys.stderr)
        else:
            rows.append({"remote": label, **result.to_json()})
            if not args.json:
                print(f"[{label}] ", end="")
                _print_report(args, result)
    if args.json:
        total: dict[str, Any] = {k: sum(r.get(k, 0) for r in rows) for k in _COUNTS}
        total["remotes"] = rows
        print(json.dumps(total))
    return code


_COUNTS = ("uploaded", "downloaded", "deleted_local", "deleted_remote", "excluded",
           "bytes_sent", "bytes_received")


def _resolve_filter(args: argparse.Namespace) -> Any:
    """Turn the plan into the one step that settles PATH in favour of --keep."""
    path = args.path.strip("/")

    def only(plan: list[Action]) -> list[Action]:
        match = [a for a in plan if a.path == path]
        if not match or match[0].kind is not Kind.CONFLICT:
            raise FilesyncError(
                f"{path!r} is not in conflict; run 'filesync status LOCAL REMOTE' to list conflicts"
            )
        return [Action(path, Kind.UPLOAD if args.keep == "local" else Kind.DOWNLOAD)]

    return only


def _print_report(args: argparse.Namespace, report: Report) -> None:
    if args.json:
        out = report.to_json()
        if args.command == "status" or args.dry_run:
            out["plan"] = [_plan_row(a) for a in report.plan]
            out["open_conflicts"] = [c.path for c in report.open_conflicts]
        print(json.dumps(out))
        return
    if args.command == "status" or args.dry_run:
        for a in report.plan:
            print(f"{_plan_row(a)['action']:<28} {a.path}")
        for c in report.open_conflicts:
            print(f"{'open conflict':<28} {c.path}  (remote version: {c.saved_to})")
        if not report.plan and not report.open_conflicts:
            print("in sync")
        return
    if args.quiet:
        return
    for conflict in report.conflicts:
        print(f"conflict: {conflict['path']} (remote version saved to {conflict['saved_to']})")
    if args.verbose:
        for s in report.skipped:
            print(f"skipped: {_shown(s.path)}: {_shown(s.reason)}")
    print(
        f"{args.command}: {report.uploaded} uploaded, {report.downloaded} downloaded, "
        f"{report.deleted_remote} deleted remote, {report.deleted_local} deleted local, "
        f"{len(report.conflicts)} conflicts, {len(report.skipped)} skipped, "
        f"{report.excluded} excluded ({report.seconds:.2f} s)"
    )


def _shown(text: str) -> str:
    """A name for the terminal: skipped names come from the remote and may hold control
    characters (terminal escapes, newlines) or undecodable bytes; those are escaped."""
    return text if text.isprintable() else ascii(text)[1:-1]


def _plan_row(a: Action) -> dict[str, str]:
    action = a.kind.value if a.then is None else f"{a.kind.value} -> {a.then.value}"
    return {"path": a.path, "action": action}


def _print_undo(args: argparse.Namespace, restored: list[str]) -> None:
    if args.json:
        print(json.dumps({"restored": restored}))
    elif not args.quiet:
        for path in restored:
            print(f"restored: {path}")
        print(f"undo: {len(restored)} files restored")
