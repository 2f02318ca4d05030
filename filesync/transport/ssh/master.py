"""An OpenSSH ControlMaster: filesync's own, or one the user (or the calling program) runs.

Guarantees:

- ``ControlMaster.start`` spawns ``ssh -M`` as filesync's own child and returns at once;
  it needs no event loop (the CLI starts the login before it loads the engine).
  ``ready()`` waits until the control socket exists (ssh creates it only once logged
  in) and raises a failed login as one ``TransportError`` line (``openssh_errors``).
- A master filesync started never outlives the process that started it, SIGKILL
  included. It runs in the foreground (``ControlPersist=no``), and its own session is a
  remote ``cat`` whose input is a pipe that only that process holds. However that
  process ends, the kernel closes the pipe; ``cat`` sees end of input and exits, and
  the master exits once the steps still riding it have ended (their input closes the
  same way). No daemon, no idle timer, no signal needed.
- ``stop()`` ends filesync's own master through its control socket, never by a signal
  to a pid: a terminate request in the socket's own protocol (``terminate``; no ``ssh``
  process), or ``ssh -O exit`` where the master does not answer it. A login still under
  way has no socket yet: it is ended through its process handle (filesync's own child,
  not yet reaped, so the pid cannot have been reused). A master filesync did not start
  (``find``) is never stopped.
- Ctrl-C in a terminal is for filesync, not for its master: the master ignores SIGINT
  and SIGQUIT (a ``sh`` sets that and execs ssh), as a daemonized master would. It stays
  in filesync's session, so ssh can still ask for a passphrase on the terminal.

Standard library only, and neither ``typing`` nor ``dataclasses`` at run time; asyncio is
imported by the waiting methods alone, and the explanation of a failed login
(``openssh_errors``) only on a failure: the CLI spawns the master before anything heavier
is loaded.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from filesync.errors import TransportError
from filesync.transport.spawn import Spawn

#: ``typing.TYPE_CHECKING`` without importing ``typing`` (mypy and ruff treat the name alike).
TYPE_CHECKING = False
if TYPE_CHECKING:
    import socket
    from collections.abc import Callable
    from typing import Any

    from filesync.transport.ssh import openssh_errors
    from filesync.transport.ssh.resolved import OpenSshSettings

#: How long a finished client may take to exit, or a dying master to die.
GRACE = 2.0
# Liveness when the user's config sets none: three missed probes, ``_ALIVE_INTERVAL``
# seconds apart, end the master, so a dead peer is noticed within a minute
# (ServerAliveCountMax's default is already 3).
_ALIVE_INTERVAL = 15
# How long ``stop`` waits for the master's answer (or ``ssh -O exit``), then for it to go.
_STOP_TIMEOUT = 10.0
#: The socket's name in the master's private directory.
SOCKET = "sock"
# Unix socket paths are limited to 104-108 bytes. Below the base come "/ssh-XXXXXXXX/",
# the socket's name and, while ssh binds, a 17-byte temporary suffix.
_MAX_SOCKET_DIR = 104 - (14 + len(SOCKET) + 17)
# A master's dir with a log but no socket this long is left over (a master that is still
# logging in, say at a passphrase prompt, has written its log more recently than that).
_STALE_AFTER = 3600
#: The master's own session: it ends when its input does (see the module docstring).
_SESSION = "cat"
# Ignore the terminal's SIGINT/SIGQUIT (inherited across exec; ssh keeps an ignored
# signal ignored), then become ssh: the master is still filesync's direct child.
_SHIELD = ["/bin/sh", "-c", 'trap "" INT QUIT; exec "$@"', "sh"]
_MASTER_PID = re.compile(r"Master running \(pid=(\d+)\)")


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie counts as dead (orphans are reaped late)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        try:
            os.kill(pid, 0)  # no /proc (macOS): signal 0 only asks whether it exists
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def _sweep(base: Path) -> None:
    """Remove the directories of masters that are gone (their process was killed before
    it could tidy up, and the master went with it): only the log is left in them."""
    now = time.time()
    for entry in base.glob("ssh-*"):
        with contextlib.suppress(OSError):
            names = os.listdir(entry)
            log = entry / "master.log"
            if names == ["master.log"] and now - log.stat().st_mtime > _STALE_AFTER:
                shutil.rmtree(entry)


def runtime_dir(spawn: Spawn | None = None) -> Path:
    """A fresh 0700 directory for one master's socket and log, short enough for a socket
    (under ``spawn``'s ``$XDG_RUNTIME_DIR`` first)."""
    uid = os.getuid()
    bases = []
    if runtime := (spawn or Spawn()).environ.get("XDG_RUNTIME_DIR"):
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


def _fill_gaps(res: OpenSshSettings, accept_new: bool, connect_timeout: float) -> list[str]:
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


def session_overrides(res: OpenSshSettings, *, forwards: bool = True) -> list[str]:
    """Settings that would keep ``ssh HOST COMMAND`` from being a plain stdio pipe to
    COMMAND, overridden only where the user's config has them. ``forwards``: also drop
    the config's forwards (a step does; the master holds them)."""
    opts = []
    if res.get("remotecommand"):
        opts.append("RemoteCommand=none")  # else ssh refuses a command line
    if res.get("stdinnull") == "yes":
        opts.append("StdinNull=no")
    if res.get("sessiontype", "default") != "default":
        opts.append("SessionType=default")
    if res.get("forkafterauthentication") == "yes":
        opts.append("ForkAfterAuthentication=no")
    if forwards and any(res.get(k) for k in ("localforward", "remoteforward", "dynamicforward")):
        opts.append("ClearAllForwardings=yes")  # the master has them; not once per step
    return [arg for opt in opts for arg in ("-o", opt)]


def _has_tty() -> bool:
    try:
        fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
    except OSError:
        return False
    os.close(fd)
    return True


def error_context(res: OpenSshSettings, spawn: Spawn | None = None) -> openssh_errors.Context:
    """What ``openssh_errors`` needs to explain a failed login to ``res`` (made in
    ``spawn``'s environment: its ``SSH_AUTH_SOCK``)."""
    from filesync.transport.ssh import openssh_errors

    known = res.files("userknownhostsfile")
    agent = bool((spawn or Spawn()).environ.get("SSH_AUTH_SOCK"))
    return openssh_errors.Context(
        label=res.label, alias=res.alias, host=res.host, port=res.port, user=res.user,
        known_hosts=str(known[0]) if known else "~/.ssh/known_hosts",
        identity_files=res.files("identityfile"),
        agent=agent and res.get("identityagent") != "none",
        tty=_has_tty(),
    )


async def run_ssh(argv: list[str], timeout: float,
                  spawn: Spawn | None = None) -> tuple[int, str, str]:
    """Run ``argv`` (an ``ssh`` that opens no session) to its end, in ``spawn``'s
    context: (status, out, err); ``TimeoutError`` (the process killed) if it takes longer
    than ``timeout``."""
    import asyncio

    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, start_new_session=True,
        **(spawn or Spawn()).kwargs(),
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


class ControlMaster:
    """One ControlMaster that steps ride (see the module docstring).

    ``socket`` is the ControlPath; ``owned`` says filesync started it (and so ends it);
    ``pid`` is the master's process id, for messages and, for a master filesync did not
    start, for telling whether it still runs. ``spawn``: the context every ``ssh`` of
    this connection runs in (its working directory only the login's).
    """

    def __init__(self, ssh: str, alias: str, socket: str, pid: int, *, owned: bool,
                 proc: subprocess.Popen[bytes] | None = None,
                 workdir: Path | None = None, spawn: Spawn | None = None) -> None:
        # Later ssh processes (sessions, the stop) may start long after the working
        # directory of the command that connected is gone: they need none of it.
        spawn = spawn or Spawn()
        self.spawn = Spawn(spawn.env, None, spawn.umask)
        self.ssh = ssh
        self.alias = alias
        self.socket = socket
        self.pid = pid
        self.owned = owned
        self._proc = proc
        self.workdir = workdir

    # -- starting and finding -----------------------------------------------------

    @classmethod
    def start(cls, ssh: str, base: list[str], res: OpenSshSettings, *, accept_new: bool = False,
              connect_timeout: float = 15.0, spawn: Spawn | None = None) -> ControlMaster:
        """Spawn filesync's own master for ``res`` and return at once (see ``ready``)."""
        spawn = spawn or Spawn()
        workdir = runtime_dir(spawn)
        socket = workdir / SOCKET
        # Ours first: for -o options the first value given wins, and the caller's options
        # (in ``base``) may name a ControlPath of their own.
        argv = [*_SHIELD, ssh, "-o", f"ControlPath={socket}", "-o", "ControlMaster=yes",
                "-o", "ControlPersist=no", *base, "-v",
                *_fill_gaps(res, accept_new, connect_timeout),
                *session_overrides(res, forwards=False), "-T", "-x", "--", res.alias, _SESSION]
        try:
            # The log is a file, not a pipe: a ProxyJump child keeps writing to it, and a
            # pipe would never reach its end. No new session: ssh asks for a passphrase on
            # the terminal, if there is one.
            with open(workdir / "master.log", "ab") as err:
                proc = subprocess.Popen(argv, stdin=subprocess.PIPE,
                                        stdout=subprocess.DEVNULL, stderr=err,
                                        **spawn.kwargs())
        except BaseException:
            shutil.rmtree(workdir, ignore_errors=True)
            raise
        return cls(ssh, res.alias, str(socket), proc.pid, owned=True, proc=proc,
                   workdir=workdir, spawn=spawn)

    @classmethod
    async def find(cls, ssh: str, base: list[str], res: OpenSshSettings,
                   spawn: Spawn | None = None) -> ControlMaster | None:
        """The running master that ``res``'s ControlPath leads to (the user's config, or
        the caller's options in ``base``), or None. filesync never stops it."""
        path = res.get("controlpath", "none")
        if path == "none":
            return None
        with contextlib.suppress(TimeoutError, OSError):
            code, _out, err = await run_ssh([ssh, *base, "-O", "check", "--", res.alias], 10,
                                            spawn)
            found = _MASTER_PID.search(err)
            if code == 0 and found:
                return cls(ssh, res.alias, path, int(found.group(1)), owned=False,
                           spawn=spawn)
        return None

    async def ready(self, res: OpenSshSettings, say: Callable[[str], None]) -> None:
        """Wait until the login finished; map its failure to one ``TransportError`` line.

        Polled, not waited for in a thread: a cancelled run must not be held up at exit by
        a thread still waiting on ssh (a passphrase prompt, say). Finely while a handshake
        may finish, coarsely once a human is likely typing."""
        import asyncio

        if not self.owned:
            return
        assert self._proc is not None
        started = time.monotonic()
        try:
            while not os.path.exists(self.socket):
                if self._proc.poll() is not None:
                    text = self.log_tail()
                    if self._proc.returncode == 255:
                        from filesync.transport.ssh import openssh_errors

                        raise openssh_errors.explain(text, error_context(res, self.spawn))
                    raise TransportError(
                        f"the ssh master connection to {res.label} ended right after login "
                        f"({_last_message(text)}); run `ssh -v {res.alias}` to see why")
                await asyncio.sleep(0.002 if time.monotonic() - started < 2 else 0.05)
        except BaseException:
            self.stop_now()
            raise
        for line in self.log_tail().splitlines():
            if line.startswith("Warning: Permanently added"):
                say(f"ssh: {line.strip()}")
        say(f"ssh: logged in to {res.label} (master pid {self.pid})")

    # -- state --------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        """True while the master runs (or, filesync's own, is still logging in)."""
        if self._proc is not None:
            return self._proc.poll() is None
        return pid_alive(self.pid)

    @property
    def log(self) -> Path | None:
        """The master's ``-v`` log (filesync's own master only)."""
        return self.workdir / "master.log" if self.workdir else None

    def log_tail(self, size: int = 1 << 14) -> str:
        """The end of the master's log: what it said last (why it ended, say)."""
        if self.log is None:
            return ""
        with contextlib.suppress(OSError), open(self.log, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - size))
            return f.read().decode(errors="replace")
        return ""

    def client_args(self) -> list[str]:
        """The options that lead a step's ``ssh`` to this master."""
        if self.owned:
            return ["-o", f"ControlPath={self.socket}", "-o", "ControlMaster=no"]
        return []  # the user's (or caller's) ControlPath settings lead to their master

    # -- stopping -----------------------------------------------------------------

    def _exit_argv(self) -> list[str]:
        # No config file: the socket is named exactly (no %-tokens to expand), and the
        # user's Match exec commands need not run again just to end the master.
        return [self.ssh, "-F", "/dev/null", "-o", f"ControlPath={self.socket}",
                "-O", "exit", "--", self.alias]

    async def stop(self) -> None:
        """End filesync's own master through its control socket and remove its directory;
        nothing for a master filesync did not start. Idempotent; never raises."""
        import asyncio

        if not self.owned or self._proc is None:
            return
        proc = self._proc
        if proc.poll() is None and os.path.exists(self.socket):
            if not terminate(self.socket):
                with contextlib.suppress(TimeoutError, OSError):
                    await run_ssh(self._exit_argv(), _STOP_TIMEOUT, self.spawn)
            self._close_input()
            deadline = time.monotonic() + _STOP_TIMEOUT
            while proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.002)
        self._close_input()
        self._last_resort()

    def stop_now(self) -> None:
        """``stop`` without an event loop (at exit, or for a login nobody took over)."""
        if not self.owned or self._proc is None:
            return
        proc = self._proc
        if proc.poll() is None and os.path.exists(self.socket):
            if not terminate(self.socket):
                with contextlib.suppress(subprocess.TimeoutExpired, OSError):
                    subprocess.run(self._exit_argv(), stdin=subprocess.DEVNULL,
                                   capture_output=True, timeout=_STOP_TIMEOUT,
                                   start_new_session=True, check=False, **self.spawn.kwargs())
            self._close_input()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(_STOP_TIMEOUT)
        self._close_input()
        self._last_resort()

    def _close_input(self) -> None:
        # End of input ends the master's own session too: a second way out.
        assert self._proc is not None
        if self._proc.stdin is not None:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()

    def _last_resort(self) -> None:
        """A login still under way (no socket to talk to), or a master that ignored its
        socket: end it through its process handle, then tidy up."""
        assert self._proc is not None
        if self._proc.poll() is None:
            self._proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(_STOP_TIMEOUT)
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)


#: The control socket's protocol (OpenSSH's PROTOCOL.mux): each packet is a uint32
#: length, then a uint32 type and its body; version 4 since OpenSSH 5.6.
MUX_VERSION = 4
MUX_MSG_HELLO = 0x00000001
MUX_C_TERMINATE = 0x10000005
MUX_S_OK = 0x80000001
#: The request id of the one request ``terminate`` makes.
_TERMINATE_ID = 1


def terminate(socket_path: str, timeout: float = _STOP_TIMEOUT) -> bool:
    """Ask the master listening on ``socket_path`` to exit, as ``ssh -O exit`` does, over
    the control socket's own protocol: a hello, then ``MUX_C_TERMINATE``. No ``ssh``
    process is started (a run's end is ~5 ms sooner). True once the master answered OK;
    False for anything else -- no socket, another protocol version, a refusal, a timeout
    -- and the caller then runs ``ssh -O exit``, which says why."""
    try:
        import socket
        import struct
    except ImportError:  # the interpreter is tearing down: ``ssh -O exit`` works then
        return False
    with contextlib.suppress(OSError, EOFError, struct.error), \
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(socket_path)
        sock.sendall(struct.pack(">IIIIII", 8, MUX_MSG_HELLO, MUX_VERSION,
                                 8, MUX_C_TERMINATE, _TERMINATE_ID))
        hello = _mux_packet(sock, struct.unpack)
        if struct.unpack(">II", hello[:8]) != (MUX_MSG_HELLO, MUX_VERSION):
            return False
        try:
            reply = _mux_packet(sock, struct.unpack)
        except EOFError:
            # The master may end before its answer goes out (OpenSSH's mux.c says so;
            # ``ssh -O exit`` takes the closed socket as done, too).
            return True
        return reply[:8] == struct.pack(">II", MUX_S_OK, _TERMINATE_ID)
    return False


def _mux_packet(sock: socket.socket, unpack: Callable[[str, bytes], tuple[Any, ...]]) -> bytes:
    """One packet's body (type first); raises ``EOFError`` if the stream ends first."""
    (size,) = unpack(">I", _mux_read(sock, 4))
    if not 8 <= size <= 1 << 16:
        raise OSError("not a control socket reply")
    return _mux_read(sock, size)


def _mux_read(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError("control socket closed")
        data += chunk
    return data


def _last_message(text: str) -> str:
    from filesync.transport.ssh import openssh_errors

    lines = openssh_errors.messages(text)
    return lines[-1].rstrip(".") if lines else "no message"
