"""The OpenSSH conduit: every command is one ``ssh`` process over one shared connection.

Guarantees:

- The user's OpenSSH setup applies, all of it (``~/.ssh/config`` with Include, Match exec,
  ProxyJump, certificates, KnownHostsCommand, agents ...), because ``ssh`` itself makes the
  connection. filesync passes ``-F``, ``-i``, ``-l`` and ``-p`` when given and otherwise
  sets an option only where the user's config (read with ``ssh -G``, which opens no
  connection) leaves a gap, or where it must (listed in docs/ssh.md).
- One login per conduit: the first step starts filesync's own ControlMaster, its socket
  in a private 0700 directory; every ``start()`` is an ``ssh`` client riding it
  (``-T -e none -x``: no pty, no escape character, a binary-clean stream). If the user's
  config, or the caller's ``ssh_options``, point at a running master (``ControlPath`` +
  ``ssh -O check``), the conduit rides that one and leaves it running. ``close()`` ends
  filesync's own master through its control socket (``master.terminate``); should the
  process die instead, SIGKILL included, the master goes with it (``master.ControlMaster``).
  The login may have been started earlier by ``begin`` (``openssh_login``), which
  ``connect`` takes over.
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
import signal
from collections.abc import Callable, Sequence
from pathlib import Path

from filesync.errors import ConnectionLost
from filesync.transport.base import Conduit, RemoteProcess
from filesync.transport.spawn import Spawn
from filesync.transport.ssh.master import GRACE, ControlMaster, run_ssh, session_overrides
from filesync.transport.ssh.openssh_login import (
    CLIENTS,
    ENV_CLIENT,
    LoginKey,
    Pending,
    base_args,
    begin,
    choose_client,
    which_ssh,
)
from filesync.transport.ssh.options import check_ssh_options
from filesync.transport.ssh.resolved import OpenSshSettings, parse_resolved, resolve_timeout

__all__ = ["CLIENTS", "ENV_CLIENT", "ControlMaster", "OpenSshConduit", "Pending", "begin",
           "choose_client", "connect"]

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
                code = await asyncio.wait_for(self._proc.wait(), GRACE)
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
        # The client only: the master then sends the remote command end of input and
        # stops forwarding its output. A command that ignores that keeps its channel open,
        # and the master our pipes (a mux client hands its own over): closing our ends
        # lets ``wait()`` return all the same. Ending such a command on the remote is the
        # caller's business (the helper endpoint kills it by its pid).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, signal.SIGKILL)
        transport = getattr(self._proc, "_transport", None)  # no public way to it
        if transport is not None:
            # The pipes only: closing the whole transport would reap the process under
            # asyncio's child watcher, which then warns on stderr.
            for fd in (0, 1, 2):
                pipe = transport.get_pipe_transport(fd)
                if pipe is not None:
                    pipe.close()

    async def _lost(self, what: str) -> ConnectionLost:
        # The client may see its stream break before the master, whose connection broke,
        # has exited: let both settle before telling a lost connection from a dead command.
        with contextlib.suppress(TimeoutError):
            if await asyncio.wait_for(self._proc.wait(), GRACE) == 255:
                await self._conduit._master_gone()
        return await self._conduit._lost(what)


# --------------------------------------------------------------------------- conduit


class OpenSshConduit(Conduit):
    """A conduit whose commands are ``ssh`` clients sharing one ControlMaster."""

    def __init__(self, ssh: str, base: list[str], resolved: OpenSshSettings,
                 master: ControlMaster, verbose: Callable[[str], None],
                 login: asyncio.Future[None] | None = None) -> None:
        self.ssh = ssh
        self.base = base  # -F/-i/-l/-p and the caller's ssh options, as given
        self.resolved = resolved
        self.master = master
        # A login still under way (``connect`` took over one ``begin`` started) is waited
        # for by the first ``start()``: the caller walks the host meanwhile.
        self._login = login
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
    def alive(self) -> bool:
        login_failed = self._login is not None and self._login.done() and (
            self._login.cancelled() or self._login.exception() is not None)
        return not self._closed and not login_failed and self.master.alive

    async def logged_in(self) -> None:
        if self._login is not None:
            # A failed login raises its one-line TransportError here, every time.
            await self._login

    def _session_args(self) -> list[str]:
        # The master's options first: for -o options the first value given wins.
        return [*self.master.client_args(), *self.base, *session_overrides(self.resolved)]

    async def _master_gone(self) -> bool:
        """True if the master died (waiting briefly: a client may notice first)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + GRACE
        while self.master.alive:
            if loop.time() > deadline:
                return False
            await asyncio.sleep(0.01)
        return True

    def _master_reason(self) -> str:
        """Why the master ended, from its log (its last own message)."""
        from filesync.transport.ssh import openssh_errors  # (only once a master ended)

        lines = openssh_errors.messages(self.master.log_tail())
        return lines[-1].rstrip(".") if lines else "the ssh master connection ended"

    async def _lost(self, what: str) -> ConnectionLost:
        if self._closed:
            return ConnectionLost(f"connection to {self.label} was closed by filesync itself")
        if self._lost_reason is not None or not self.master.alive:
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
            await self.logged_in()
        if self._closed or not self.master.alive:
            raise await self._lost("could not start")
        log = self.master.log
        with contextlib.suppress(OSError):
            if log is not None and log.stat().st_size > _MASTER_LOG_KEEP:
                os.truncate(log, 0)  # the master appends (O_APPEND): this just restarts it
        argv = [self.ssh, *self._session_args(), "-T", "-e", "none", "-x",
                "--", self.resolved.alias, command]
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, limit=1 << 20, start_new_session=True,
            **self.master.spawn.kwargs(),
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
                    await asyncio.wait_for(proc._proc.wait(), GRACE)
        self._procs.clear()
        if self._login is not None:
            self._login.cancel()  # a login under way is ended, not left running
            with contextlib.suppress(BaseException):
                await self._login  # (and a failed one's error is taken, not warned about)
        await self.master.stop()  # nothing for a master filesync did not start

    @property
    def bytes_sent(self) -> int:
        return self._sent

    @property
    def bytes_received(self) -> int:
        return self._received


# --------------------------------------------------------------------------- connecting


async def resolve(ssh: str, base: list[str], alias: str,
                  spawn: Spawn | None = None) -> OpenSshSettings:
    """Run ``ssh -G`` (no connection; ``Match exec`` commands do run)."""
    try:
        code, out, err = await run_ssh([ssh, *base, "-T", "-G", "--", alias], 60, spawn)
    except TimeoutError:
        raise resolve_timeout(alias) from None
    return parse_resolved(alias, code, out, err)


async def connect(
    host: str,
    user: str | None = None,
    port: int | None = None,
    *,
    ssh_config: Path | None = None,
    identity: Path | None = None,
    accept_new_host_key: bool = False,
    connect_timeout: float = 15.0,
    ssh_options: Sequence[str] = (),
    verbose: Callable[[str], None] | None = None,
    login: Pending | None = None,
    spawn: Spawn | None = None,
) -> OpenSshConduit:
    """Log in to ``host`` (a name or ssh_config alias) with ``ssh`` and return the conduit.

    ``user``/``port`` are ``-l``/``-p``, ``ssh_config`` is ``-F``, ``identity`` is ``-i``;
    ``ssh_options`` are more ``ssh`` options (``["-o", "ControlPath=PATH"]``: a running
    master there is ridden, never ended). ``login``: a login ``begin`` started, taken
    over if it was begun with the same arguments (else it is ended). ``spawn``: the
    context every ``ssh`` runs in (a begun login is the process's own).
    Raises ``TransportError`` with one line naming the cause and the fix.
    """
    say = verbose or (lambda _msg: None)
    key: LoginKey = (host, user, port, ssh_config, identity, accept_new_host_key,
                     connect_timeout)
    pending = login
    if pending is not None and (pending.taken or pending.key != key or ssh_options):
        pending.close()  # begun for something else: not this connection's login
        pending = None
    if pending is not None:
        pending.taken = True
    if pending is None:
        ssh = which_ssh((spawn or Spawn()).env)
        base = base_args(ssh_config, identity, user, port) + check_ssh_options(ssh_options)
        res = await resolve(ssh, base, host, spawn)
        master = None
    else:
        if pending.error is not None:
            raise pending.error
        assert pending.res is not None and pending.base is not None
        ssh, base, res, master = pending.ssh, pending.base, pending.res, pending.master
    if master is None:
        theirs = await ControlMaster.find(ssh, base, res, spawn)
        if theirs is not None:
            say(f"ssh: riding the running ControlMaster of {res.label} (pid {theirs.pid})")
            return OpenSshConduit(ssh, base, res, theirs, say)
        master = ControlMaster.start(ssh, base, res, accept_new=accept_new_host_key,
                                     connect_timeout=connect_timeout, spawn=spawn)
    assert master.workdir is not None
    say(f"ssh: connecting to {res.label} with {ssh} (one ControlMaster, socket in "
        f"{master.workdir})")
    if pending is None:
        await master.ready(res, say)
        return OpenSshConduit(ssh, base, res, master, say)
    # Begun early (the CLI): the first start() waits for the login, and raises its error.
    return OpenSshConduit(ssh, base, res, master, say,
                          asyncio.ensure_future(master.ready(res, say)))
