"""The persistent agent: runs CLI commands on connections it keeps open, like ControlPersist.

Started by the first ``filesync ... --persist DURATION`` (``python -m filesync.agent SOCKET
SECONDS``), it listens on a Unix socket in a 0700 directory, serves clients of its own uid
only, and exits after DURATION without a request. Each request is a whole command line; the
agent runs it exactly as the CLI would -- same parser, same engine, same state database and
locks, the client's environment, working directory and umask -- but takes its conduits from
a pool keyed by the remote and the connection settings, so a warm run skips the
interpreter's imports, the SSH handshake and the remote helper's start-up.

The client's environment, working directory, umask and output reach the command as
values (``main_in_agent``): the agent never changes its own ``os.environ``, working
directory (``/``, set once at start), umask or ``sys.stdout``/``sys.stderr`` for a request.

Requests are served one at a time. A client that disconnects mid-run (Ctrl-C) cancels its
run; cancelling stops between journaled steps, like ``--timeout``. A connection that died
while idle is noticed on reuse and the job is retried once on a new connection (the
runner's retry policy, ``filesync.session.runner``). The agent owns one ``WarmState`` for
its life (endpoints, state, watched trees, memos), closed when it exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import gc
import json
import os
import socket
import struct
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from filesync.cli.agent_client import fingerprint, safe_dir
from filesync.cli.main import main_in_agent
from filesync.session.runner import EndpointConduits
from filesync.session.terms import WarmState
from filesync.transport.base import Conduit
from filesync.transport.target import ConnectOptions, Target, open_conduit

#: Environment variables that decide how a connection is made; part of the pool key.
_CONNECT_ENV = ("HOME", "USER", "LOGNAME", "SSH_AUTH_SOCK", "PATH", "XDG_RUNTIME_DIR",
                "FILESYNC_SSH_CLIENT")


class KeptConduits(EndpointConduits):
    """Conduits kept open between commands, one per (remote, connection settings), with
    their endpoints in the agent's warm state."""

    def __init__(self, warm: WarmState) -> None:
        super().__init__(warm)
        self._open: dict[tuple[Any, ...], Conduit] = {}
        self.opened = 0

    @staticmethod
    def key(target: Target, opts: ConnectOptions) -> tuple[Any, ...]:
        spawn = opts.spawn
        env: tuple[Any, ...] = tuple(spawn.environ.get(name) for name in _CONNECT_ENV)
        if target.kind != "ssh":
            # Its commands run here, with the whole context: a conduit per context.
            env = (tuple(sorted(spawn.environ.items())), spawn.cwd, spawn.umask)
        files = tuple(str(p.resolve()) if p else None for p in (opts.ssh_config, opts.identity))
        return (target.kind, target.host, target.user, target.port, target.via, files,
                opts.accept_new_host_key, opts.ssh_client, env)

    async def acquire(self, target: Target, opts: ConnectOptions) -> tuple[Conduit, bool]:
        key = self.key(target, opts)
        kept = self._open.get(key)
        if kept is not None and kept.alive:
            return kept, True
        if kept is not None:
            await self._discard(key, kept)
        conduit = await open_conduit(target, opts)
        self.opened += 1
        self._open[key] = conduit
        return conduit, False

    async def release(self, conduit: Conduit, healthy: bool) -> None:
        if healthy and conduit.alive:
            return  # kept, with its endpoint, for the next command
        for key, kept in list(self._open.items()):
            if kept is conduit:
                await self._discard(key, kept)
                return
        await super().release(conduit, False)

    async def _discard(self, key: tuple[Any, ...], conduit: Conduit) -> None:
        del self._open[key]
        await self.end(conduit, False)
        await conduit.close()

    def labels(self) -> list[str]:
        return [conduit.identity for conduit in self._open.values()]

    async def close_all(self) -> None:
        for key, conduit in list(self._open.items()):
            del self._open[key]
            with contextlib.suppress(Exception):
                await self.end(conduit, True)
                await conduit.close()


class RelaySink:
    """A request's output sink: what its command prints goes to its client, line-framed
    (``{"out": TEXT}``, ``{"err": TEXT}``). Never a terminal: no progress bars through
    the agent."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer

    def _send(self, field: str, text: str) -> None:
        if text and not self._writer.is_closing():
            self._writer.write(json.dumps({field: text}).encode() + b"\n")

    def out(self, text: str) -> None:
        self._send("out", text)

    def err(self, text: str) -> None:
        self._send("err", text)

    def terminal(self) -> bool:
        return False


class Agent:
    """The server: one listening socket, the conduit pool, the idle deadline."""

    def __init__(self, path: Path, persist: float) -> None:
        self.path = path
        self.persist = persist
        #: What the agent keeps warm for its life (watched trees, state, memos,
        #: endpoints): its runs are the passes of one owner.
        self.warm = WarmState(watch=True)
        self.conduits = KeptConduits(self.warm)
        self.requests = 0
        self._busy = asyncio.Lock()
        self._deadline = time.monotonic() + persist
        self._stop = asyncio.Event()
        self._fingerprint = fingerprint()

    async def serve(self) -> None:
        server = await asyncio.start_unix_server(self._client, str(self.path), limit=1 << 26)
        os.chmod(self.path, 0o600)
        try:
            while not self._stop.is_set():
                left = self._deadline - time.monotonic()
                if left <= 0 and not self._busy.locked():
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), max(left, 0.05))
        finally:
            server.close()
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            async with self._busy:
                try:
                    await self.conduits.close_all()
                finally:
                    await self.warm.close()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if not _same_user(writer.get_extra_info("socket")):
                return
            line = await reader.readline()
            if not line:
                return
            request = json.loads(line)
            reply = await self._answer(request, reader, writer)
            writer.write(json.dumps(reply).encode() + b"\n")
            await writer.drain()
        except (ConnectionError, ValueError):
            pass  # the client went away, or spoke nonsense: nothing to answer
        finally:
            writer.close()

    async def _answer(self, request: dict[str, Any], reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> dict[str, Any]:
        op = request.get("op")
        if op == "status":
            return {"pid": os.getpid(), "conduits": self.conduits.labels(),
                    "opened": self.conduits.opened, "requests": self.requests,
                    "idle_left": max(0.0, self._deadline - time.monotonic())}
        if op == "stop" or request.get("fingerprint") != self._fingerprint:
            self._stop.set()
            return {"pid": os.getpid()} if op == "stop" else {"stale": True}
        async with self._busy:
            self.requests += 1
            code = await self._run(request, reader, writer)
            self.persist = float(request.get("persist") or self.persist)
            self._deadline = time.monotonic() + self.persist
            _give_back_memory()
        return {"exit": code}

    async def _run(self, request: dict[str, Any], reader: asyncio.StreamReader,
                   writer: asyncio.StreamWriter) -> int:
        """Run one command line in the client's context (given to it as values); a
        hang-up cancels it."""
        sink = RelaySink(writer)
        env: Mapping[str, str] = dict(request.get("env") or {})
        task = asyncio.ensure_future(main_in_agent(
            request["argv"], self.conduits, env=env, cwd=str(request["cwd"]),
            umask=int(request.get("umask", 0o022)), sink=sink))
        hangup = asyncio.ensure_future(reader.read())  # b"" once the client is gone
        await asyncio.wait({task, hangup}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            task.cancel()
        hangup.cancel()
        try:
            return await task
        except asyncio.CancelledError:
            return 130
        except Exception as exc:  # a bug: the client gets one line, the agent lives on
            sink.err(f"filesync: error: internal error in the agent: {exc!r}\n")
            return 1


def _give_back_memory() -> None:
    """Return a big run's freed heap to the system: the agent lives on after a 100k-file
    pass, and its idle footprint should be its connections, not that pass's high-water mark."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)  # glibc; elsewhere the lookup fails harmlessly


def _same_user(sock: socket.socket | None) -> bool:
    """True if the peer runs as our uid (SO_PEERCRED: pid, uid, gid)."""
    if sock is None:
        return False
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return bool(uid == os.getuid())


def _lock(path: Path) -> int | None:
    """Hold ``SOCKET.lock`` for life: one agent per socket, even when two start at once."""
    fd = os.open(path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    deadline = time.monotonic() + 5.0
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                return None
            time.sleep(0.01)


def main(argv: list[str]) -> int:
    """``python -m filesync.agent SOCKET SECONDS``: serve until idle for SECONDS."""
    path, persist = Path(argv[0]), float(argv[1])
    safe_dir(path.parent)
    if _lock(path) is None:
        return 0  # another agent serves this socket
    if path.exists() or path.is_symlink():
        path.unlink()  # left by an agent that was killed
    # Once, as a daemon does: its own files private, whatever the first client's umask
    # was; each request's files get that request's umask, given to it as a value.
    os.chdir("/")
    os.umask(0o077)
    asyncio.run(Agent(path, persist).serve())
    return 0

