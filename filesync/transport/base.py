"""The conduit interface every transport implements.

A conduit runs shell commands on the remote side and gives byte pipes to them.
Everything else (listing, sending, fetching, deleting) is the remote helper's
protocol spoken over one such process, so every transport shares one code path.
"""

from __future__ import annotations

import abc
from typing import NamedTuple


class Completed(NamedTuple):
    """Result of a command run to completion.

    A named tuple, not a dataclass: every run imports this module, and creating a
    dataclass costs ~1 ms of CPU (``filesync.core.record``)."""

    returncode: int
    stdout: bytes
    stderr: bytes


class RemoteProcess(abc.ABC):
    """A running remote command. Reads raise ``ConnectionLost`` on a dead pipe."""

    @abc.abstractmethod
    async def write(self, data: bytes) -> None:
        """Write to the process's stdin and wait until the buffer drains."""

    @abc.abstractmethod
    async def write_eof(self) -> None:
        """Close the process's stdin."""

    @abc.abstractmethod
    async def readexactly(self, n: int) -> bytes:
        """Read exactly ``n`` bytes of stdout, or raise ``ConnectionLost``."""

    @abc.abstractmethod
    async def read(self, n: int) -> bytes:
        """Read up to ``n`` bytes of stdout; ``b""`` means end of output."""

    @abc.abstractmethod
    async def read_stderr(self) -> bytes:
        """Return whatever the process wrote to stderr (call after it ended)."""

    @abc.abstractmethod
    async def wait(self) -> int:
        """Wait for the process to end and return its exit status."""

    @abc.abstractmethod
    def kill(self) -> None:
        """Stop the process without waiting."""


class Conduit(abc.ABC):
    """Runs commands on one remote side. One conduit per run, reused for every step."""

    #: Stable identity of the remote side for the state database, such as
    #: ``ssh://user@host:22`` or ``local``.
    identity: str

    @abc.abstractmethod
    async def start(self, command: str) -> RemoteProcess:
        """Start ``command`` (a POSIX shell command line) with piped stdio."""

    async def logged_in(self) -> None:  # noqa: B027 - optional: most conduits log in at once
        """Wait until the connection is up (a login still under way has finished), or
        raise why it failed. A login bounds itself (connect timeout) but may wait for a
        human at a passphrase prompt; the idle deadline starts after it."""

    async def run(self, command: str, stdin: bytes = b"") -> Completed:
        """Run ``command`` to completion and collect its output."""
        proc = await self.start(command)
        if stdin:
            await proc.write(stdin)
        await proc.write_eof()
        chunks: list[bytes] = []
        while chunk := await proc.read(1 << 16):
            chunks.append(chunk)
        code = await proc.wait()
        return Completed(code, b"".join(chunks), await proc.read_stderr())

    @abc.abstractmethod
    async def close(self) -> None:
        """Close the connection. Safe to call twice."""

    @property
    def alive(self) -> bool:
        """False once the conduit is known to be closed or its connection lost."""
        return True

    @property
    def bytes_sent(self) -> int:
        """Payload bytes written to remote processes so far."""
        return 0

    @property
    def bytes_received(self) -> int:
        """Payload bytes read from remote processes so far."""
        return 0
