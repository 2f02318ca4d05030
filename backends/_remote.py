"""Remote commands of an SSH terminal: each one killable, none outliving the terminal.

Every command runs as ``printf <pid record>; exec env [-i] FILESYNC_TERMINAL=<tag> ...``:

* sshd starts the shell of each exec channel as a session leader, so the pid it prints is
  the process group of the command and of everything it forks (a plain ``cmd &`` included);
* the tag, ``<terminal>.<n>`` in the environment, marks the processes that left the group
  (``setsid``), as long as they keep their environment.

Killing a command SIGKILLs its process group and every process carrying its tag, over a
second channel of the same connection. A ``run`` that is cancelled (or timed out through
``asyncio.wait_for``) kills its command before the cancellation goes on. :meth:`Commands.close`
kills every command still running and every process carrying the terminal's tag, whether it
was started in the background or not. The group of a command already waited for is not
signalled (its number may belong to someone else by then): what it left behind goes by its
tag, so only a leftover that also dropped its environment escapes. This needs the
connection: after a lost connection nothing can reach the remote processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from filesync import Conduit, FilesyncError, RemoteProcess

__all__ = ["TAG_VAR", "Commands", "Completed", "Tracked"]

log = logging.getLogger(__name__)

#: The environment variable holding a command's tag; never part of a terminal's env.
TAG_VAR = "FILESYNC_TERMINAL"

# Printed before the command: noise a ~/.bashrc prints for sshd's shell comes before it.
_PID_RECORD = re.compile(rb"\0__FILESYNC_PID_5c1e__ ([0-9]+)\0")
_PID_PRINTF = "printf '\\000__FILESYNC_PID_5c1e__ %s\\000' \"$$\""


@dataclass(frozen=True)
class Completed:
    """Exit status and raw output of a remote command (negative status: killed by a signal)."""

    returncode: int
    stdout: bytes
    stderr: bytes


class Tracked:
    """One command started by :class:`Commands`: its process, tag and process group."""

    def __init__(self, proc: RemoteProcess, tag: str) -> None:
        self.proc = proc
        self.tag = tag
        self.pgid: int | None = None
        self.ended = False
        self._head = b""  # stdout read while looking for the pid record

    async def read_pid(self) -> None:
        """Read up to and including the pid record; output before it stays stdout."""
        buf = b""
        while (found := _PID_RECORD.search(buf)) is None:
            chunk = await self.proc.read(1 << 16)
            if not chunk:
                self._head = buf
                return
            buf += chunk
        self.pgid = int(found.group(1))
        self._head = buf[: found.start()] + buf[found.end():]

    async def complete(self, stdin: bytes = b"") -> Completed:
        """Send ``stdin``, close it, read all output and wait for the end."""
        if stdin:
            await self.proc.write(stdin)
        await self.proc.write_eof()
        chunks = [self._head]
        while chunk := await self.proc.read(1 << 16):
            chunks.append(chunk)
        code = await self.proc.wait()
        self.ended = True
        return Completed(code, b"".join(chunks), await self.proc.read_stderr())


class Commands:
    """The commands of one terminal over one conduit; see the module docstring."""

    def __init__(self, conduit: Conduit) -> None:
        self._conduit = conduit
        self._terminal = secrets.token_hex(8)
        self._count = 0
        self._started: list[Tracked] = []
        self._kills: set[asyncio.Task[None]] = set()

    def command_line(self, tag: str, argv: Sequence[str], env: Mapping[str, str] | None) -> str:
        """The shell line that prints the pid record and execs ``argv`` tagged.

        ``env`` None: ``argv`` inherits the session's environment; else it gets exactly ``env``.
        """
        assignments = [] if env is None else [
            f"{k}={v}" for k, v in sorted(env.items()) if "=" not in k and k != TAG_VAR]
        words = ["env", *([] if env is None else ["-i"]), *assignments, f"{TAG_VAR}={tag}", *argv]
        return f"{_PID_PRINTF}; exec {shlex.join(words)}"

    async def start(self, argv: Sequence[str], env: Mapping[str, str] | None) -> Tracked:
        """Start ``argv`` (with ``env``, see :meth:`command_line`) and read its pid record."""
        self._count += 1
        tag = f"{self._terminal}.{self._count}"
        # A long session runs many commands: only the unfinished ones need a group kill.
        self._started = [t for t in self._started if not t.ended]
        proc = await self._conduit.start(self.command_line(tag, argv, env))
        tracked = Tracked(proc, tag)
        self._started.append(tracked)
        try:
            await tracked.read_pid()
        except BaseException:
            await self._kill_shielded(tracked)
            raise
        return tracked

    async def run(
        self, argv: Sequence[str], env: Mapping[str, str] | None, stdin: bytes = b""
    ) -> Completed:
        """Run ``argv`` to completion; cancelled, it kills the command before re-raising."""
        tracked = await self.start(argv, env)
        try:
            return await tracked.complete(stdin)
        except BaseException:
            await self._kill_shielded(tracked)
            raise

    def kill_soon(self, tracked: Tracked) -> None:
        """Start killing ``tracked`` without waiting; :meth:`close` waits for it."""
        self._spawn_kill(tracked)

    async def kill(self, tracked: Tracked) -> None:
        """SIGKILL ``tracked``'s process group and every process carrying its tag."""
        groups = [] if tracked.pgid is None or tracked.ended else [tracked.pgid]
        await self._sweep(groups, f"^{TAG_VAR}={re.escape(tracked.tag)}$")
        tracked.proc.kill()

    async def close(self) -> None:
        """Kill every command still running and every process with the terminal's tag."""
        if self._kills:
            await asyncio.gather(*self._kills, return_exceptions=True)
        groups = [t.pgid for t in self._started if t.pgid is not None and not t.ended]
        await self._sweep(groups, f"^{TAG_VAR}={self._terminal}\\.")
        for tracked in self._started:
            if not tracked.ended:
                tracked.proc.kill()
        self._started.clear()

    def _spawn_kill(self, tracked: Tracked) -> asyncio.Task[None]:
        task = asyncio.ensure_future(self._kill_logged(tracked))
        self._kills.add(task)
        task.add_done_callback(self._kills.discard)
        return task

    async def _kill_shielded(self, tracked: Tracked) -> None:
        # A second cancellation must not stop the kill half-way: it goes on as a task.
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(self._spawn_kill(tracked))

    async def _kill_logged(self, tracked: Tracked) -> None:
        try:
            await self.kill(tracked)
        except FilesyncError as exc:
            log.warning("could not kill remote command %s: %s", tracked.tag, exc)

    async def _sweep(self, groups: Sequence[int], pattern: str) -> None:
        # Groups first (one atomic signal each), then whatever still carries the tag. The
        # sweep reads environments, never command lines, so it cannot match itself.
        script = "".join(f"kill -s KILL -- -{g} 2>/dev/null; " for g in groups)
        script += (
            "for f in /proc/[0-9]*/environ; do "
            f"grep -qz -- {shlex.quote(pattern)} \"$f\" 2>/dev/null || continue; "
            'p=${f#/proc/}; kill -s KILL "${p%/environ}" 2>/dev/null; '
            "done; true"
        )
        await self._conduit.run(script)
