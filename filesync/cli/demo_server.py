"""An in-process SSH server for ``filesync demo`` and for tests that need no root.

It lives with the demo at the CLI layer, not in ``filesync.transport``: no production
connection ever uses it.

Exec requests run ``/bin/sh -c COMMAND`` as a real subprocess in ``home`` (with
``HOME=home``), so the engine's ``python3 -c`` helper runs exactly as it would
behind OpenSSH's sshd. SFTP is served too, relative paths starting at ``home``.
Only the generated client key is accepted; keys live in a private temp dir that
``close()`` removes.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import os
import posixpath
import shutil
import signal
import tempfile
from pathlib import Path

from filesync.transport.ssh._asyncssh import asyncssh

__all__ = ["InProcessServer", "start_server"]

_CHUNK = 1 << 16
_WINDOW = 8 << 20
_MAX_PKTSIZE = 1 << 17
_ALIAS = "demo"


class InProcessServer:
    """A running server. Connect with ``ssh_config`` (Host ``demo``) or the fields."""

    host: str
    port: int
    home: Path
    #: Private key (ed25519) authorised for any user name.
    client_key: Path
    #: known_hosts file holding this server's host key.
    known_hosts: Path
    #: OpenSSH-style config with ``Host demo`` (HostName, Port, User, IdentityFile,
    #: IdentitiesOnly, UserKnownHostsFile), usable by asyncssh and ``ssh -F``.
    ssh_config: Path

    def __init__(
        self,
        host: str,
        port: int,
        home: Path,
        keydir: Path,
        acceptor: asyncssh.SSHAcceptor,
        conns: set[asyncssh.SSHServerConnection],
        tasks: set[asyncio.Task[None]],
    ) -> None:
        self.host = host
        self.port = port
        self.home = home
        self.client_key = keydir / "client_ed25519"
        self.known_hosts = keydir / "known_hosts"
        self.ssh_config = keydir / "ssh_config"
        self._keydir = keydir
        self._acceptor = acceptor
        self._conns = conns
        self._tasks = tasks
        self._closed = False

    def drop_connections(self) -> None:
        """Cut every client connection without an SSH goodbye, like a network failure."""
        for conn in list(self._conns):
            conn.abort()

    async def close(self) -> None:
        """Stop listening, close every connection, end their commands, remove the keys.

        Idempotent.
        """
        if self._closed:
            return
        self._closed = True
        self._acceptor.close()
        for conn in list(self._conns):
            conn.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._acceptor.wait_closed(), 5)
        if self._tasks:
            # Handlers kill their subprocess once the channel is gone.
            await asyncio.wait(list(self._tasks), timeout=5)
        shutil.rmtree(self._keydir, ignore_errors=True)


class _Server(asyncssh.SSHServer):
    def __init__(self, conns: set[asyncssh.SSHServerConnection]) -> None:
        self._conns = conns
        self._conn: asyncssh.SSHServerConnection | None = None

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self._conn = conn
        self._conns.add(conn)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._conn is not None:
            self._conns.discard(self._conn)


class _HomeSFTPServer(asyncssh.SFTPServer):
    """SFTP with relative paths (and ``.``) starting at the home directory, like sshd."""

    def __init__(self, chan: asyncssh.SSHServerChannel[bytes], home: Path) -> None:
        super().__init__(chan)
        self._home = os.fsencode(home)

    def map_path(self, path: bytes) -> bytes:
        return path if path.startswith(b"/") else posixpath.join(self._home, path)


def _kill_group(proc: asyncio.subprocess.Process, sig: int = signal.SIGKILL) -> None:
    if proc.returncode is not None:
        return  # reaped: its process group id may belong to someone else by now
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


async def _pump_stdin(
    process: asyncssh.SSHServerProcess[bytes], proc: asyncio.subprocess.Process
) -> None:
    stdin = proc.stdin
    assert stdin is not None
    try:
        while True:
            try:
                data = await process.stdin.read(_CHUNK)
            except asyncssh.SignalReceived as sig:
                # The client's kill()/terminate(): deliver it to the whole command.
                signum = getattr(signal, f"SIG{sig.signal}", None)
                if signum is not None:
                    _kill_group(proc, signum)
                continue
            except (asyncssh.BreakReceived, asyncssh.TerminalSizeChanged):
                continue
            if not data:
                break
            stdin.write(data)
            await stdin.drain()
    except (BrokenPipeError, ConnectionResetError):
        pass  # the command stopped reading; its exit status tells the client why
    except (OSError, asyncssh.Error):
        _kill_group(proc)  # the client went away: hang up like sshd does
    finally:
        with contextlib.suppress(OSError):
            stdin.close()


async def _pump_out(
    source: asyncio.StreamReader,
    target: asyncssh.SSHWriter[bytes],
    proc: asyncio.subprocess.Process,
) -> None:
    try:
        while data := await source.read(_CHUNK):
            target.write(data)
            await target.drain()  # backpressure: stop reading the pipe while the window is full
    except (OSError, asyncssh.Error):
        _kill_group(proc)


async def _hangup_on_close(
    process: asyncssh.SSHServerProcess[bytes], proc: asyncio.subprocess.Process
) -> None:
    # A channel closed (or connection lost) before the command ended: nobody can
    # read its output any more, so end it instead of leaving it running.
    await process.wait_closed()
    _kill_group(proc)


async def _run(process: asyncssh.SSHServerProcess[bytes], home: Path) -> None:
    command = process.command
    argv = ["/bin/sh", "-c", command] if command is not None else ["/bin/sh"]
    env = {
        "HOME": str(home),
        "PWD": str(home),
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "SHELL": "/bin/sh",
        "USER": process.get_extra_info("username") or getpass.getuser(),
        "LOGNAME": process.get_extra_info("username") or getpass.getuser(),
    }
    # Like Debian's sshd (AcceptEnv LANG LC_*).
    for name, value in (process.env or {}).items():
        key = name.decode() if isinstance(name, bytes) else str(name)
        if key == "LANG" or key.startswith("LC_"):
            env[key] = value.decode() if isinstance(value, bytes) else str(value)
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=home,
            env=env,
            start_new_session=True,  # so a kill reaches the command's children too
        )
    except OSError as exc:
        with contextlib.suppress(OSError, asyncssh.Error):
            process.stderr.write(f"cannot start /bin/sh: {exc.strerror}\n".encode())
            process.exit(127)
        return
    assert proc.stdout is not None and proc.stderr is not None
    stdin_task = asyncio.create_task(_pump_stdin(process, proc))
    hangup_task = asyncio.create_task(_hangup_on_close(process, proc))
    try:
        await asyncio.gather(
            _pump_out(proc.stdout, process.stdout, proc),
            _pump_out(proc.stderr, process.stderr, proc),
        )
        # Exit only after the command and all its output are done, or the client
        # sees the channel close before the last bytes (tar: "unexpected EOF").
        code = await proc.wait()
    finally:
        if proc.returncode is None:
            _kill_group(proc)
            await proc.wait()
        for task in (stdin_task, hangup_task):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    with contextlib.suppress(OSError, asyncssh.Error):
        if code >= 0:
            process.exit(code)
        else:
            process.exit_with_signal(signal.Signals(-code).name.removeprefix("SIG"))


async def start_server(home: Path, *, host: str = "127.0.0.1", port: int = 0) -> InProcessServer:
    """Listen on ``host:port`` (0 = a free port) and serve commands running in ``home``.

    Returns once the server accepts connections. The returned ``ssh_config``,
    ``known_hosts`` and ``client_key`` let ``filesync.transport.ssh.conduit.connect`` (or
    ``ssh -F``) log in with full host key checking.
    """
    home = home.resolve()
    keydir = Path(tempfile.mkdtemp(prefix="filesync-sshd-"))
    host_key = asyncssh.generate_private_key("ssh-ed25519")
    client_key = asyncssh.generate_private_key("ssh-ed25519", comment="filesync-demo")
    client_key.write_private_key(keydir / "client_ed25519")
    client_key.write_public_key(keydir / "client_ed25519.pub")
    (keydir / "client_ed25519").chmod(0o600)
    authorized = asyncssh.import_authorized_keys(
        client_key.export_public_key("openssh").decode("ascii")
    )
    conns: set[asyncssh.SSHServerConnection] = set()
    tasks: set[asyncio.Task[None]] = set()

    def process_factory(process: asyncssh.SSHServerProcess[bytes]) -> None:
        # A tracked task, so close() can wait for every command to be reaped.
        task = asyncio.get_running_loop().create_task(_run(process, home))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    try:
        acceptor = await asyncssh.listen(
            host,
            port,
            server_factory=lambda: _Server(conns),
            server_host_keys=[host_key],
            authorized_client_keys=authorized,
            process_factory=process_factory,
            sftp_factory=lambda chan: _HomeSFTPServer(chan, home),
            encoding=None,
            window=_WINDOW,
            max_pktsize=_MAX_PKTSIZE,
            allow_scp=False,
            password_auth=False,
            kbdint_auth=False,
        )
    except BaseException:
        shutil.rmtree(keydir, ignore_errors=True)
        raise
    bound = acceptor.get_port()
    server = InProcessServer(host, bound, home, keydir, acceptor, conns, tasks)
    entry = host if bound == 22 else f"[{host}]:{bound}"
    public = host_key.export_public_key("openssh").decode("ascii").split()
    server.known_hosts.write_text(f"{entry} {public[0]} {public[1]}\n")
    server.ssh_config.write_text(
        f"Host {_ALIAS}\n"
        f"    HostName {host}\n"
        f"    Port {bound}\n"
        f"    User {getpass.getuser()}\n"
        f'    IdentityFile "{server.client_key}"\n'
        "    IdentitiesOnly yes\n"
        f'    UserKnownHostsFile "{server.known_hosts}"\n'
        "    StrictHostKeyChecking yes\n"
    )
    return server
