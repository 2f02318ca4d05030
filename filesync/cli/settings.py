"""Typed values of a command: what a pass needs, with no trace of argparse.

The CLI turns its parsed arguments into these once (``filesync.cli.main``); nothing below
the CLI sees the arguments. They are the values a library ``Session(remote, *,
ssh_config=None, identity=None, via=None, state_dir=None, exclude=(),
default_excludes=True, ...)`` takes, with the same names and defaults: ``PassSettings``
for how passes run, ``ConnectOptions`` (``filesync.transport.target``) for how the remote
is reached, ``Target`` for where it is.

Every value is frozen and checked when it is made: a negative size or timeout is a
``ValueError`` here, whoever built it (the CLI rejects it earlier, naming the option).
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Final, Protocol

from filesync.core.exclude import ExcludeRule
from filesync.core.reconcile import Direction
from filesync.core.record import FrozenRecord
from filesync.errors import UsageError
from filesync.session.terms import (
    IDLE_TIMEOUT,
    Options,
    Progress,
    Rename,
    check_idle_timeout,
    default_state_dir,
)
from filesync.transport.target import ConnectOptions, Target
from filesync.tree.paths import expand_user

DEFAULT_MAX_FILE_SIZE = 1 << 30
DEFAULT_MAX_PULL_BYTES = 2 << 30


class PassSettings(FrozenRecord):
    """How passes run. ``timeout`` and ``lock_timeout`` are seconds, 0 for none / no wait;
    ``idle_timeout`` is seconds above 0 (no "none": see ``filesync.endpoint.idle``);
    sizes are bytes, above 0. ``state_dir`` None is ``$FILESYNC_STATE_DIR`` or the XDG
    default, looked up when a pass starts.

    The records of this module are ``FrozenRecord``s, not dataclasses: every CLI run
    imports it, and creating a dataclass costs ~1 ms of CPU (``filesync.core.record``)."""

    __slots__ = ("default_excludes", "dry_run", "exclude", "force", "idle_timeout",
                 "lock_timeout", "max_file_size", "max_pull_bytes", "state_dir", "timeout")
    _fields = ("state_dir", "exclude", "default_excludes", "dry_run", "force",
               "lock_timeout", "timeout", "idle_timeout", "max_file_size", "max_pull_bytes")

    def __init__(self, state_dir: Path | None = None, exclude: tuple[str, ...] = (),
                 default_excludes: bool = True, dry_run: bool = False, force: bool = False,
                 lock_timeout: float = 0.0, timeout: float = 0.0,
                 idle_timeout: float = IDLE_TIMEOUT,
                 max_file_size: int = DEFAULT_MAX_FILE_SIZE,
                 max_pull_bytes: int = DEFAULT_MAX_PULL_BYTES) -> None:
        self.state_dir: Final = state_dir
        self.exclude: Final = exclude
        self.default_excludes: Final = default_excludes
        self.dry_run: Final = dry_run
        self.force: Final = force
        self.lock_timeout: Final = lock_timeout
        self.timeout: Final = timeout
        self.idle_timeout: Final = idle_timeout
        self.max_file_size: Final = max_file_size
        self.max_pull_bytes: Final = max_pull_bytes
        self._check()

    def _check(self) -> None:
        if not isinstance(self.exclude, tuple) or not all(
            isinstance(p, str) for p in self.exclude
        ):
            raise ValueError(f"exclude must be a tuple of pattern strings, not {self.exclude!r}")
        for name in ("lock_timeout", "timeout"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a number of seconds >= 0, not {value!r}")
        check_idle_timeout(self.idle_timeout)
        for name in ("max_file_size", "max_pull_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a number of bytes > 0, not {value!r}")

    def options(
        self,
        direction: Direction,
        local: Path,
        *,
        extra: Sequence[tuple[str, Sequence[str]]] = (),
        log: Callable[[str], None] | None = None,
        progress: Progress | None = None,
        warn: Callable[[str], None] | None = None,
        env: Mapping[str, str] | None = None,
        umask: int | None = None,
    ) -> Options:
        """Engine options for one pass on ``local`` (``extra``: more exclude patterns, each
        group with the label an error names it by; ``env``: whose default state dir,
        None the process's; ``umask``: see ``Options.umask``). An invalid pattern raises
        ``PatternError`` (a one-line usage error naming it and where it came from)."""
        rule = ExcludeRule.build(self.exclude, default_excludes=self.default_excludes,
                                 root=local, more=extra)
        return self.pass_options(direction, rule, self.state_path(env), log=log,
                                 progress=progress, warn=warn, umask=umask)

    def state_path(self, env: Mapping[str, str] | None = None) -> Path:
        """The state dir passes use: ``state_dir`` with ``~`` expanded, else the default
        of ``env`` (None: the process's environment)."""
        if self.state_dir:
            return Path(expand_user(str(self.state_dir), env))
        return default_state_dir(env)

    def pass_options(
        self,
        direction: Direction,
        rule: ExcludeRule,
        state_dir: Path,
        *,
        log: Callable[[str], None] | None = None,
        progress: Progress | None = None,
        rename: Rename | None = None,
        warn: Callable[[str], None] | None = None,
        umask: int | None = None,
    ) -> Options:
        """Engine options for one pass whose rule and state dir (and a single file's
        remote name) are already chosen (by the session's planner,
        ``filesync.session.passes``)."""
        return Options(
            direction=direction,
            rule=rule,
            state_dir=state_dir,
            dry_run=self.dry_run,
            force=self.force,
            lock_timeout=self.lock_timeout,
            max_file_size=self.max_file_size,
            max_pull_bytes=self.max_pull_bytes,
            log=log,
            warn=warn or STDIO.warn,
            progress=progress,
            rename=rename,
            idle_timeout=self.idle_timeout,
            umask=umask,
        )


class Sink(Protocol):
    """Where a command's text goes: its caller's stdout and stderr. The plain CLI's is
    the process's (``STDIO``); the agent's sends it to the client that asked."""

    def out(self, text: str) -> None:
        """Write ``text`` (whole lines, newline included) to stdout."""

    def err(self, text: str) -> None:
        """Write ``text`` (whole lines, newline included) to stderr, flushed."""

    def terminal(self) -> bool:
        """True if stderr is a terminal (progress bars are drawn there)."""


class StdSink:
    """The process's own ``sys.stdout`` and ``sys.stderr``, looked up at each write (so a
    host program or a test that swaps them is followed)."""

    def out(self, text: str) -> None:
        sys.stdout.write(text)

    def err(self, text: str) -> None:
        sys.stderr.write(text)
        sys.stderr.flush()

    def terminal(self) -> bool:
        return sys.stderr.isatty()

    def warn(self, message: str) -> None:
        self.err(f"filesync: warning: {message}\n")


#: The plain CLI's sink.
STDIO = StdSink()


class Output(FrozenRecord):
    """What the CLI prints: ``json`` one object on stdout, ``quiet`` less, ``verbose`` more;
    all of it through ``sink`` (not compared)."""

    __slots__ = ("json", "quiet", "sink", "verbose")
    _fields = ("json", "quiet", "verbose", "sink")
    _uncompared = frozenset({"sink"})

    def __init__(self, json: bool = False, quiet: bool = False, verbose: int = 0,
                 sink: Sink = STDIO) -> None:
        self.json: Final = json
        self.quiet: Final = quiet
        self.verbose: Final = verbose
        self.sink: Final = sink

    def print(self, line: str) -> None:
        """One line on stdout."""
        self.sink.out(line + "\n")

    def error(self, line: str) -> None:
        """One line on stderr."""
        self.sink.err(line + "\n")

    def warn(self, message: str) -> None:
        """A ``filesync: warning: ...`` line on stderr."""
        self.error(f"filesync: warning: {message}")

    def log(self) -> Callable[[str], None] | None:
        """The ``-v`` log (to stderr), or None."""
        if self.verbose and not self.quiet:
            return lambda msg: self.error(f"filesync: {msg}")
        return None


class Request(FrozenRecord):
    """One pass command, fully typed: push, pull, sync, status, resolve or undo.

    Either ``local`` and ``targets`` (LOCAL REMOTE...) or ``config`` (a filesync.toml,
    read when the command runs; ``via`` then overrides the file's). ``keep`` and ``path``
    are resolve's. ``env`` is not compared.
    """

    __slots__ = ("command", "config", "connect", "env", "keep", "local", "output", "path",
                 "settings", "targets", "umask", "via")
    _fields = ("command", "settings", "connect", "output", "local", "targets", "config",
               "via", "path", "keep", "env", "umask")
    _uncompared = frozenset({"env"})

    def __init__(self, command: str, settings: PassSettings, connect: ConnectOptions,
                 output: Output, local: Path | None = None, targets: tuple[Target, ...] = (),
                 config: Path | None = None, via: str | None = None, path: str = "",
                 keep: str = "", env: Mapping[str, str] | None = None,
                 umask: int | None = None) -> None:
        self.command: Final = command
        self.settings: Final = settings
        self.connect: Final = connect
        self.output: Final = output
        self.local: Final = local
        self.targets: Final = targets
        self.config: Final = config
        self.via: Final = via
        self.path: Final = path
        self.keep: Final = keep
        #: The environment the command runs in (state dir, ``~`` of a config file's
        #: paths): the process's for the plain CLI, the client's in the agent.
        self.env: Final[Mapping[str, str]] = os.environ if env is None else env
        #: The umask of what the command creates on the host (``Options.umask``): None
        #: for the plain CLI (the process's), the client's in the agent.
        self.umask: Final = umask

    @property
    def plan_only(self) -> bool:
        """The plan is printed and nothing changes (status, or --dry-run)."""
        return self.command == "status" or self.settings.dry_run


def local_root(text: str, base: Path | None = None, *, files: bool = False,
               env: Mapping[str, str] | None = None) -> Path:
    """LOCAL as an absolute directory (``base``: what a relative one is relative to, else
    the working directory; ``env``: whose ``~``, else the process's); ``UsageError`` if it
    names something else than a directory, unless ``files``: then anything else is
    returned with its parent resolved, for the session's planner to map as a single file
    or refuse (``BadMapping``)."""
    root = Path(expand_user(text, env))
    if base is not None and not root.is_absolute():
        root = base / root
    if (root.exists() or root.is_symlink()) and not root.is_dir():
        if files:
            return root.absolute().parent.resolve() / root.name
        raise UsageError(f"LOCAL {text!r} is not a directory; give the directory to sync "
                         "(push, pull, sync and status also take a single file)")
    return root.resolve()
