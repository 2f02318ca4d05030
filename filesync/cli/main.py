"""The ``filesync`` command line. Every subcommand takes ``LOCAL REMOTE`` in that order.

Exit codes: 0 done (reported conflicts included), 1 failed, 2 usage, 3 refused by a
safety guard. Expected failures print one line, ``filesync: error: ...``.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import gc
import math
import os
import sys
import threading
from pathlib import Path

from filesync.errors import FilesyncError, UsageError
from filesync.version import __version__

# What a plain run loads before it spawns ssh's login (``_begin_logins``) delays the login
# by its import time, so that path leaves out ``typing``, ``dataclasses``, ``json`` and
# ``asyncio`` (``tests/cli/test_cold_path.py``). ``typing.TYPE_CHECKING`` without
# importing ``typing``: mypy and ruff treat the name alike.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any, NoReturn

    from filesync.cli.settings import Request, Sink
    from filesync.session.runner import EndpointConduits
    from filesync.transport.ssh.openssh_login import Pending
    from filesync.transport.target import Target

#: Commands that may run through the persistent agent (``--persist``).
AGENT_COMMANDS = frozenset({"push", "pull", "sync", "status", "resolve", "undo"})
#: Every command, in the order ``--help`` lists them.
COMMANDS = ("push", "pull", "sync", "status", "undo", "watch", "resolve", "demo",
            "profile-snippet", "agent")

UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def _size(text: str) -> int:
    """A size above 0 bytes: ``512``, ``64K``, ``512M``, ``2G``, ``1.5GiB``."""
    value = text.strip().lower().removesuffix("b").removesuffix("i")
    unit = value[-1] if value and value[-1] in UNITS else ""
    try:
        number = float(value[: len(value) - len(unit)]) * UNITS[unit]
    except ValueError:
        number = math.nan
    if not (math.isfinite(number) and number >= 1):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size above 0 such as 512M or 2G")
    return int(number)


_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600}


def _duration(text: str) -> float:
    value = text.strip().lower()
    unit = value[-1] if value and value[-1] in _SECONDS else ""
    try:
        seconds = float(value[: len(value) - len(unit)]) * _SECONDS[unit]
    except ValueError:
        seconds = -1.0
    if not (math.isfinite(seconds) and seconds >= 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration such as 90, 10m or 1h")
    return seconds


def _seconds(text: str) -> float:
    """A timeout: seconds >= 0, where 0 keeps the documented meaning (none / no wait)."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= 0):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of seconds >= 0 (0: no limit)")
    return seconds


def _positive_seconds(text: str) -> float:
    """A deadline that cannot be switched off: seconds > 0."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds > 0")
    return seconds


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, exit 2, like every other failure
        command = " ".join(self.prog.split()[1:])
        raise UsageError(f"{message} (see 'filesync {command + ' ' if command else ''}--help')")


def _common(
    p: argparse.ArgumentParser, env: Mapping[str, str], pair: bool = True,
    fanout: bool = False, config: bool = True
) -> None:
    if pair:
        p.add_argument("local", metavar="LOCAL", nargs="?" if config else None,
                       help="host directory (or a single file; REMOTE then names the "
                       "file, any name, or a directory ending in /)" if config
                       else "host directory")
        p.add_argument("remote", metavar="REMOTE",
                       nargs="*" if fanout else ("?" if config else None),
                       help="[user@]host:path, ssh://[user@]host[:port]/path, or a local path"
                       " (push takes several: it fans out to all of them at once)")
    if config:
        p.add_argument("--config", type=Path, metavar="FILE",
                       help="filesync.toml with remotes and mappings, instead of LOCAL REMOTE")
    else:
        p.set_defaults(config=None)
    p.add_argument("--exclude", action="append", default=[], metavar="PATTERN",
                   help="gitignore-style pattern to exclude (repeatable)")
    p.add_argument("--no-default-excludes", action="store_true",
                   help="do not prune .git, node_modules, .hub, .curator_backups, ...")
    p.add_argument("-n", "--dry-run", action="store_true", help="show the plan, change nothing")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--state-dir", type=Path, help="state dir (env FILESYNC_STATE_DIR)")
    p.add_argument("--force", action="store_true", help="override the safety guards")
    p.add_argument("-F", "--ssh-config", type=Path, metavar="FILE", help="ssh config file")
    p.add_argument("-i", "--identity", type=Path, metavar="FILE", help="private key file")
    p.add_argument("--accept-new-host-key", action="store_true",
                   help="store an unknown host key (a changed key is always refused)")
    p.add_argument("--ssh-client", choices=("openssh", "asyncssh"),
                   default=None,
                   help="SSH client: the system ssh (default when found) or the built-in"
                   " asyncssh (env FILESYNC_SSH_CLIENT)")
    p.add_argument("--via", metavar="CMD",
                   help="reach the remote shell through CMD, e.g. 'docker exec -i NAME'")
    p.add_argument("--lock-timeout", type=_seconds, default=0.0, metavar="SECONDS",
                   help="wait this long for another run on the same pair (0: fail at once)")
    p.add_argument("--timeout", type=_seconds, default=0.0, metavar="SECONDS",
                   help="overall deadline of a run (0: none); a late run stops cleanly")
    p.add_argument("--idle-timeout", type=_positive_seconds, default=60.0, metavar="SECONDS",
                   help="stop when the remote owes data and sends nothing this long"
                   " (default 60, > 0)")
    p.add_argument("--max-file-size", type=_size, default="1G", metavar="SIZE",
                   help="a pull skips (and reports) bigger files (default 1G)")
    p.add_argument("--max-pull-bytes", type=_size, default="2G", metavar="SIZE",
                   help="a pull that would fetch more stops before it starts (default 2G)")
    p.add_argument("--persist", type=_duration, metavar="DURATION",
                   default=env.get("FILESYNC_PERSIST") or None,
                   help="run through a background agent that keeps connections open for"
                   " DURATION after the last run, like ssh's ControlPersist (env"
                   " FILESYNC_PERSIST; 0 or unset: no agent)")
    p.add_argument("-v", "--verbose", action="count", default=0)
    p.add_argument("-q", "--quiet", action="store_true")


def build_parser(env: Mapping[str, str] | None = None, command: str | None = None,
                 *, sole: bool = False) -> argparse.ArgumentParser:
    """The parser; option defaults from ``env`` (None: the process's environment).
    ``command``: the only subcommand whose options are needed (None: every one's). The
    others are still named, with their help, but left empty: their ~25 options each
    would cost a plain run's login the milliseconds it takes to declare them. ``sole``:
    not even named (for a command line that starts with ``command``, one of
    ``COMMANDS``: it never reaches the top level's help or its invalid-choice error, the
    only places that list them)."""
    env = os.environ if env is None else env
    parser = _Parser(prog="filesync", description="Bidirectional file sync over SSH.")
    parser.add_argument("--version", action="version", version=f"filesync {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    def declared(name: str, text: str, described: bool = False) -> _Parser | None:
        """The subparser ``name`` (``text``: its help, and its description if
        ``described``); None if ``sole`` leaves it out."""
        if sole and name != command:
            return None
        return sub.add_parser(name, help=text, description=text if described else None)

    for name, text in (
        ("push", "make the remote match the host (remote conflicts are saved first)"),
        ("pull", "bring back what changed on the remote (host wins conflicts)"),
        ("sync", "both ways; conflicts stay for 'filesync resolve'"),
        ("status", "print the plan and open conflicts; change nothing"),
        ("undo", "restore the host files the last pull replaced or deleted"),
    ):
        p = declared(name, text, described=True)
        if p is not None and command in (None, name):
            _common(p, env, fanout=name == "push", config=name != "undo")
    text = "sync both ways whenever either side changes, until Ctrl-C or SIGTERM"
    watch = declared("watch", text, described=True)
    if watch is not None and command in (None, "watch"):
        _common(watch, env)
    resolve = declared("resolve", "settle one conflict")
    if resolve is not None and command in (None, "resolve"):
        _common(resolve, env, config=False)
        resolve.add_argument("path", metavar="PATH", help="path relative to the roots")
        resolve.add_argument("--keep", choices=("local", "remote"), required=True)
    if demo := declared("demo", "run the sync-back scenario on an in-process SSH server"):
        demo.add_argument("--keep-dir", type=Path, help="leave the demo trees in this dir")
    if snippet := declared("profile-snippet", "print an /etc/profile.d PATH snippet"):
        snippet.add_argument("dirs", nargs="+", metavar="DIR")
    if agent := declared("agent", "show or stop the persistent agent (see --persist)"):
        agent.add_argument("action", choices=("status", "stop"))
        agent.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    return parser


def parse(args_list: Sequence[str], env: Mapping[str, str] | None = None) -> argparse.Namespace:
    """Parse a command line (defaults from ``env``, None: the process's environment);
    raise ``UsageError`` (exit 2) on bad input."""
    # The top level takes no option with a value: its first word that is no option is
    # the subcommand, the only one whose options are declared.
    command = next((a for a in args_list if not a.startswith("-")), None)
    sole = command in COMMANDS and args_list[0] == command
    args = build_parser(env, command, sole=sole).parse_args(args_list)
    if args.command is None:
        raise UsageError("no command given; run 'filesync --help' for the list")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (also used as the console script)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    json_mode = "--json" in args_list
    try:
        args = parse(args_list)
        if args.command == "agent":
            from filesync.cli.agent_client import agent_command

            return agent_command(args.action, args_list)
        if args.command in AGENT_COMMANDS and args.persist:
            # Imported here: the agent path must stay free of asyncio and asyncssh.
            from filesync.cli.agent_client import run_via_agent

            code = run_via_agent(args_list, args.persist, bool(args.verbose))
            if code is not None:
                return code
        elif args.command in AGENT_COMMANDS:
            logins = _begin_logins(args)
            try:
                return _dispatch(args, logins)
            finally:
                for login in logins.values():
                    login.close()  # a command that failed before it connected leaves none
        return _dispatch(args)
    except BaseException as exc:
        return handle_failure(exc, json_mode)


#: The ``filesync`` process's threshold for CPython's full (oldest-generation) collections.
#: A pass builds objects that live until the process ends (a 100k-file tree: ~1.5 million
#: listing entries, state rows, plan items), and by default a full collection, which
#: traverses every one of them, runs each time they have grown by a quarter: a fifth of a
#: 100k-file no-op push's CPU. Young cycles are still collected as usual; the process is
#: short-lived, so old cyclic garbage (there is next to none) waits for its end.
FULL_COLLECTION_THRESHOLD = 1_000_000


def run() -> NoReturn:
    """The ``filesync`` command (console script, ``python -m filesync``): ``main``, then
    the process ends. The process is filesync's own, so it also sets its collector's
    pace (``FULL_COLLECTION_THRESHOLD``); ``main``, which a host program may call, does not.

    It ends without the interpreter's teardown (freeing every module and object, a
    noticeable part of a cold run) whenever that is safe: output flushed, no other thread
    running, no profiler or debugger attached.
    By then every file filesync wrote is closed and synced and the state databases are
    closed; the ``atexit`` handlers still run (a login nobody took over is ended, coverage
    data is saved). Otherwise it exits as ``sys.exit`` does.
    """
    young, middle, _full = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_COLLECTION_THRESHOLD)
    code = main()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        sys.exit(code)  # a closed or broken pipe: Python's own exit reports it
    # A profiler or debugger (cProfile, pdb) reports after the program returns: not skipped.
    if threading.active_count() == 1 and sys.getprofile() is None and sys.gettrace() is None:
        atexit._run_exitfuncs()
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


async def main_in_agent(args_list: Sequence[str], conduits: EndpointConduits, *,
                        env: Mapping[str, str], cwd: str, umask: int, sink: Sink) -> int:
    """What ``main`` does for a pass command, run on the agent's loop with its conduits
    (and their owner of warm state, the agent's), in the client's context given as
    values: its environment ``env``, working directory ``cwd`` (absolute), ``umask``
    and ``sink`` for what it prints. Nothing of the process (``os.environ``, its working
    directory or umask, ``sys.stdout``) is read for the command or changed."""
    from filesync.cli.commands import run_command

    try:
        req = request_from(parse(args_list, env), env=env, cwd=cwd, umask=umask, sink=sink)
        return await run_command(req, conduits)
    except BaseException as exc:
        return handle_failure(exc, "--json" in args_list, sink)


def handle_failure(exc: BaseException, json_mode: bool, sink: Sink | None = None) -> int:
    """Turn an expected failure into its one line (and JSON) on ``sink`` (None: the
    process's stdout and stderr) and exit code; re-raise the rest."""
    if isinstance(exc, SystemExit):
        # ``--help``, ``--version``: argparse has printed its text and exits; loading the
        # sinks (and with them asyncio) would only delay that exit.
        raise exc
    from filesync.cli.settings import STDIO

    sink = sink or STDIO
    if isinstance(exc, FilesyncError):
        _fail(exc, json_mode, sink)
        return exc.exit_code
    if isinstance(exc, KeyboardInterrupt):
        sink.err("filesync: error: interrupted; rerun to finish, nothing was half-applied\n")
        return 130
    sqlite3 = sys.modules.get("sqlite3")  # not imported for --help or the agent client
    if isinstance(exc, OSError) or (sqlite3 is not None and isinstance(exc, sqlite3.Error)):
        # Last line of defence (a full disk under the state dir, a vanished directory):
        # one line, exit 1. What was applied is journaled; a rerun finishes or redoes it.
        _fail(FilesyncError(_system_error(exc)), json_mode, sink)
        return 1
    raise exc


def _system_error(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        where = f" ({exc.filename})" if exc.filename else ""
        text = f"{exc.strerror or exc}{where}"
    else:
        text = f"state database: {exc}"
    return " ".join(text.split()) + "; fix the cause (a full disk?) and rerun"


def _fail(exc: FilesyncError, json_mode: bool, sink: Sink) -> None:
    sink.err(f"filesync: error: {exc.message}\n")
    if json_mode:
        import json

        from filesync.cli.jsonout import failed_document

        sink.out(json.dumps(failed_document(exc.message, exc.exit_code)) + "\n")


def _begin_logins(args: argparse.Namespace) -> dict[Target, Pending]:
    """Start the system ssh's logins now, before the engine is imported: the handshake then
    runs while filesync loads and walks the host, instead of after. ``connect`` takes each
    login over (and reports its failure, in the usual order: a usage error comes first).
    Only for plain ``LOCAL REMOTE`` commands over OpenSSH; anything else connects later.
    Returns the logins by target, for the command's pool to hand each to its connection."""
    if args.config is not None or args.via is not None or args.local is None:
        return {}
    # Light on purpose: nothing slower may run before the spawn. The targets (their module
    # needs dataclasses) are made after it, from the same REMOTE texts.
    from filesync.transport.ssh import openssh_login as openssh
    from filesync.transport.ssh.destination import ssh_remote

    texts: list[str] = [args.remote] if isinstance(args.remote, str) else args.remote or []
    try:
        if openssh.choose_client(args.ssh_client) != "openssh" or not all(texts):
            return {}  # (an empty REMOTE is refused by the command)
        remotes = {ssh: text for text in texts if (ssh := ssh_remote(text)) is not None}
    except FilesyncError:
        return {}  # reported by the command itself, in its usual place
    begun = openssh.begin_all(
        [(host, user, port) for host, user, port, _path in remotes],
        ssh_config=absolute(args.ssh_config), identity=absolute(args.identity),
        accept_new_host_key=args.accept_new_host_key)
    from filesync.transport.target import parse_remote

    return {parse_remote(text): login for text, login in zip(remotes.values(), begun,
                                                              strict=True)}


def _dispatch(args: argparse.Namespace, logins: dict[Target, Pending] | None = None) -> int:
    if args.command == "profile-snippet":
        from filesync.profile_d import profile_snippet

        try:
            sys.stdout.write(profile_snippet(args.dirs))
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        return 0
    if args.command == "demo":
        from filesync.cli.demo import run_demo

        return run_demo(args.keep_dir)
    if args.command == "watch":
        from filesync.cli.watch import run_watch

        # (FILESYNC_PERSIST in the environment is for the other commands: not refused)
        if args.persist and not os.environ.get("FILESYNC_PERSIST"):
            raise UsageError("watch keeps its own connection for as long as it runs; "
                             "drop --persist")
        return run_watch(request_from(args))
    import asyncio

    return asyncio.run(_run_command(request_from(args), logins))


async def _run_command(req: Request, logins: dict[Target, Pending] | None) -> int:
    """One command run: its own owner of warm state, which keeps nothing once it ends."""
    from filesync.cli.commands import run_command
    from filesync.session.runner import EndpointConduits
    from filesync.session.terms import WarmState

    warm = WarmState(keep_state=False)
    try:
        return await run_command(req, EndpointConduits(warm, logins))
    finally:
        await warm.close()


def request_from(args: argparse.Namespace, *, env: Mapping[str, str] | None = None,
                 cwd: str | None = None, umask: int | None = None,
                 sink: Sink | None = None) -> Request:
    """The one place parsed arguments become typed values; nothing past it sees ``args``.

    The command's context: ``env`` (None: the process's environment), ``cwd`` (None: the
    process's working directory), ``umask`` (None: the process's) and ``sink`` (None:
    the process's stdout and stderr). Relative paths of the command line are made
    absolute here, against ``cwd`` and ``env``'s ``~``.
    """
    from filesync.cli.settings import STDIO, Output, PassSettings, Request, local_root
    from filesync.transport.spawn import Spawn
    from filesync.transport.target import ConnectOptions, parse_remote, via_argv

    def _absolute(path: Path | None) -> Path | None:
        return absolute(path, env, cwd)

    output = Output(json=args.json, quiet=args.quiet, verbose=args.verbose,
                    sink=sink or STDIO)
    settings = PassSettings(
        state_dir=_absolute(args.state_dir),
        exclude=tuple(args.exclude),
        default_excludes=not args.no_default_excludes,
        dry_run=args.dry_run or args.command == "status",
        force=args.force,
        lock_timeout=args.lock_timeout,
        timeout=args.timeout,
        idle_timeout=args.idle_timeout,
        max_file_size=args.max_file_size,
        max_pull_bytes=args.max_pull_bytes,
    )
    connect = ConnectOptions(
        ssh_config=_absolute(args.ssh_config),
        identity=_absolute(args.identity),
        accept_new_host_key=args.accept_new_host_key,
        log=output.log(),
        ssh_client=args.ssh_client,
        spawn=Spawn(env, cwd, umask),
    )
    remotes = [args.remote] if isinstance(args.remote, str) else list(args.remote or [])
    config, local = _absolute(args.config), None
    targets: tuple[Target, ...] = ()
    if config is not None:
        if args.local is not None or remotes:
            raise UsageError("give LOCAL REMOTE or --config FILE, not both")
        if args.via is not None:
            via_argv(args.via)  # a bad --via is a usage error before the file is read
    elif args.local is None or not remotes:
        raise UsageError("give LOCAL REMOTE (or --config FILE)")
    else:
        local = local_root(args.local, None if cwd is None else Path(cwd), env=env,
                           files=args.command in ("push", "pull", "sync", "status", "watch"))
        targets = tuple(parse_remote(text, args.via, cwd=cwd, env=env) for text in remotes)
    return Request(
        command=args.command, settings=settings, connect=connect, output=output,
        local=local, targets=targets, config=config, via=args.via,
        path=getattr(args, "path", "").strip("/"), keep=getattr(args, "keep", None) or "",
        env=os.environ if env is None else env, umask=umask,
    )


def absolute(path: Path | None, env: Mapping[str, str] | None = None,
             cwd: str | None = None) -> Path | None:
    """``path`` with ``~`` expanded (``env``'s home) and made absolute (against ``cwd``;
    None: the process's own). Once, where arguments become values: the agent runs each
    command in its client's directory, never its own."""
    from filesync.tree.paths import expand_user

    if path is None:
        return None
    expanded = Path(expand_user(str(path), env))
    return expanded if expanded.is_absolute() else Path(cwd or os.getcwd()) / expanded


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
