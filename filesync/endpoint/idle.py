"""The idle deadline: a remote that owes bytes and sends nothing for too long is hung.

``IdleConduit`` wraps the conduit an endpoint runs on. Starting a process (once the
login is done) gets ``idle`` seconds; every process it starts is an ``IdleProcess``,
whose reads (the remote owes a reply, a frame of a fetch, a command's output, its exit
status) and writes (the remote owes reading what it was sent) each get
``idle`` seconds. A read waits for at most ``SLICE`` bytes at a time, so the deadline
measures silence, not how long a big frame takes on a slow link: a link that moves less
than ``SLICE`` bytes in ``idle`` seconds counts as silent. A write is one buffer of at
most 1 MiB (``filesync.tree.wire.CHUNK``), bounded whole.

When the deadline passes the process is killed (over SSH: the server is asked to SIGKILL
the command, where the client can ask that, and its channel is closed; the helper
endpoint then also kills it, with its process group, by the pid its starting shell
named, through a command of its own) and ``RemoteSilent`` is raised;
the pass stops there, between journaled steps, like any lost connection. The helper
(``filesync.tree.server``) sends keepalive frames while it works, so slow honest work
never trips the deadline; the POSIX fallback's commands (find, tar, sh) produce output
as they go or finish, so a command silent for the whole deadline is taken as hung.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable
from typing import TypeVar

from filesync.errors import RemoteSilent
from filesync.transport.base import Conduit, RemoteProcess

#: The default deadline (seconds), the CLI's ``--idle-timeout`` and the library's.
IDLE_TIMEOUT = 60.0
#: Largest read waited for in one piece (see the module docstring).
SLICE = 1 << 16

_T = TypeVar("_T")


def check_idle_timeout(value: object) -> float:
    """``value`` as a deadline in seconds; ``ValueError`` unless it is a finite number > 0.

    0 is refused rather than meaning "none": a run without a deadline is the hang this
    guards against. A caller that means to wait very long gives a very large number.
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
        math.isfinite(value) and value > 0
    ):
        raise ValueError(f"idle_timeout must be a number of seconds > 0, not {value!r}")
    return float(value)


def silent_message(idle: float) -> str:
    return (f"the remote sent nothing for {idle:g} s while it owed a reply; check the "
            "remote (load, a hung filesystem) or raise --idle-timeout")


class IdleProcess(RemoteProcess):
    """A remote process whose every wait is bounded by its conduit's ``idle``."""

    def __init__(self, proc: RemoteProcess, owner: IdleConduit) -> None:
        self._proc = proc
        self._owner = owner
        #: set once the deadline passed: the process is taken as hung (``RemoteSilent``)
        self.silent = False

    async def _bounded(self, step: Awaitable[_T]) -> _T:
        idle = self._owner.idle
        try:
            async with asyncio.timeout(idle):
                return await step
        except TimeoutError:
            # The stream is mid-frame and the remote is hung: nothing can resume it.
            self.silent = True
            self._proc.kill()
            raise RemoteSilent(silent_message(idle)) from None

    async def write(self, data: bytes) -> None:
        await self._bounded(self._proc.write(data))

    async def write_eof(self) -> None:
        await self._bounded(self._proc.write_eof())

    async def readexactly(self, n: int) -> bytes:
        if n <= SLICE:
            return await self._bounded(self._proc.readexactly(n))
        pieces = []
        left = n
        while left:
            piece = await self._bounded(self._proc.readexactly(min(left, SLICE)))
            pieces.append(piece)
            left -= len(piece)
        return b"".join(pieces)

    async def read(self, n: int) -> bytes:
        return await self._bounded(self._proc.read(n))

    async def read_stderr(self) -> bytes:
        return await self._bounded(self._proc.read_stderr())

    async def wait(self) -> int:
        return await self._bounded(self._proc.wait())

    def kill(self) -> None:
        self._proc.kill()


class IdleConduit(Conduit):
    """``conduit`` with the idle deadline on every process it starts; ``idle`` may be
    changed between passes (a session outlives one pass)."""

    def __init__(self, conduit: Conduit, idle: float = IDLE_TIMEOUT) -> None:
        self.inner = conduit
        self.identity = conduit.identity
        self.idle = check_idle_timeout(idle)

    async def start(self, command: str) -> RemoteProcess:
        # The login first, unbounded here (see ``Conduit.logged_in``); then starting the
        # command is a wait like any other (a channel the server never confirms).
        await self.inner.logged_in()
        try:
            async with asyncio.timeout(self.idle):
                proc = await self.inner.start(command)
        except TimeoutError:
            raise RemoteSilent(silent_message(self.idle)) from None
        return IdleProcess(proc, self)

    async def logged_in(self) -> None:
        await self.inner.logged_in()

    async def close(self) -> None:
        await self.inner.close()

    @property
    def alive(self) -> bool:
        return self.inner.alive

    @property
    def bytes_sent(self) -> int:
        return self.inner.bytes_sent

    @property
    def bytes_received(self) -> int:
        return self.inner.bytes_received
