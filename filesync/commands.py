"""The subcommands behind the CLI: build options, open the conduit, run, print."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from filesync.engine import Options, Report, run_pass
from filesync.errors import FilesyncError, UsageError
from filesync.exclude import ExcludeRule
from filesync.reconcile import Action, Direction, Kind
from filesync.state import default_state_dir
from filesync.target import ConnectOptions, Target, open_conduit, parse_remote


def _log(args: argparse.Namespace) -> Any:
    if args.verbose and not args.quiet:
        return lambda msg: print(f"filesync: {msg}", file=sys.stderr)
    return None


def _local_root(text: str) -> Path:
    root = Path(text).expanduser()
    if root.exists() and not root.is_dir():
        raise UsageError(f"LOCAL {text!r} is not a directory; give the directory to sync")
    return root.resolve()


def options_from(args: argparse.Namespace, direction: Direction, local: Path) -> Options:
    """Engine options from parsed arguments."""
    try:
        rule = ExcludeRule.build(
            args.exclude, default_excludes=not args.no_default_excludes, root=local
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
    )


def connect_options(args: argparse.Namespace) -> ConnectOptions:
    return ConnectOptions(
        ssh_config=args.ssh_config,
        identity=args.identity,
        accept_new_host_key=args.accept_new_host_key,
        log=_log(args),
    )


async def run_command(args: argparse.Namespace) -> int:
    """Run push/pull/sync/status/resolve/undo for one pair."""
    local = _local_root(args.local)
    target = parse_remote(args.remote, args.via)
    if args.command == "undo":
        from filesync.undo import undo_last

        undo_opts = options_from(args, Direction.PULL, local)
        restored = await _with_conduit(
            target, args, lambda c: undo_last(c, local, target.path, undo_opts)
        )
        _print_undo(args, restored)
        return 0
    direction = {"push": Direction.PUSH, "pull": Direction.PULL}.get(args.command, Direction.SYNC)
    opts = options_from(args, direction, local)
    plan_filter = _resolve_filter(args) if args.command == "resolve" else None

    async def go(conduit: Any) -> Report:
        return await run_pass(conduit, local, target.path, opts, plan_filter)

    report = await _with_conduit(target, args, go)
    _print_report(args, report)
    return 0


async def _with_conduit(target: Target, args: argparse.Namespace, fn: Any) -> Any:
    conduit = await open_conduit(target, connect_options(args))
    try:
        return await fn(conduit)
    finally:
        await conduit.close()


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
            print(f"skipped: {s.path}: {s.reason}")
    print(
        f"{args.command}: {report.uploaded} uploaded, {report.downloaded} downloaded, "
        f"{report.deleted_remote} deleted remote, {report.deleted_local} deleted local, "
        f"{len(report.conflicts)} conflicts, {len(report.skipped)} skipped, "
        f"{report.excluded} excluded ({report.seconds:.2f} s)"
    )


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
