"""A terminal on this machine: one login-shell env snapshot per session, then plain ``bash -c``."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
from collections.abc import Mapping, Sequence
from types import TracebackType

from ._paths import StrPath, local_path, optional_local_path
from ._session import RunResult, SessionPlan, ShellPlan, plan_session
from .env import ShellInit, first_dirs
from .home import detect_container

__all__ = ["BackgroundProcess", "LocalTerminal"]

_Output = tuple[bytes, bytes]


def _decode(data: bytes) -> str:
    # Command output is shown to a model or a person: a bad byte must not raise.
    return data.decode("utf-8", "replace")


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    # Every child runs in its own session, so the group holds whatever the command forked too.
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def _resolve(program: str, env: Mapping[str, str]) -> str:
    # The children's PATH may lack bash (e.g. an env= without PATH): fall back to ours.
    return shutil.which(program, path=env.get("PATH", "")) or shutil.which(program) or program


class BackgroundProcess:
    """A command started by :meth:`LocalTerminal.spawn`; its output is drained as it runs."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self._proc = proc
        # Draining from the start keeps a chatty command from blocking on a full pipe.
        self._output: asyncio.Task[_Output] = asyncio.ensure_future(proc.communicate())

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        """None while running; afterwards the exit status (negative: killed by that signal)."""
        return self._proc.returncode

    async def wait(self) -> RunResult:
        """Wait for the command to end; return its status and all of its output."""
        out, err = await asyncio.shield(self._output)
        return RunResult(self._proc.returncode or 0, _decode(out), _decode(err))

    def kill(self) -> None:
        """SIGKILL the command's whole process group (no-op once it has ended)."""
        _kill_group(self._proc)


class LocalTerminal:
    """A local terminal session; use as ``async with LocalTerminal(...) as t``.

    On enter, one login shell (``bash -l``) sources the init files, restores the launch PATH
    and prints its environment: that snapshot is the env of every :meth:`run`. The launch
    environment is ``env`` or, when None, this process's environment. ``home_mode`` None means
    ``$TERMINAL_HOME_MODE`` from that environment, else ``auto``. ``env_overrides`` are values the
    caller sets explicitly (e.g. TMPDIR); they win over HOME-mode rules. ``sandbox_dir`` turns on
    the eval sandbox (crontab shim first on PATH, user-bus variables removed); pair it with
    ``home_mode="profile"``. ``path_first``: directories put first on PATH after the
    profile ran, in order, each once (the launcher's venv ``bin``, ``~/.local/bin``), for
    foreground and background commands alike. ``in_container`` None means detect. Path parameters
    (``profile_home``, ``sandbox_dir``, ``cwd``) take ``str`` or ``os.PathLike[str]`` and expand
    ``~`` like :func:`os.path.expanduser`.
    """

    def __init__(
        self,
        home_mode: str | None = None,
        profile_home: StrPath | None = None,
        shell_init_files: Sequence[str] | None = None,
        auto_source_bashrc: bool = True,
        sandbox_dir: StrPath | None = None,
        env: Mapping[str, str] | None = None,
        *,
        cwd: StrPath | None = None,
        in_container: bool | None = None,
        env_overrides: Mapping[str, str] | None = None,
        path_first: Sequence[StrPath] = (),
    ) -> None:
        self._home_mode = home_mode
        self._profile_home = optional_local_path(profile_home)
        self._init = ShellInit(auto_source_bashrc, shell_init_files)
        self._sandbox_dir = optional_local_path(sandbox_dir)
        self._launch_env = dict(os.environ if env is None else env)
        self._cwd = optional_local_path(cwd)
        self._in_container = in_container
        self._overrides = dict(env_overrides or {})
        self._path_first = first_dirs(str(local_path(d)) for d in path_first)
        self._plan: SessionPlan | None = None
        self._snapshot: dict[str, str] | None = None
        self._background: list[BackgroundProcess] = []

    async def __aenter__(self) -> LocalTerminal:
        in_container = detect_container() if self._in_container is None else self._in_container
        plan = plan_session(
            self._launch_env,
            home_mode=self._home_mode,
            profile_home=self._profile_home,
            in_container=in_container,
            init=self._init,
            sandbox_dir=self._sandbox_dir,
            overrides=self._overrides,
            path_first=self._path_first,
        )
        argv = plan.shell.snapshot_argv()
        code, out, err = await self._exec(argv, plan.env, self._cwd, None)
        self._snapshot = ShellPlan.read_snapshot(code, out, err)
        self._plan = plan
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Kill background commands still running, so none outlives the session."""
        for proc in self._background:
            proc.kill()
        for proc in self._background:
            await proc.wait()
        self._background.clear()

    @property
    def env(self) -> dict[str, str]:
        """A copy of the session's snapshot env (what :meth:`run` commands get)."""
        return dict(self._require()[1])

    @property
    def plan(self) -> SessionPlan:
        """The session plan: children's env before the login shell, and the shell text."""
        return self._require()[0]

    async def run(
        self,
        cmd: str,
        *,
        cwd: StrPath | None = None,
        input: str | None = None,
    ) -> RunResult:
        """Run ``cmd`` with ``bash -c`` in the snapshot env and wait for it.

        ``cwd`` defaults to the terminal's ``cwd``, else this process's. Cancelling the call
        kills the command's process group.
        """
        _, snapshot = self._require()
        data = None if input is None else input.encode()
        argv = ShellPlan.foreground_argv(cmd)
        where = optional_local_path(cwd) or self._cwd
        code, out, err = await self._exec(argv, snapshot, where, data)
        return RunResult(code, _decode(out), _decode(err))

    async def spawn(
        self, cmd: str, *, cwd: StrPath | None = None
    ) -> BackgroundProcess:
        """Start ``cmd`` in the background as ``bash -lic '<prelude>\\n<cmd>'``.

        It gets the children's env and the same prelude as the snapshot (init files, PATH
        restore), so it finds the same tools as :meth:`run`. Stdin is /dev/null.
        """
        plan, _ = self._require()
        argv = plan.shell.background_argv(cmd)
        proc = await self._start(argv, plan.env, optional_local_path(cwd) or self._cwd)
        handle = BackgroundProcess(proc)
        self._background.append(handle)
        return handle

    def _require(self) -> tuple[SessionPlan, dict[str, str]]:
        if self._plan is None or self._snapshot is None:
            raise RuntimeError("LocalTerminal is used outside `async with`")
        return self._plan, self._snapshot

    @staticmethod
    async def _start(
        argv: list[str],
        env: Mapping[str, str],
        cwd: str | os.PathLike[str] | None,
        with_stdin: bool = False,
    ) -> asyncio.subprocess.Process:
        pipe, devnull = asyncio.subprocess.PIPE, asyncio.subprocess.DEVNULL
        return await asyncio.create_subprocess_exec(
            _resolve(argv[0], env),
            *argv[1:],
            env=dict(env),
            cwd=cwd,
            stdin=pipe if with_stdin else devnull,
            stdout=pipe,
            stderr=pipe,
            start_new_session=True,
        )

    async def _exec(
        self,
        argv: list[str],
        env: Mapping[str, str],
        cwd: str | os.PathLike[str] | None,
        data: bytes | None,
    ) -> tuple[int, bytes, bytes]:
        proc = await self._start(argv, env, cwd, with_stdin=data is not None)
        try:
            out, err = await proc.communicate(data)
        except BaseException:
            _kill_group(proc)
            await proc.wait()
            raise
        return proc.returncode or 0, out, err
