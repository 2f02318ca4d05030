"""Helpers of the session tests: conduits that count or hold their commands, doc blocks."""

from __future__ import annotations

import asyncio
import re
import threading
from pathlib import Path

from filesync.transport.base import Conduit, RemoteProcess
from filesync.transport.local import local_conduit

DOCS = Path(__file__).resolve().parents[2] / "docs" / "library.md"


def doc_blocks() -> list[str]:
    """The python code blocks of docs/library.md, in order."""
    return re.findall(r"```python\n(.*?)```", DOCS.read_text(encoding="utf-8"), re.S)


class Gated(RemoteProcess):
    """A process whose output is held while its conduit's gate is closed."""

    def __init__(self, inner: RemoteProcess, owner: Wrapped) -> None:
        self.inner, self.owner = inner, owner

    async def write(self, data: bytes) -> None:
        await self.inner.write(data)

    async def write_eof(self) -> None:
        await self.inner.write_eof()

    async def readexactly(self, n: int) -> bytes:
        await self.owner.hold()
        return await self.inner.readexactly(n)

    async def read(self, n: int) -> bytes:
        await self.owner.hold()
        return await self.inner.read(n)

    async def read_stderr(self) -> bytes:
        return await self.inner.read_stderr()

    async def wait(self) -> int:
        return await self.inner.wait()

    def kill(self) -> None:
        self.inner.kill()


class Wrapped(Conduit):
    """The local conduit, with a gate that (while closed) holds every start and read."""

    def __init__(self) -> None:
        self.inner = local_conduit()
        self.identity = self.inner.identity
        self.gate = threading.Event()
        self.gate.set()
        self.waiting = threading.Event()  # set when a start is held at the gate
        self.closed = False
        #: every command started on the remote side, in order
        self.commands: list[str] = []

    async def hold(self) -> None:
        if not self.gate.is_set():
            self.waiting.set()
            await asyncio.get_running_loop().run_in_executor(None, self.gate.wait)

    async def start(self, command: str) -> RemoteProcess:
        await self.hold()
        self.commands.append(command)
        return Gated(await self.inner.start(command), self)

    async def close(self) -> None:
        self.closed = True
        await self.inner.close()

    @property
    def alive(self) -> bool:
        return not self.closed


class Factory:
    """A conduit factory that counts what it opened."""

    def __init__(self) -> None:
        self.opened: list[Wrapped] = []

    async def __call__(self) -> Conduit:
        conduit = Wrapped()
        self.opened.append(conduit)
        return conduit
