"""The OpenSSH conduit: every command is one ``ssh`` process over one shared connection.

Guarantees:

- The user's OpenSSH setup applies, all of it (``~/.ssh/config`` with Include, Match exec,
  ProxyJump, certificates, KnownHostsCommand, agents ...), because ``ssh`` itself makes the
  connection. filesync passes ``-F``, ``-i``, ``-l`` and ``-p`` when given and otherwise
  sets an option only where the user's config (read with ``ssh -G``, which opens no
  connection) leaves a gap, or where it must (listed in docs/ssh.md).
- One login per conduit: the first step starts a ControlMaster (``-M -N -f``) whose socket
  lives in a private 0700 directory; every ``start()`` is an ``ssh`` client riding it
  (``-T -e none -x``: no pty, no escape character, a binary-clean stream). If the user's
  config already points at a running master (``ControlPath`` + ``ssh -O check``), the
  conduit rides that one and leaves it running. ``close()`` ends filesync's own master
  (SIGTERM: what ``ssh -O exit`` does, without spawning a client for it); should
  filesync die instead, the master exits by itself once idle for ``_IDLE_PERSIST``
  seconds. The login may have been started earlier by ``begin`` (``openssh_login``),
  which ``connect`` takes over.
- Host keys: an unknown key is refused (``StrictHostKeyChecking ask`` becomes ``yes``,
  so ssh never asks mid-run), ``--accept-new-host-key`` is ``accept-new``, a changed key
  is always refused. Every failure to connect is one ``TransportError`` line with the
  cause and the fix (see ``openssh_errors``).
- Prompts: ssh may ask for a passphrase on the terminal when there is one (BatchMode is
  never forced); without a terminal it cannot, and the error says to use ``ssh-add``.
- A dropped connection makes reads, writes and ``wait()`` raise ``ConnectionLost``, and
  ``start()`` refuses once the master is gone (no silent second login mid-run).

Standard library only: neither asyncssh nor cryptography is imported on this path.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from filesync.errors import ConnectionLost, TransportError
from filesync.transport.base import Conduit, RemoteProcess
from filesync.transport.ssh import openssh_errors
from filesync.transport.ssh.openssh_login import (
    _GRACE,
    CLIENTS,
    ENV_CLIENT,
    Pending,
    Resolved,
    _base_args,
    _context,
    _find_master,
    _Key,
    _Master,
    _pid_alive,
    _resolve_timeout,
    _resolved,
    _spawn_master,
    _take,
    _which_ssh,
    begin,
    choose_client,
)

__all__ = ["CLIENTS", "ENV_CLIENT", "OpenSshConduit", "Pending", "begin", "choose_client",
           "connect"]

_STDERR_KEEP = 1 << 20
_MASTER_LOG_KEEP = 1 << 20
#: A transfer this large widens its pipe to ``_PIPE_SIZE`` (one whole data frame): ssh and
#: filesync then move a frame in one system call each instead of sixteen 64 KiB rounds
#: (1 GiB push: -15 % wall time with the helper's own pipes widened too). Only pipes that
#: carry bulk data grow: the kernel counts every pipe's size against a per-user budget,
#: and a terminal's many small commands must not spend it.
_BULK = 256 << 10
_PIPE_SIZE = 1 << 20


def _widen(pipe: object) -> None:
    """Grow ``pipe`` (an asyncio pipe transport) to ``_PIPE_SIZE``; best effort (Linux
    only, and within the user's pipe budget)."""
    setsize = getattr(fcntl, "F_SETPIPE_SZ", None)
    get = getattr(pipe, "get_extra_info", None)
    raw = get("pipe") if get is not None else None
    if setsize is not None and raw is not None:
        with contextlib.suppress(OSError, ValueError):
            fcntl.fcntl(raw.fileno(), setsize, _PIPE_SIZE)


# --------------------------------------------------------------------------- processes


class OpenSshProcess(RemoteProcess):
    """One ``ssh HOST COMMAND`` client riding the conduit's master."""

    def __init__(self, proc: asyncio.subprocess.Process, conduit: OpenSshConduit) -> None:
        self._proc = proc
        self._conduit = conduit
        self._stderr = bytearray()
        self._stderr_task = asyncio.ensure_future(self._drain_stderr())
        self._wide_in = self._wide_out = False

    async def _drain_stderr(self) -> None:
        # An unread stderr pipe would fill up and stall the remote command.
        assert self._proc.stderr is not None
        with contextlib.suppress(Exception):
            while chunk := await self._proc.stderr.read(1 << 16):
                self._stderr += chunk
                if len(self._stderr) > _STDERR_KEEP:
                    del self._stderr[: len(self._stderr) - _STDERR_KEEP]

    async def write(self, data: bytes) -> None:
        assert self._proc.stdin is not None
        if len(data) >= _BULK and not self._wide_in:
            self._wide_in = True
            _widen(self._proc.stdin.transport)
        try:
            self._proc.stdin.write(data)
            await self._proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise await self._lost("stopped reading its input") from exc
        self._conduit._sent += len(data)

    async def write_eof(self) -> None:
        assert self._proc.stdin is not None
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self._proc.stdin.close()

    async def readexactly(self, n: int) -> bytes:
        assert self._proc.stdout is not None
        if n >= _BULK and not self._wide_out:
            self._wide_out = True
            transport = getattr(self._proc, "_transport", None)  # no public way to it
            _widen(transport.get_pipe_transport(1) if transport is not None else None)
        try:
            data = await self._proc.stdout.readexactly(n)
        except asyncio.IncompleteReadError as exc:
            raise await self._lost("ended mid-stream") from exc
        self._conduit._received += n
        return data

    async def read(self, n: int) -> bytes:
        assert self._proc.stdout is not None
        data = await self._proc.stdout.read(n)
        if not data:
            # EOF from a dropped connection is no end of output: say so, as asyncssh does.
            with contextlib.suppress(TimeoutError):
                code = await asyncio.wait_for(self._proc.wait(), _GRACE)
                if code == 255 and await self._conduit._master_gone():
                    raise await self._conduit._lost("ended mid-stream")
        self._conduit._received += len(data)
        return data

    async def read_stderr(self) -> bytes:
        await self._stderr_task
        return bytes(self._stderr)

    async def wait(self) -> int:
        code = await self._proc.wait()
        if code == 255 and await self._conduit._master_gone():
            raise await self._lost("ended without an exit status")
        return code

    def kill(self) -> None:
        # The client only: the master then closes the channel, which ends the remote command.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, signal.SIGKILL)

    async def _lost(self, what: str) -> ConnectionLost:
        # The client may see its stream break before the master, whose connection broke,
        # has exited: let both settle before telling a lost connection from a dead command.
        with contextlib.suppress(TimeoutError):
            if await asyncio.wait_for(self._proc.wait(), _GRACE) == 255:
                await self._conduit._master_gone()
        return await self._conduit._lost(what)


# --------------------------------------------------------------------------- conduit


class OpenSshConduit(Conduit):
    """A conduit whose commands are ``ssh`` clients sharing one ControlMaster."""

    def __init__(self, ssh: str, base: list[str], resolved: Resolved,
                 master: _Master | asyncio.Future[_Master],
                 verbose: Callable[[str], None]) -> None:
        self.ssh = ssh
        self.base = base  # -F/-i/-l/-p, as the user gave them
        self.resolved = resolved
        # A login still under way (``connect`` took over one ``begin`` started) is waited
        # for by the first ``start()``: the caller walks the host meanwhile.
        self._master: _Master | None = master if isinstance(master, _Master) else None
        self._login: asyncio.Future[_Master] | None = (
            None if isinstance(master, _Master) else master)
        self.verbose = verbose
        self.identity = resolved.identity
        self._sent = 0
        self._received = 0
        self._closed = False
        self._lost_reason: str | None = None
        self._procs: list[OpenSshProcess] = []

    @property
    def label(self) -> str:
        return self.resolved.label

    @property
    def master(self) -> _Master:
        """The master this conduit rides (once logged in: after the first ``start()``)."""
        if self._master is None:
            raise TransportError("the ssh login has not finished; start a command first")
        return self._master

    @property
    def alive(self) -> bool:
        if self._master is None:
            return not self._closed and self._login is not None and not (
                self._login.done() and self._login.exception() is not None)
        return not self._closed and _pid_alive(self._master.pid)

    async def _logged_in(self) -> None:
        if self._master is None and self._login is not None:
            # A failed login raises its one-line TransportError here, every time.
            self._master = await self._login

    def _session_args(self) -> list[str]:
        args = _session_overrides(self.resolved)
        if self.master.owned:
            args += ["-o", f"ControlPath={self.master.socket}", "-o", "ControlMaster=no"]
        # else the user's own ControlPath/ControlMaster settings lead to their master
        return args

    async def _master_gone(self) -> bool:
        """True if the master died (waiting briefly: a client may notice first)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _GRACE
        while _pid_alive(self.master.pid):
            if loop.time() > deadline:
                return False
            await asyncio.sleep(0.01)
        return True

    def _master_reason(self) -> str:
        """Why the master ended, from its log (its last own message)."""
        log = self.master.log
        text = ""
        if log is not None:
            with contextlib.suppress(OSError):
                text = log.read_text(errors="replace")[-(1 << 14):]
        lines = openssh_errors.messages(text)
        return lines[-1].rstrip(".") if lines else "the ssh master connection ended"

    async def _lost(self, what: str) -> ConnectionLost:
        if self._closed:
            return ConnectionLost(f"connection to {self.label} was closed by filesync itself")
        if self._lost_reason is not None or not _pid_alive(self.master.pid):
            self._lost_reason = self._lost_reason or self._master_reason()
            return ConnectionLost(
                f"connection to {self.label} lost ({self._lost_reason}); "
                "rerun to continue, nothing was half-applied"
            )
        return ConnectionLost(
            f"remote command on {self.label} {what}; see its stderr, then rerun to continue"
        )

    async def start(self, command: str) -> RemoteProcess:
        """Run ``command`` through the remote login shell, as ``ssh HOST COMMAND`` does."""
        if not self._closed:
            await self._logged_in()
        if self._closed or not _pid_alive(self.master.pid):
            raise await self._lost("could not start")
        log = self.master.log
        with contextlib.suppress(OSError):
            if log is not None and log.stat().st_size > _MASTER_LOG_KEEP:
                os.truncate(log, 0)  # the master appends (O_APPEND): this just restarts it
        argv = [self.ssh, *self.base, *self._session_args(), "-T", "-e", "none", "-x",
                "--", self.resolved.alias, command]
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, limit=1 << 20, start_new_session=True,
        )
        wrapped = OpenSshProcess(proc, self)
        self._procs = [p for p in self._procs if p._proc.returncode is None]
        self._procs.append(wrapped)
        return wrapped

    async def close(self) -> None:
        """Stop running commands and end filesync's own master. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for proc in self._procs:
            if proc._proc.returncode is None:
                proc.kill()
                with contextlib.suppress(Exception):
                    await proc._proc.wait()
        self._procs.clear()
        with contextlib.suppress(Exception):
            await self._logged_in()  # a login under way is ended, not left to idle out
        if self._master is None or not self._master.owned:
            return
        # filesync's own master has no other clients: SIGTERM ends it as ``-O exit`` does
        # (ssh closes the connection and removes its socket) without a mux round trip.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(self.master.pid, signal.SIGTERM)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5
        while _pid_alive(self.master.pid) and loop.time() < deadline:
            await asyncio.sleep(0.002)
        if _pid_alive(self.master.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.master.pid, signal.SIGKILL)
        if self.master.workdir is not None:
            shutil.rmtree(self.master.workdir, ignore_errors=True)

    @property
    def bytes_sent(self) -> int:
        return self._sent

    @property
    def bytes_received(self) -> int:
        return self._received


# --------------------------------------------------------------------------- connecting


_MASTER_PID = re.compile(r"Master running \(pid=(\d+)\)")


async def _check_master(ssh: str, args: list[str], alias: str) -> int | None:
    """The pid of the master that ``args`` lead to, or None if none runs."""
    with contextlib.suppress(TimeoutError, OSError):
        code, _out, err = await _run([ssh, *args, "-O", "check", "--", alias], 10)
        found = _MASTER_PID.search(err)
        if code == 0 and found:
            return int(found.group(1))
    return None


async def _run(argv: list[str], timeout: float) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, start_new_session=True,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


async def resolve(ssh: str, base: list[str], alias: str) -> Resolved:
    """Run ``ssh -G`` (no connection; ``Match exec`` commands do run)."""
    try:
        code, out, err = await _run([ssh, *base, "-T", "-G", "--", alias], 60)
    except TimeoutError:
        raise _resolve_timeout(alias) from None
    return _resolved(alias, code, out, err)


async def _finish_master(
    ssh: str, base: list[str], res: Resolved, workdir: Path, proc: subprocess.Popen[bytes],
    say: Callable[[str], None],
) -> _Master:
    """Wait for the login ``_spawn_master`` started; map its failure to one line."""
    socket = str(workdir / "%C")
    log = workdir / "master.log"
    try:
        # Polled, not waited for in a thread: a cancelled run must not be held up at exit
        # by a thread still waiting on ssh (a passphrase prompt, say). Finely while a
        # handshake may finish, coarsely once a human is likely typing.
        started = time.monotonic()
        while (code := proc.poll()) is None:
            await asyncio.sleep(0.002 if time.monotonic() - started < 2 else 0.05)
        text = log.read_text(errors="replace")
        if code != 0:
            raise openssh_errors.explain(text, _context(res))
        for line in text.splitlines():
            if line.startswith("Warning: Permanently added"):
                say(f"ssh: {line.strip()}")
        pid = _find_master(workdir)
        if pid is None and not Path("/proc/self").is_dir():
            pid = await _check_master(ssh, [*base, "-o", f"ControlPath={socket}"], res.alias)
        if pid is None:
            raise TransportError(f"the ssh master connection to {res.label} ended right after "
                                 f"login; run `ssh -v {res.alias}` to see why")
    except BaseException:
        if proc.poll() is None:
            proc.terminate()
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    say(f"ssh: logged in to {res.label} (master pid {pid})")
    return _Master(socket, pid, True, workdir)


def _session_overrides(res: Resolved) -> list[str]:
    """Settings that would keep ``ssh HOST COMMAND`` from being a plain stdio pipe to
    COMMAND, overridden for filesync's steps only where the user's config has them."""
    opts = []
    if res.get("remotecommand"):
        opts.append("RemoteCommand=none")  # else ssh refuses a command line
    if res.get("stdinnull") == "yes":
        opts.append("StdinNull=no")
    if res.get("sessiontype", "default") != "default":
        opts.append("SessionType=default")
    if res.get("forkafterauthentication") == "yes":
        opts.append("ForkAfterAuthentication=no")
    if any(res.get(key) for key in ("localforward", "remoteforward", "dynamicforward")):
        opts.append("ClearAllForwardings=yes")  # the master has them; not once per step
    return [arg for opt in opts for arg in ("-o", opt)]


async def connect(
    host: str,
    user: str | None = None,
    port: int | None = None,
    *,
    ssh_config: Path | None = None,
    identity: Path | None = None,
    accept_new_host_key: bool = False,
    connect_timeout: float = 15.0,
    verbose: Callable[[str], None] | None = None,
) -> OpenSshConduit:
    """Log in to ``host`` (a name or ssh_config alias) with ``ssh`` and return the conduit.

    ``user``/``port`` are ``-l``/``-p``, ``ssh_config`` is ``-F``, ``identity`` is ``-i``.
    Takes over a login ``begin`` started with the same arguments, if there is one.
    Raises ``TransportError`` with one line naming the cause and the fix.
    """
    say = verbose or (lambda _msg: None)
    key: _Key = (host, user, port, ssh_config, identity, accept_new_host_key, connect_timeout)
    pending = _take(key)
    if pending is None:
        ssh = _which_ssh()
        base = _base_args(ssh_config, identity, user, port)
        res = await resolve(ssh, base, host)
        workdir, proc = None, None
    else:
        if pending.error is not None:
            raise pending.error
        assert pending.res is not None and pending.base is not None
        ssh, base, res = pending.ssh, pending.base, pending.res
        workdir, proc = pending.workdir, pending.proc
    if proc is None and res.get("controlpath", "none") != "none":
        pid = await _check_master(ssh, base, host)
        if pid is not None:
            say(f"ssh: riding the running ControlMaster of {res.label} (pid {pid})")
            return OpenSshConduit(ssh, base, res, _Master(res.get("controlpath"), pid, False),
                                  say)
    if proc is None or workdir is None:
        workdir, proc = _spawn_master(ssh, base, res, accept_new_host_key, connect_timeout)
    say(f"ssh: connecting to {res.label} with {ssh} (one ControlMaster, socket in {workdir})")
    login = _finish_master(ssh, base, res, workdir, proc, say)
    if pending is None:
        return OpenSshConduit(ssh, base, res, await login, say)
    # Begun early (the CLI): the first start() waits for the login, and raises its error.
    return OpenSshConduit(ssh, base, res, asyncio.ensure_future(login), say)
