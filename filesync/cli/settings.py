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
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from filesync.core.exclude import ExcludeRule
from filesync.core.reconcile import Direction
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

DEFAULT_MAX_FILE_SIZE = 1 << 30
DEFAULT_MAX_PULL_BYTES = 2 << 30


@dataclass(frozen=True)
class PassSettings:
    """How passes run. ``timeout`` and ``lock_timeout`` are seconds, 0 for none / no wait;
    ``idle_timeout`` is seconds above 0 (no "none": see ``filesync.endpoint.idle``);
    sizes are bytes, above 0. ``state_dir`` None is ``$FILESYNC_STATE_DIR`` or the XDG
    default, looked up when a pass starts."""

    state_dir: Path | None = None
    exclude: tuple[str, ...] = ()
    default_excludes: bool = True
    dry_run: bool = False
    force: bool = False
    lock_timeout: float = 0.0
    timeout: float = 0.0
    idle_timeout: float = IDLE_TIMEOUT
    max_file_size: int = DEFAULT_MAX_FILE_SIZE
    max_pull_bytes: int = DEFAULT_MAX_PULL_BYTES

    def __post_init__(self) -> None:
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
    ) -> Options:
        """Engine options for one pass on ``local`` (``extra``: more exclude patterns, each
        group with the label an error names it by). An invalid pattern raises
        ``PatternError`` (a one-line usage error naming it and where it came from)."""
        rule = ExcludeRule.build(self.exclude, default_excludes=self.default_excludes,
                                 root=local, more=extra)
        return self.pass_options(direction, rule, self.state_path(), log=log,
                                 progress=progress)

    def state_path(self) -> Path:
        """The state dir passes use: ``state_dir`` with ``~`` expanded, else the default."""
        return self.state_dir.expanduser() if self.state_dir else default_state_dir()

    def pass_options(
        self,
        direction: Direction,
        rule: ExcludeRule,
        state_dir: Path,
        *,
        log: Callable[[str], None] | None = None,
        progress: Progress | None = None,
        rename: Rename | None = None,
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
            warn=_warn,
            progress=progress,
            rename=rename,
            idle_timeout=self.idle_timeout,
        )


def _warn(message: str) -> None:
    print(f"filesync: warning: {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Output:
    """What the CLI prints: ``json`` one object on stdout, ``quiet`` less, ``verbose`` more."""

    json: bool = False
    quiet: bool = False
    verbose: int = 0

    def log(self) -> Callable[[str], None] | None:
        """The ``-v`` log (to stderr), or None."""
        if self.verbose and not self.quiet:
            return lambda msg: print(f"filesync: {msg}", file=sys.stderr)
        return None


@dataclass(frozen=True)
class Request:
    """One pass command, fully typed: push, pull, sync, status, resolve or undo.

    Either ``local`` and ``targets`` (LOCAL REMOTE...) or ``config`` (a filesync.toml,
    read when the command runs; ``via`` then overrides the file's). ``keep`` and ``path``
    are resolve's.
    """

    command: str
    settings: PassSettings
    connect: ConnectOptions
    output: Output
    local: Path | None = None
    targets: tuple[Target, ...] = ()
    config: Path | None = None
    via: str | None = None
    path: str = ""
    keep: str = ""

    @property
    def plan_only(self) -> bool:
        """The plan is printed and nothing changes (status, or --dry-run)."""
        return self.command == "status" or self.settings.dry_run


def local_root(text: str, base: Path | None = None, *, files: bool = False) -> Path:
    """LOCAL as an absolute directory (``base``: what a relative one is relative to, else
    the working directory); ``UsageError`` if it names something else than a directory,
    unless ``files``: then anything else is returned with its parent resolved, for the
    session's planner to map as a single file or refuse (``BadMapping``)."""
    root = Path(text).expanduser()
    if base is not None and not root.is_absolute():
        root = base / root
    if (root.exists() or root.is_symlink()) and not root.is_dir():
        if files:
            return root.absolute().parent.resolve() / root.name
        raise UsageError(f"LOCAL {text!r} is not a directory; give the directory to sync "
                         "(push, pull, sync and status also take a single file)")
    return root.resolve()
