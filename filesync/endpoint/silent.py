"""A remote process that may go silent: its pid, and killing it with its group.

Guarantees:

- ``named(command)`` makes the starting shell print ``PID_LINE``, its pid and a newline
  before it runs ``command``; ``pid_line`` reads that line. A command that execs (the
  helper's bootstrap execs python3) keeps the pid, and over SSH it also leads its own
  process group (sshd starts every session's shell with ``setsid``).
- ``kill_remote`` SIGKILLs that process group (or the process alone, where it leads
  none) through a command of its own: a remote that never said hello, or went silent
  later, leaves nothing running on the remote. It is bounded and never raises.
"""

from __future__ import annotations

import asyncio
import contextlib

from filesync.errors import RemoteSilent
from filesync.transport.base import Conduit, RemoteProcess

#: What the starting shell prints first, followed by its pid and a newline.
PID_LINE = b"FILESYNC-PID "
#: How long killing a silent process may take.
KILL_TIMEOUT = 10.0


def named(command: str) -> str:
    """``command``, run by a shell that first names its pid (see ``pid_line``)."""
    return f"echo {PID_LINE.decode()}$$; {command}"


async def pid_line(proc: RemoteProcess) -> tuple[int | None, bytes]:
    """The pid the starting shell printed (``PID_LINE``), or None and the bytes read
    instead (a startup file that prints: the caller reports what the remote said)."""
    line = b""
    while len(line) < len(PID_LINE) + 24 and not line.endswith(b"\n"):
        byte = await proc.read(1)
        if not byte:
            break
        line += byte
        if not PID_LINE.startswith(line[:len(PID_LINE)]):
            return None, line
    digits = line[len(PID_LINE):-1]
    if line.startswith(PID_LINE) and line.endswith(b"\n") and digits.isdigit():
        return int(digits), b""
    return None, line


async def kill_remote(conduit: Conduit, pid: int | None) -> None:
    """Kill a silent remote process and its process group by ``pid``, with a command of
    its own: a signal on the hung channel may never reach it (OpenSSH's client cannot
    send one; a server may refuse it), and a hung process does not notice its pipes
    closing. Never raises."""
    if pid is None or pid <= 1:
        return
    with contextlib.suppress(Exception):
        await asyncio.wait_for(conduit.run(
            f"kill -s KILL -- -{pid} 2>/dev/null || kill -s KILL {pid}"), KILL_TIMEOUT)


def no_hello(conduit: Conduit) -> RemoteSilent:
    """The error for a remote process that never said hello within the idle deadline."""
    idle = getattr(conduit, "idle", None)
    within = f" within {idle:g} s" if isinstance(idle, float) else ""
    return RemoteSilent(
        f"the remote helper never answered{within} (python3 there started but said "
        "nothing: a wrapper that prompts or hangs?); check that python3 runs there "
        "without a terminal, or raise --idle-timeout")
