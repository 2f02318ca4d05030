"""The CLI's side of the persistent agent (``--persist``): find or start it, hand it a command.

This module is what a CLI run with ``--persist`` imports instead of the engine, so it uses
the standard library only and never imports asyncio or asyncssh: the whole point is that a
warm run costs an interpreter start plus one local socket round trip, and the agent does
the work on connections it keeps open (see ``filesync.agent`` and docs/design.md).

Wire format on the Unix socket, one JSON object per line. The client sends one request:
``{"op": "run", "argv": [...], "cwd": ..., "env": {...}, "umask": N, "persist": S,
"fingerprint": F}`` (or ``{"op": "status"|"stop"}``). The agent answers with any number of
``{"out": TEXT}`` / ``{"err": TEXT}`` lines and ends with ``{"exit": CODE}``, or with
``{"stale": true}`` when it runs other code than the client (it then exits).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from filesync.errors import FilesyncError

#: How long a client waits for an agent it started to accept connections.
START_TIMEOUT = 10.0


def socket_path() -> Path:
    """The agent's socket: ``$FILESYNC_AGENT_SOCKET``, else one per user in a 0700 dir."""
    explicit = os.environ.get("FILESYNC_AGENT_SOCKET")
    if explicit:
        return Path(explicit)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) / "filesync" if runtime else Path(f"/tmp/filesync-{os.getuid()}")
    return base / "agent.sock"


class NotOurDir(FilesyncError):
    """The agent dir belongs to another user: nothing this user can fix there (a chmod
    needs the owner), so the client warns and runs the command itself."""


def safe_dir(path: Path) -> Path:
    """Create ``path`` 0700, or check an existing one is ours and closed to others.

    The socket accepts commands that read and write the user's files, so its directory
    must not be reachable by another user (the agent also checks each peer's uid). A
    directory of another user (``/tmp/filesync-UID`` made first by someone else) is
    ``NotOurDir``; one of ours that others may enter is a ``FilesyncError`` (chmod it).
    """
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = path.lstat()
    except OSError as exc:
        raise FilesyncError(f"agent dir {path}: {exc.strerror}; set FILESYNC_AGENT_SOCKET "
                            "to a path in a private dir, or drop --persist") from None
    if not os.path.isdir(path) or os.path.islink(path):
        raise FilesyncError(f"agent dir {path} is not a directory; remove it or set "
                            "FILESYNC_AGENT_SOCKET")
    if st.st_uid != os.getuid():
        raise NotOurDir(f"agent dir {path} belongs to another user (uid {st.st_uid}), who "
                        "may have made it to catch your commands; set XDG_RUNTIME_DIR or "
                        "FILESYNC_AGENT_SOCKET to a private place")
    if st.st_mode & 0o077:
        raise FilesyncError(f"agent dir {path} is open to other users (owner uid {st.st_uid}, "
                            f"mode {st.st_mode & 0o777:o}); chmod 700 it, or drop --persist")
    return path


def fingerprint() -> str:
    """Identifies the code a process runs, so a client never talks to an outdated agent."""
    from filesync.version import __version__

    pkg = Path(__file__).parent
    newest = max((p.stat().st_mtime_ns for p in pkg.rglob("*.py")), default=0)
    return f"{__version__}:{newest}:{sys.executable}"


def run_via_agent(argv: list[str], persist: float, verbose: bool) -> int | None:
    """Run ``filesync ARGV`` in the agent, starting it if needed; return its exit code.

    Returns None when no agent could be started, and the caller runs the command itself
    (as ssh does when a ControlMaster cannot be set up); an agent dir of another user says
    so in one warning line first, since no agent can be used until the user moves it.
    """
    path = socket_path()
    try:
        safe_dir(path.parent)
    except NotOurDir as exc:
        print(f"filesync: warning: {exc.message}; running without the agent", file=sys.stderr)
        return None
    request = {"op": "run", "argv": argv, "cwd": os.getcwd(), "env": dict(os.environ),
               "umask": _umask(), "persist": persist, "fingerprint": fingerprint()}
    for _attempt in range(2):
        sock = _connect(path) or _start(path, persist, verbose)
        if sock is None:
            return None
        code = _exchange(sock, request)
        if code is not None:
            return code
        _wait_gone(path)  # it was stale and is exiting: start a current one
    return None


def agent_command(action: str, argv: list[str]) -> int:
    """``filesync agent status|stop``: print what the agent says, exit 0 (1 if none runs)."""
    path = socket_path()
    sock = _connect(path)
    if sock is None:
        print(json.dumps({"running": False}) if "--json" in argv
              else f"no agent is running at {path}")
        return 1 if action == "status" else 0
    with sock:
        _send(sock, {"op": action})
        reply: dict[str, Any] = {"running": True, **next(_replies(sock), {})}
    if "--json" in argv:
        print(json.dumps(reply))
    elif action == "status":
        print(f"agent pid {reply.get('pid')} at {path}: {len(reply.get('conduits', []))} open "
              f"connections, {reply.get('requests')} runs served, exits after "
              f"{reply.get('idle_left', 0):.0f} s idle")
        for label in reply.get("conduits", []):
            print(f"  {label}")
    else:
        print(f"agent pid {reply.get('pid')} stopped")
    return 0


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _connect(path: Path) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
    except OSError:
        sock.close()
        return None
    return sock


def _start(path: Path, persist: float, verbose: bool) -> socket.socket | None:
    """Start an agent in its own session and wait until it accepts connections."""
    log = path.with_suffix(".log")
    with open(log, "ab") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "filesync.agent", str(path), str(persist)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
            start_new_session=True, close_fds=True,
        )
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        sock = _connect(path)
        if sock is not None:
            return sock
        if proc.poll() is not None and proc.returncode != 0:
            break
        time.sleep(0.005)
    if verbose:
        print(f"filesync: the agent did not start (see {log}); running without it",
              file=sys.stderr)
    return None


def _exchange(sock: socket.socket, request: dict[str, Any]) -> int | None:
    """Send the request, relay the output; the exit code, or None if the agent was stale."""
    # A Ctrl-C here closes the socket on its way out; the agent then cancels the run, which
    # stops between journaled steps, as an interrupted CLI does.
    with sock:
        try:
            _send(sock, request)
            for reply in _replies(sock):
                if "out" in reply:
                    sys.stdout.write(reply["out"])
                elif "err" in reply:
                    sys.stderr.write(reply["err"])
                elif "exit" in reply:
                    sys.stdout.flush()
                    return int(reply["exit"])
                elif reply.get("stale"):
                    return None
        except OSError as exc:
            raise FilesyncError(f"lost the agent mid-run ({exc.strerror}); rerun, nothing "
                                "was half-applied") from None
    raise FilesyncError("the agent ended mid-run; rerun (nothing was half-applied), and see "
                        f"{socket_path().with_suffix('.log')} if it happens again")


def _send(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.sendall(json.dumps(message).encode() + b"\n")


def _replies(sock: socket.socket) -> Iterator[dict[str, Any]]:
    with sock.makefile("rb") as lines:
        for line in lines:
            yield json.loads(line)


def _wait_gone(path: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline and path.exists():
        time.sleep(0.005)
