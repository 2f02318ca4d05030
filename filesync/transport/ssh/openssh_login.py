"""Logging in with the system ``ssh``: ``ssh -G``, and filesync's own ControlMaster.

Guarantees:

- ``begin`` starts a login without an event loop and returns at once (the CLI calls it
  before it imports the engine, so ssh's handshake overlaps filesync's own start);
  ``connect`` (``openssh``) with the same arguments takes it over and raises what went
  wrong exactly as a login it started itself would. A login nobody takes over ends when
  the process exits.
- Readiness needs no mux round trip: ``ssh -M -N -f`` exits 0 once the backgrounded
  master listens, and the master's pid is read from /proc (``ssh -O check`` only where
  there is no /proc).
- Every failure is one ``TransportError`` line (see ``openssh_errors``).

Standard library only, and no asyncio: the CLI imports this module (and starts the login)
before anything heavier; the waiting half is ``openssh.connect``.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from filesync.errors import TransportError, UsageError
from filesync.transport.ssh.destination import DEFAULT_PORT, ssh_label
from filesync.transport.ssh.openssh_errors import Context

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
_GRACE = 2.0  # how long a finished client may take to exit, or a dying master to die


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


#: The environment variable that picks the SSH client when ``--ssh-client`` is not given.
ENV_CLIENT = "FILESYNC_SSH_CLIENT"
CLIENTS = ("openssh", "asyncssh")

def choose_client(requested: str | None) -> str:
    """``openssh`` or ``asyncssh``: the request, else $FILESYNC_SSH_CLIENT, else openssh
    whenever an ``ssh`` binary is on PATH. Raises ``UsageError`` for another name and
    ``TransportError`` when openssh is asked for but there is no ``ssh``."""
    choice = requested or os.environ.get(ENV_CLIENT, "")
    if choice and choice not in CLIENTS:
        where = f"ssh client {choice!r}" if requested else f"{ENV_CLIENT}={choice!r}"
        raise UsageError(f"{where} is not a client; set it to openssh or asyncssh")
    if not choice:
        return "openssh" if shutil.which("ssh") else "asyncssh"
    if choice == "openssh" and not shutil.which("ssh"):
        raise TransportError("no ssh binary on PATH; install the OpenSSH client "
                             "(openssh-client) or use --ssh-client asyncssh")
    return choice


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
        return ssh_label(self.user, self.alias, self.host, self.port)

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


def _resolve_now(ssh: str, base: list[str], alias: str) -> Resolved:
    """``resolve`` without an event loop, for ``begin``."""
    try:
        done = subprocess.run([ssh, *base, "-T", "-G", "--", alias], stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=60, start_new_session=True)
    except subprocess.TimeoutExpired:
        raise _resolve_timeout(alias) from None
    return _resolved(alias, done.returncode, done.stdout.decode(errors="replace"),
                     done.stderr.decode(errors="replace"))


def _resolve_timeout(alias: str) -> TransportError:
    return TransportError(f"`ssh -G {alias}` did not finish in 60 s; check the Match exec "
                          "commands in your ssh config")


def _resolved(alias: str, code: int, out: str, err: str) -> Resolved:
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


def _base_args(ssh_config: Path | None, identity: Path | None, user: str | None,
               port: int | None) -> list[str]:
    """``-F``/``-i``/``-l``/``-p`` as given, after checking the files exist."""
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
    return base


def _which_ssh() -> str:
    ssh = shutil.which("ssh")
    if ssh is None:
        raise TransportError("no ssh binary on PATH; install the OpenSSH client "
                             "(openssh-client) or use --ssh-client asyncssh")
    return ssh


_Key = tuple[str, str | None, int | None, Path | None, Path | None, bool, float]


@dataclass
class Pending:
    """A login under way: ``begin`` spawned it, ``connect`` (with the same arguments)
    finishes it. ``error`` is what ``begin`` ran into, raised by ``connect``."""

    key: _Key
    ssh: str = ""
    base: list[str] | None = None
    res: Resolved | None = None
    error: TransportError | None = None
    #: the ``ssh -M -N -f`` that logs in; None when the user's config names a ControlPath
    #: (``connect`` looks for the user's running master first)
    proc: subprocess.Popen[bytes] | None = None
    workdir: Path | None = None


_PENDING: dict[_Key, list[Pending]] = {}
_AT_EXIT = False


def begin(
    host: str,
    user: str | None = None,
    port: int | None = None,
    *,
    ssh_config: Path | None = None,
    identity: Path | None = None,
    accept_new_host_key: bool = False,
    connect_timeout: float = 15.0,
) -> Pending:
    """Start logging in to ``host`` now, without an event loop, and return at once.

    The CLI calls this right after parsing, so that ssh's handshake runs while the rest
    of filesync is imported and the host is walked. A later ``connect`` with the same
    arguments takes the login over (and raises what went wrong, as it would have).
    Never raises; a login nobody takes over is ended when the process exits.
    """
    key: _Key = (host, user, port, ssh_config, identity, accept_new_host_key, connect_timeout)
    pending = Pending(key)
    try:
        pending.ssh = _which_ssh()
        pending.base = _base_args(ssh_config, identity, user, port)
        pending.res = _resolve_now(pending.ssh, pending.base, host)
        if pending.res.get("controlpath", "none") == "none":
            pending.workdir, pending.proc = _spawn_master(
                pending.ssh, pending.base, pending.res, accept_new_host_key, connect_timeout)
    except TransportError as exc:
        pending.error = exc
    global _AT_EXIT
    if not _AT_EXIT:
        _AT_EXIT = atexit.register(end_unused) is not None
    _PENDING.setdefault(key, []).append(pending)
    return pending


def _take(key: _Key) -> Pending | None:
    queue = _PENDING.get(key)
    if not queue:
        return None
    pending = queue.pop(0)
    if not queue:
        del _PENDING[key]
    return pending


def end_unused() -> None:
    """End the logins ``begin`` started that no ``connect`` took over (the command failed
    before it connected). Run by ``filesync.cli.main`` after each command, and at exit."""
    for queue in list(_PENDING.values()):
        for pending in queue:
            if pending.proc is not None and pending.workdir is not None:
                with contextlib.suppress(ProcessLookupError):
                    pending.proc.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    if pending.proc.wait(_GRACE) == 0 and (pid := _find_master(pending.workdir)):
                        with contextlib.suppress(ProcessLookupError, PermissionError):
                            os.kill(pid, signal.SIGTERM)
                shutil.rmtree(pending.workdir, ignore_errors=True)
    _PENDING.clear()


def _spawn_master(
    ssh: str, base: list[str], res: Resolved, accept_new: bool, connect_timeout: float,
) -> tuple[Path, subprocess.Popen[bytes]]:
    """Start ``ssh -M -N -f``: it exits 0 once its master runs in the background."""
    workdir = _runtime_dir()
    argv = [ssh, *base, "-v", "-o", f"ControlPath={workdir / '%C'}", "-o", "ControlMaster=yes",
            "-o", f"ControlPersist={_IDLE_PERSIST}", *_fill_gaps(res, accept_new, connect_timeout),
            "-N", "-f", "-T", "-x", "--", res.alias]
    try:
        # The log is a file, not a pipe: the backgrounded master (and a ProxyJump child)
        # keep writing to it, and a pipe would never reach its end. No new session here:
        # ssh asks for a passphrase on the terminal, if there is one.
        with open(workdir / "master.log", "ab") as err:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=err)
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    return workdir, proc


def _find_master(workdir: Path) -> int | None:
    """The pid of the running master whose socket is in ``workdir``, read from /proc (no
    ``ssh -O check`` round trip): its command line names the directory, before and after
    ssh retitles the backgrounded master to ``ssh: SOCKET [mux]``."""
    mark = str(workdir).encode() + b"/"
    me = os.getpid()
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or int(entry.name) == me:
                continue
            with contextlib.suppress(OSError), open(f"/proc/{entry.name}/cmdline", "rb") as f:
                if mark in f.read() and _pid_alive(int(entry.name)):
                    return int(entry.name)
    return None


def _context(res: Resolved) -> Context:
    known = res.files("userknownhostsfile")
    return Context(
        label=res.label, alias=res.alias, host=res.host, port=res.port, user=res.user,
        known_hosts=str(known[0]) if known else "~/.ssh/known_hosts",
        identity_files=res.files("identityfile"),
        agent=bool(os.environ.get("SSH_AUTH_SOCK")) and res.get("identityagent") != "none",
        tty=_has_tty(),
    )
