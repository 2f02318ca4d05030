"""The local conduit: commands run in a local ``sh`` subprocess.

Used for ``file://`` remotes and by the tests, so that the local transport
exercises exactly the helper protocol the SSH transport speaks.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal

from filesync.errors import ConnectionLost
from filesync.transport.base import Conduit, RemoteProcess
from filesync.transport.spawn import Spawn


class SubprocessProcess(RemoteProcess):
    """A remote process backed by a local asyncio subprocess."""

    def __init__(self, proc: asyncio.subprocess.Process, counters: list[int]) -> None:
        self._proc = proc
        self._counters = counters

    async def write(self, data: bytes) -> None:
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(data)
            await self._proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise ConnectionLost(
                f"remote process closed its input ({exc}); rerun to recover"
            ) from exc
        self._counters[0] += len(data)

    async def write_eof(self) -> None:
        assert self._proc.stdin is not None
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self._proc.stdin.close()

    async def readexactly(self, n: int) -> bytes:
        assert self._proc.stdout is not None
        try:
            data = await self._proc.stdout.readexactly(n)
        except asyncio.IncompleteReadError as exc:
            raise ConnectionLost("remote process ended mid-stream; rerun to recover") from exc
        self._counters[1] += n
        return data

    async def read(self, n: int) -> bytes:
        assert self._proc.stdout is not None
        data = await self._proc.stdout.read(n)
        self._counters[1] += len(data)
        return data

    async def read_stderr(self) -> bytes:
        assert self._proc.stderr is not None
        return await self._proc.stderr.read()

    async def wait(self) -> int:
        return await self._proc.wait()

    def kill(self) -> None:
        # The whole group: a grandchild holding the pipes would keep wait() from returning.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, signal.SIGKILL)


def command_argv(prefix: list[str], command: str) -> list[str]:
    """The argv that runs ``command`` (a POSIX shell command line) through ``prefix``.

    A prefix either runs its arguments as they are (``docker exec -i NAME``, ``sudo``,
    ``nsenter``, ``kubectl exec -i POD --``), or joins them with spaces into one line
    that a shell on the far side parses again (``ssh HOST`` hands it to the login shell),
    and filesync cannot tell which. So the arguments are ``sh -c ': ; exec sh -c Q'``
    with ``Q`` the shell-quoted command, which does the same either way:

    - run as they are: ``sh`` runs the script ``: ; exec sh -c Q``, so a second ``sh``
      runs the command (``Q`` loses its quotes in that parse);
    - joined and parsed again: the line is ``sh -c : ; exec sh -c Q``, so the far
      shell runs ``sh -c :`` (nothing), then execs ``sh`` on the command.

    With no prefix the command runs in ``sh -c COMMAND`` directly. The one assumption
    of the joined case is that the far shell parses POSIX quotes and ``;`` (sh, bash,
    dash, ksh, zsh; not csh or fish), as ``ssh HOST 'cmd'`` itself assumes.
    """
    if not prefix:
        return ["sh", "-c", command]
    return [*prefix, "sh", "-c", f": ; exec sh -c {shlex.quote(command)}"]


class CommandConduit(Conduit):
    """Runs each command through ``PREFIX`` (see ``command_argv``), or locally in ``sh``."""

    def __init__(self, prefix: list[str], identity: str, spawn: Spawn | None = None) -> None:
        self._prefix = prefix
        self._spawn = spawn or Spawn()
        self.identity = identity
        self._counters = [0, 0]
        self._procs: list[SubprocessProcess] = []

    async def start(self, command: str) -> RemoteProcess:
        argv = command_argv(self._prefix, command)
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                limit=1 << 20,
                start_new_session=True,
                **self._spawn.kwargs(),
            )
        except OSError as exc:
            raise ConnectionLost(
                f"cannot start {argv[0]!r}: {exc.strerror}; check the command"
            ) from exc
        wrapped = SubprocessProcess(proc, self._counters)
        self._procs.append(wrapped)
        return wrapped

    async def close(self) -> None:
        for proc in self._procs:
            proc.kill()
            with contextlib.suppress(Exception):
                await proc.wait()
        self._procs.clear()

    @property
    def bytes_sent(self) -> int:
        return self._counters[0]

    @property
    def bytes_received(self) -> int:
        return self._counters[1]


def local_conduit(spawn: Spawn | None = None) -> CommandConduit:
    """A conduit that runs commands on this machine (in ``spawn``'s context)."""
    return CommandConduit([], "local", spawn)
