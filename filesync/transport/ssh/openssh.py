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
  (``ssh -O exit``); should filesync die instead, the master exits by itself once idle
  for ``_IDLE_PERSIST`` seconds.
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
import os
import pwd
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from filesync.errors import ConnectionLost, TransportError, UsageError
from filesync.transport.base import Conduit, RemoteProcess
from filesync.transport.ssh import openssh_errors
from filesync.transport.ssh.openssh_errors import DEFAULT_PORT, Context

__all__ = ["CLIENTS", "ENV_CLIENT", "OpenSshConduit", "choose_client", "connect"]

#: The environment variable that picks the SSH client when ``--ssh-client`` is not given.
ENV_CLIENT = "FILESYNC_SSH_CLIENT"
CLIENTS = ("openssh", "asyncssh")

# Liveness when the user's config sets none: three missed 15 s probes end the master, so
# a dead peer is noticed within a minute (ServerAliveCountMax's default is already 3).
_ALIVE_INTERVAL = 15
# An orphaned master (filesync killed before close) exits after this long without sessions.
_IDLE_PERSIST = 60
# Unix socket paths are limited to 104-108 bytes. Below the base come "/ssh-XXXXXXXX/",
# %C (40 hex digits) and, while ssh binds, a 17-byte temporary suffix: 71 bytes.
_MAX_SOCKET_DIR = 104 - 71
# A master's dir with a log but no socket this long is left over (a master that is still
# logging in, say at a passphrase prompt, has written its log more recently than that).
_STALE_AFTER = 3600
_STDERR_KEEP = 1 << 20
_MASTER_LOG_KEEP = 1 << 20
_GRACE = 2.0  # how long a finished client may take to exit, or a dying master to die


def choose_client(requested: str | None) -> str:
    """``openssh`` or ``asyncssh``: the request, else $FILESYNC_SSH_CLIENT, else openssh
    whenever an ``ssh`` binary is on PATH. Raises ``UsageError`` for another name and
    ``TransportError`` when openssh is asked for but there is no ``ssh``."""
    choice = requested or os.environ.get(ENV_CLIENT, "")
    if choice and choice not in CLIENTS:
        raise UsageError(f"{ENV_CLIENT}={choice!r} is not a client; set it to openssh or asyncssh")
    if not choice:
        return "openssh" if shutil.which("ssh") else "asyncssh"
    if choice == "openssh" and not shutil.which("ssh"):
        raise TransportError("no ssh binary on PATH; install the OpenSSH client "
                             "(openssh-client) or use --ssh-client asyncssh")
    return choice


def _has_tty() -> bool:
    try:
        fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
    except OSError:
        return False
    os.close(fd)
    return True


def _pid_alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie counts as dead (orphans are reaped late)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def _sweep(base: Path) -> None:
    """Remove the directories of masters that are gone (filesync was killed, and the master
    then exited once idle, taking its socket along): only the log is left in them."""
    now = time.time()
    for entry in base.glob("ssh-*"):
        with contextlib.suppress(OSError):
            names = os.listdir(entry)
            log = entry / "master.log"
            if names == ["master.log"] and now - log.stat().st_mtime > _STALE_AFTER:
                shutil.rmtree(entry)


def _runtime_dir() -> Path:
    """A fresh 0700 directory for one master's socket and log, short enough for a socket."""
    uid = os.getuid()
    bases = []
    if runtime := os.environ.get("XDG_RUNTIME_DIR"):
        bases.append(Path(runtime) / "filesync")
    bases.append(Path(tempfile.gettempdir()) / f"filesync-{uid}")
    bases.append(Path(f"/tmp/filesync-{uid}"))
    for base in bases:
        if len(str(base)) > _MAX_SOCKET_DIR:
            continue
        with contextlib.suppress(OSError):
            base.mkdir(mode=0o700, parents=True, exist_ok=True)
            st = base.lstat()
            if base.is_symlink() or st.st_uid != uid or st.st_mode & 0o077:
                continue  # someone else's, or open to others: not for a control socket
            _sweep(base)
            return Path(tempfile.mkdtemp(prefix="ssh-", dir=base))
    raise TransportError(
        "no private directory for the ssh control socket (tried "
        f"{', '.join(map(str, bases))}); set XDG_RUNTIME_DIR to a short private directory"
    )


# --------------------------------------------------------------------------- ssh -G


@dataclass(frozen=True)
class Resolved:
    """What ``ssh -G`` says about a destination: the fully resolved client config."""

    alias: str
    settings: dict[str, list[str]]

    def get(self, key: str, default: str = "") -> str:
        values = self.settings.get(key)
        return values[0] if values else default

    @property
    def host(self) -> str:
        return self.get("hostname", self.alias)

    @property
    def user(self) -> str:
        return self.get("user") or pwd.getpwuid(os.getuid()).pw_name

    @property
    def port(self) -> int:
        return int(self.get("port", str(DEFAULT_PORT)))

    @property
    def label(self) -> str:
        """``user@alias (host:port)`` as the asyncssh client spells it, for messages."""
        shown = self.host if self.port == DEFAULT_PORT else f"{self.host}:{self.port}"
        if self.alias != self.host:
            shown = f"{self.alias} ({shown})"
        return f"{self.user}@{shown}"

    @property
    def identity(self) -> str:
        """``ssh://user@host:port``: the same state key as the asyncssh client's."""
        host = self.host.lower()
        return f"ssh://{self.user}@{f'[{host}]' if ':' in host else host}:{self.port}"

    def files(self, key: str) -> list[Path]:
        home = pwd.getpwuid(os.getuid()).pw_dir  # ssh expands ~ from the passwd entry
        out = []
        for value in self.settings.get(key, []):
            for item in value.split():
                if item.lower() != "none":
                    out.append(Path(re.sub(r"^~(?=/|$)", home, item)))
        return out


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
        raise TransportError(f"`ssh -G {alias}` did not finish in 60 s; check the Match exec "
                             "commands in your ssh config") from None
    if code != 0:
        lines = [line for line in err.splitlines() if line.strip()]
        why = lines[0] if lines else f"exit status {code}"
        raise TransportError(f"ssh cannot use its config for {alias} ({why}); fix the ssh "
                             f"config (`ssh -G {alias}` shows the same)")
    settings: dict[str, list[str]] = {}
    for line in out.splitlines():
        key, _, value = line.partition(" ")
        settings.setdefault(key.lower(), []).append(value.strip())
    return Resolved(alias, settings)


# --------------------------------------------------------------------------- processes


class OpenSshProcess(RemoteProcess):
    """One ``ssh HOST COMMAND`` client riding the conduit's master."""

    def __init__(self, proc: asyncio.subprocess.Process, conduit: OpenSshConduit) -> None:
        self._proc = proc
        self._conduit = conduit
        self._stderr = bytearray()
        self._stderr_task = asyncio.ensure_future(self._drain_stderr())

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


@dataclass
class _Master:
    """The ControlMaster a conduit rides: filesync's own, or the user's."""

    socket: str  # the ControlPath argument (may contain %C)
    pid: int
    owned: bool
    workdir: Path | None = None

    @property
    def log(self) -> Path | None:
        return self.workdir / "master.log" if self.workdir else None


class OpenSshConduit(Conduit):
    """A conduit whose commands are ``ssh`` clients sharing one ControlMaster."""

    def __init__(self, ssh: str, base: list[str], resolved: Resolved, master: _Master,
                 verbose: Callable[[str], None]) -> None:
        self.ssh = ssh
        self.base = base  # -F/-i/-l/-p, as the user gave them
        self.resolved = resolved
        self.master = master
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
        return not self._closed and _pid_alive(self.master.pid)

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
        if not self.master.owned:
            return
        with contextlib.suppress(Exception):
            await _run([self.ssh, *self.base, *self._session_args(), "-O", "exit", "--",
                        self.resolved.alias], 10)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5
        while _pid_alive(self.master.pid) and loop.time() < deadline:
            await asyncio.sleep(0.01)
        if _pid_alive(self.master.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.master.pid, signal.SIGTERM)
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


def _fill_gaps(res: Resolved, accept_new: bool, connect_timeout: float) -> list[str]:
    """The ``-o`` options filesync adds for the master; each only where it must or may."""
    opts = []
    if accept_new:
        opts.append("StrictHostKeyChecking=accept-new")
    elif res.get("stricthostkeychecking") == "ask":
        # The default: a question in the middle of a run. filesync refuses instead, with
        # the line that adds the key (and --accept-new-host-key), see openssh_errors.
        opts.append("StrictHostKeyChecking=yes")
    if res.get("serveraliveinterval", "0") == "0":
        opts.append(f"ServerAliveInterval={_ALIVE_INTERVAL}")
    if res.get("connecttimeout", "none") == "none" and connect_timeout > 0:
        opts.append(f"ConnectTimeout={max(1, round(connect_timeout))}")
    return [arg for opt in opts for arg in ("-o", opt)]


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
    Raises ``TransportError`` with one line naming the cause and the fix.
    """
    say = verbose or (lambda _msg: None)
    ssh = shutil.which("ssh")
    if ssh is None:
        raise TransportError("no ssh binary on PATH; install the OpenSSH client "
                             "(openssh-client) or use --ssh-client asyncssh")
    base: list[str] = []
    if ssh_config is not None:
        if not (ssh_config.exists() and not ssh_config.is_dir()):
            raise TransportError(f"ssh config {ssh_config} does not exist; check the path")
        base += ["-F", str(ssh_config)]
    if identity is not None:
        if not os.access(identity, os.R_OK):
            raise TransportError(f"identity file {identity} is not readable; check the -i path")
        base += ["-i", str(identity)]
    if user is not None:
        base += ["-l", user]
    if port is not None:
        base += ["-p", str(port)]
    res = await resolve(ssh, base, host)
    if res.get("controlpath", "none") != "none":
        pid = await _check_master(ssh, base, host)
        if pid is not None:
            say(f"ssh: riding the running ControlMaster of {res.label} (pid {pid})")
            return OpenSshConduit(ssh, base, res, _Master(res.get("controlpath"), pid, False),
                                  say)
    master = await _start_master(ssh, base, res, accept_new_host_key, connect_timeout, say)
    return OpenSshConduit(ssh, base, res, master, say)


async def _start_master(
    ssh: str, base: list[str], res: Resolved, accept_new: bool, connect_timeout: float,
    say: Callable[[str], None],
) -> _Master:
    workdir = _runtime_dir()
    socket = str(workdir / "%C")
    mux = ["-o", f"ControlPath={socket}"]
    argv = [ssh, *base, "-v", *mux, "-o", "ControlMaster=yes",
            "-o", f"ControlPersist={_IDLE_PERSIST}", *_fill_gaps(res, accept_new, connect_timeout),
            "-N", "-f", "-T", "-x", "--", res.alias]
    say(f"ssh: connecting to {res.label} with {ssh} (one ControlMaster, socket in {workdir})")
    log = workdir / "master.log"
    try:
        # The log is a file, not a pipe: the backgrounded master (and a ProxyJump child)
        # keep writing to it, and a pipe would never reach its end. No new session here:
        # ssh asks for a passphrase on the terminal, if there is one.
        with open(log, "ab") as err:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
                stderr=err,
            )
        code = await proc.wait()
        text = log.read_text(errors="replace")
        if code != 0:
            raise openssh_errors.explain(text, _context(res))
        for line in text.splitlines():
            if line.startswith("Warning: Permanently added"):
                say(f"ssh: {line.strip()}")
        pid = await _check_master(ssh, [*base, *mux], res.alias)
        if pid is None:
            raise TransportError(f"the ssh master connection to {res.label} ended right after "
                                 f"login; run `ssh -v {res.alias}` to see why")
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    say(f"ssh: logged in to {res.label} (master pid {pid})")
    return _Master(socket, pid, True, workdir)


def _context(res: Resolved) -> Context:
    known = res.files("userknownhostsfile")
    return Context(
        label=res.label, alias=res.alias, host=res.host, port=res.port, user=res.user,
        known_hosts=str(known[0]) if known else "~/.ssh/known_hosts",
        identity_files=res.files("identityfile"),
        agent=bool(os.environ.get("SSH_AUTH_SOCK")) and res.get("identityagent") != "none",
        tty=_has_tty(),
    )
