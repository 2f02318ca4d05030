"""What every terminal backend shares: the result type, the session plan, snapshot reading.

A terminal session is planned once from the launch environment (:func:`plan_session`): the env
its children get (HOME mode, sandbox) and a :class:`ShellPlan` holding the shell text that both
the snapshot and every background command run. Nothing here spawns a process, so a local and an
SSH terminal run the same argv lists, locally or joined with :func:`shlex.join` remotely.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from filesync import FilesyncError

from .env import (
    ShellInit,
    background_command,
    first_dirs,
    parse_snapshot,
    snapshot_script,
)
from .home import (
    USER_BUS_VARS,
    child_env,
    home_mode_from_env,
    sandbox_bin_dir,
    sandbox_env,
)

__all__ = [
    "RunResult",
    "SessionPlan",
    "ShellPlan",
    "SnapshotError",
    "default_profile_home",
    "plan_session",
]


@dataclass(frozen=True)
class RunResult:
    """The outcome of one command: exit status (negative: killed by that signal) and output."""

    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


class SnapshotError(FilesyncError):
    """The login shell did not produce an environment snapshot."""


@dataclass(frozen=True)
class ShellPlan:
    """The shell text of a session: same prelude for the snapshot and background commands."""

    launch_path: str
    init_files: tuple[str, ...] = ()
    pin_first: tuple[str, ...] = ()
    unset: tuple[str, ...] = ()

    def snapshot_argv(self) -> list[str]:
        """argv of the one login shell (``bash -l``) whose environment the session keeps."""
        script = snapshot_script(
            self.launch_path, self.init_files, pin_first=self.pin_first, unset=self.unset
        )
        return ["bash", "-l", "-c", script]

    def background_argv(self, cmd: str) -> list[str]:
        """argv of a background command: ``bash -lic '<prelude>\\n<cmd>'``."""
        return background_command(
            cmd, self.launch_path, self.init_files, pin_first=self.pin_first, unset=self.unset
        )

    @staticmethod
    def foreground_argv(cmd: str) -> list[str]:
        """argv of a foreground command; it runs with the snapshot env, so no login shell."""
        return ["bash", "-c", cmd]

    @staticmethod
    def read_snapshot(returncode: int, stdout: bytes, stderr: bytes) -> dict[str, str]:
        """Return the snapshot env from the login shell's raw output, or raise SnapshotError."""
        text = stdout.decode("utf-8", "surrogateescape")
        try:
            env = parse_snapshot(text)
        except ValueError:
            last = (stderr.decode("utf-8", "replace").strip().splitlines() or ["no output"])[-1]
            raise SnapshotError(
                f"login shell exited {returncode} before printing its environment "
                f"(last stderr line: {last}); check the profile and shell_init_files"
            ) from None
        return env


@dataclass(frozen=True)
class SessionPlan:
    """The env of terminal children and the shell text of the session."""

    env: dict[str, str]
    shell: ShellPlan


def default_profile_home(env: Mapping[str, str]) -> Path:
    """``${XDG_STATE_HOME:-$HOME/.local/state}/filesync/home``: persists across sessions."""
    state = env.get("XDG_STATE_HOME") or os.path.join(env.get("HOME", "/"), ".local", "state")
    return Path(state) / "filesync" / "home"


def plan_session(
    base_env: Mapping[str, str],
    *,
    home_mode: str | None,
    profile_home: Path | None,
    in_container: bool,
    init: ShellInit,
    sandbox_dir: Path | None = None,
    overrides: Mapping[str, str] | None = None,
    exists: Callable[[str], bool] = os.path.isfile,
    path_first: Sequence[str] = (),
) -> SessionPlan:
    """Plan a session launched with ``base_env``; creates the profile and sandbox dirs locally.

    The mode is ``home_mode`` or ``$TERMINAL_HOME_MODE`` from ``base_env``. The launch PATH is
    the children's PATH (with the sandbox shim dir pinned in front, then ``path_first``).
    Init files are resolved against the children's HOME, so profile mode sources the
    profile's own dotfiles.
    """
    mode = home_mode_from_env(home_mode, base_env)
    env = child_env(
        base_env,
        mode,
        profile_home=profile_home or default_profile_home(base_env),
        in_container=in_container,
        overrides=overrides,
    )
    pin = tuple(first_dirs(path_first))
    unset: tuple[str, ...] = ()
    if sandbox_dir is not None:
        env = sandbox_env(env, sandbox_dir)
        # The shim must shadow the system crontab whatever the caller put first.
        pin, unset = (str(sandbox_bin_dir(sandbox_dir)), *pin), USER_BUS_VARS
    files = tuple(init.files(env["HOME"], env, exists))
    shell = ShellPlan(env.get("PATH", ""), files, pin, unset)
    return SessionPlan(env, shell)
