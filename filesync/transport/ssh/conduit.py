"""The SSH conduit: commands run over exec channels of one asyncssh connection.

``connect()`` behaves like ``ssh HOST`` with respect to the user's OpenSSH setup
(``config``: ``~/.ssh/config`` and ``/etc/ssh/ssh_config``, or only the file given,
like ``ssh -F``; Host aliases, HostName, User, Port, IdentityFile, IdentitiesOnly,
ProxyJump, UserKnownHostsFile, GlobalKnownHostsFile), the ssh-agent and
``~/.ssh/known_hosts`` (``hostkeys``). Host keys are always verified, on every hop;
every failure to connect becomes a one-line ``TransportError`` that names the cause
and the fix.

Guarantees of a connected ``SshConduit``:

- Each ``start()`` is one exec channel of the one connection (plus its ProxyJump
  hops), binary stdio, an 8 MiB window; stderr is drained continuously (its last MiB
  kept) so an unread stderr never stalls stdout.
- Liveness: once the connection drops, ``alive`` is false and every read, write and
  ``start()`` raises ``ConnectionLost`` saying the connection was lost and that a rerun
  continues; a command that merely ended early is reported as that command's end,
  never as a lost connection.
- ``close()`` kills the running commands and closes the connection, then its hops
  (last first). It is idempotent; after it nothing can start.

asyncssh is slow to import and is imported only by this package, so the CLI imports
it lazily.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from filesync.errors import ConnectionLost, TransportError
from filesync.transport.base import Conduit, RemoteProcess
from filesync.transport.ssh._asyncssh import asyncssh, reason
from filesync.transport.ssh.config import HopSettings, SshConfig, SshTarget
from filesync.transport.ssh.hostkeys import HostKeys, fmt_host

__all__ = ["SshConduit", "SshProcess", "SshTarget", "connect"]

# AES-GCM runs on AES-NI, so it costs less CPU than asyncssh's default first choice,
# chacha20-poly1305. "^" puts these first and keeps asyncssh's defaults after.
_CIPHERS = "^aes128-gcm@openssh.com,aes256-gcm@openssh.com"
# OpenSSH 9.x servers prefer sntrup761x25519, whose CPU cost every connection would pay.
_KEX = "^curve25519-sha256,curve25519-sha256@libssh.org"

# Per-channel flow control. asyncssh's 2 MiB window stalls a single stream on
# any link with latency; 8 MiB lets one exec channel run at cipher speed.
_WINDOW = 8 << 20
_MAX_PKTSIZE = 1 << 17
# Bytes of stderr kept per process (the tail); stderr is drained continuously
# because stdout and stderr share one channel window.
_STDERR_KEEP = 1 << 20
_MAX_JUMP_DEPTH = 8


# --------------------------------------------------------------------------- processes


class SshProcess(RemoteProcess):
    """A command running in one exec channel of the conduit's connection."""

    def __init__(self, proc: asyncssh.SSHClientProcess[bytes], conduit: SshConduit) -> None:
        self._proc = proc
        self._conduit = conduit
        self._killed = False
        self._stderr = bytearray()
        self._stderr_task = asyncio.create_task(self._drain_stderr())

    async def _drain_stderr(self) -> None:
        # An unread stderr would fill the shared channel window and stall stdout.
        reader = self._proc.stderr
        with contextlib.suppress(Exception):
            while chunk := await reader.read(1 << 16):
                self._stderr += chunk
                if len(self._stderr) > _STDERR_KEEP:
                    del self._stderr[: len(self._stderr) - _STDERR_KEEP]

    async def write(self, data: bytes) -> None:
        """Send ``data`` to stdin; returns once the channel accepted it (flow control).

        Raises ``ConnectionLost`` if the connection dropped or the command closed its input.
        """
        try:
            self._proc.stdin.write(data)
            await self._proc.stdin.drain()
        except (OSError, asyncssh.Error) as exc:
            raise self._conduit._lost(exc, "stopped reading its input") from exc
        self._conduit._sent += len(data)

    async def write_eof(self) -> None:
        """Close stdin. Never raises: a dead channel has no stdin left to close."""
        with contextlib.suppress(OSError, asyncssh.Error):
            self._proc.stdin.write_eof()

    async def readexactly(self, n: int) -> bytes:
        """Return exactly ``n`` bytes of stdout, or raise ``ConnectionLost``."""
        try:
            data = await self._proc.stdout.readexactly(n)
        except asyncio.IncompleteReadError as exc:
            raise self._conduit._lost(None, "ended mid-stream") from exc
        except (OSError, asyncssh.Error) as exc:
            raise self._conduit._lost(exc, "ended mid-stream") from exc
        self._conduit._received += n
        return data

    async def read(self, n: int) -> bytes:
        """Return up to ``n`` bytes of stdout; ``b""`` at its end.

        Raises ``ConnectionLost`` when the connection drops instead of faking an end.
        """
        try:
            data = await self._proc.stdout.read(n)
        except (OSError, asyncssh.Error) as exc:
            raise self._conduit._lost(exc, "ended mid-stream") from exc
        if not data and self._conduit._lost_reason is not None and self._proc.returncode is None:
            raise self._conduit._lost(None, "ended mid-stream")  # EOF from the drop, not the end
        self._conduit._received += len(data)
        return data

    async def read_stderr(self) -> bytes:
        """Return the command's stderr (its last MiB), waiting for its end."""
        await self._stderr_task
        return bytes(self._stderr)

    async def wait(self) -> int:
        """Wait for the command to end; its exit status, or ``-N`` if signal N ended it.

        Raises ``ConnectionLost`` if the connection dropped before the status arrived.
        """
        await self._proc.wait_closed()
        code = self._proc.returncode
        if code is not None:
            return code
        if self._killed:
            return -signal.SIGKILL
        if self._conduit._lost_reason is not None:
            raise self._conduit._lost(None, "ended without an exit status")
        return 255  # what ssh(1) reports when the server sends no status

    def kill(self) -> None:
        """Ask the server to SIGKILL the command and close its channel; does not wait."""
        self._killed = True
        with contextlib.suppress(OSError, asyncssh.Error):
            self._proc.kill()
        self._proc.close()


# --------------------------------------------------------------------------- conduit


class SshConduit(Conduit):
    """A conduit over one authenticated SSH connection (plus its ProxyJump hops)."""

    def __init__(
        self,
        conn: asyncssh.SSHClientConnection,
        hops: list[asyncssh.SSHClientConnection],
        identity: str,
        label: str,
        client: _Client,
    ) -> None:
        self._conn = conn
        self._hops = hops
        self.identity = identity
        self._label = label
        self._sent = 0
        self._received = 0
        self._procs: list[SshProcess] = []
        self._closed = False
        client.on_lost = self._connection_lost
        self._lost_reason: str | None = None

    @property
    def alive(self) -> bool:
        return not self._closed and self._lost_reason is None

    def _connection_lost(self, exc: Exception | None) -> None:
        if not self._closed:
            self._lost_reason = reason(exc) if exc else "closed by the server"

    def _lost(self, exc: BaseException | None, what: str) -> ConnectionLost:
        """The error for a failed read/write: a dropped connection, or the command's end."""
        if self._lost_reason is None and isinstance(exc, asyncssh.DisconnectError):
            self._lost_reason = reason(exc)
        if self._closed:
            return ConnectionLost(f"connection to {self._label} was closed by filesync itself")
        if self._lost_reason is not None:
            return ConnectionLost(
                f"connection to {self._label} lost ({self._lost_reason}); "
                "rerun to continue, nothing was half-applied"
            )
        return ConnectionLost(
            f"remote command on {self._label} {what}; see its stderr, then rerun to continue"
        )

    @property
    def cipher(self) -> str:
        """The negotiated client-to-server cipher, such as ``aes128-gcm@openssh.com``."""
        return str(self._conn.get_extra_info("send_cipher", ""))

    async def start(self, command: str) -> RemoteProcess:
        """Start ``command`` through the login shell in a new exec channel (binary stdio).

        Raises ``ConnectionLost`` if the connection is gone, ``TransportError`` if the
        server refuses the channel.
        """
        if self._closed or self._lost_reason is not None:
            raise self._lost(None, "could not start")
        try:
            proc = await self._conn.create_process(
                command, encoding=None, window=_WINDOW, max_pktsize=_MAX_PKTSIZE
            )
        except asyncssh.ChannelOpenError as exc:
            raise TransportError(
                f"{self._label} refused to run a command ({exc.reason}); "
                "check that the account has a shell and sshd allows sessions"
            ) from exc
        except (OSError, asyncssh.Error) as exc:
            raise self._lost(exc, "could not start") from exc
        wrapped = SshProcess(proc, self)
        # Ended commands need no kill at close(); dropping them keeps a long run's list short.
        self._procs = [p for p in self._procs if not p._proc.is_closing()]
        self._procs.append(wrapped)
        return wrapped

    async def close(self) -> None:
        """Kill the running commands and close the connection and its jump hops. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for proc in self._procs:
            proc.kill()
        self._procs.clear()
        for conn in (self._conn, *reversed(self._hops)):
            conn.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.wait_closed(), 5)

    @property
    def bytes_sent(self) -> int:
        return self._sent

    @property
    def bytes_received(self) -> int:
        return self._received


# --------------------------------------------------------------------------- connecting


class _Client(asyncssh.SSHClient):
    """Hands asyncssh's host key callback to ``HostKeys`` and reports the connection's loss."""

    def __init__(self, host_keys: HostKeys) -> None:
        self._host_keys = host_keys
        self.on_lost: Callable[[Exception | None], None] | None = None

    def validate_host_public_key(
        self, host: str, addr: str, port: int, key: asyncssh.SSHKey
    ) -> bool:
        return self._host_keys.check(host, addr, port, key)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.on_lost is not None:
            self.on_lost(exc)


@dataclass
class _Connector:
    config: SshConfig
    accept_new: bool
    connect_timeout: float
    keepalive_interval: float
    verbose: Callable[[str], None]
    #: the environment the connection is made in (None: the process's): its agent
    env: Mapping[str, str] | None = None
    hops: list[asyncssh.SSHClientConnection] = field(default_factory=list)

    async def open(
        self,
        alias: str,
        user: str | None,
        port: int | None,
        *,
        via: asyncssh.SSHClientConnection | None,
        follow_jump: bool,
        depth: int,
        what: str,
    ) -> tuple[asyncssh.SSHClientConnection, HopSettings, _Client]:
        """Connect and log in to one hop, first opening its ProxyJump chain if any."""
        if depth > _MAX_JUMP_DEPTH:
            raise TransportError(
                f"ProxyJump chain for {alias} is longer than {_MAX_JUMP_DEPTH} hops; "
                "check the ssh config for a ProxyJump loop"
            )
        res = self.config.resolve(alias, user, port)
        if follow_jump:
            for hop_user, hop_host, hop_port in res.jump_hops():
                via, _, _ = await self.open(
                    hop_host,
                    hop_user,
                    hop_port,
                    via=via,
                    follow_jump=via is None,
                    depth=depth + 1,
                    what="jump host",
                )
                self.hops.append(via)
        self.verbose(
            f"ssh: connecting to {res.label}"
            + (f" via {res.jump}" if res.jump else "")
            + f"; keys: {', '.join(map(str, res.key_files)) or 'none'}"
        )
        host_keys = HostKeys(res.user_known_hosts, res.global_known_hosts, self.accept_new)
        known = host_keys.load()
        client = _Client(host_keys)
        try:
            conn = await asyncssh.connect(
                res.alias,  # the alias, so asyncssh applies the same ssh_config block
                res.port,
                tunnel=via,  # explicit: asyncssh must not open ProxyJump itself
                config=self.config.path_args,
                client_factory=lambda: client,
                username=res.user,
                known_hosts=known,
                client_keys=[str(k) for k in res.key_files],
                ignore_encrypted=True,  # passphrase keys are used through the agent
                encryption_algs=() if res.own_ciphers else _CIPHERS,
                kex_algs=() if res.own_kex else _KEX,
                compression_algs=None,
                connect_timeout=self.connect_timeout,
                login_timeout=self.connect_timeout,
                keepalive_interval=self.keepalive_interval,
                keepalive_count_max=3,
                window=_WINDOW,
                max_pktsize=_MAX_PKTSIZE,
                request_pty=False,
                # asyncssh reads the process's SSH_AUTH_SOCK; another environment's is given
                **({} if self.env is None else {"agent_path": self.env.get("SSH_AUTH_SOCK")}),
            )
        except (OSError, ValueError, asyncssh.Error) as exc:
            raise self._explain(exc, res, host_keys, what) from exc
        host_keys.store_pending(self.verbose)
        self.verbose(f"ssh: logged in to {res.label}, cipher {conn.get_extra_info('send_cipher')}")
        return conn, res, client

    def _explain(
        self, exc: BaseException, res: HopSettings, host_keys: HostKeys, what: str
    ) -> TransportError:
        """Turn a connect failure into one line naming the cause and the fix."""
        name = f"{what} {res.label}" if what != "host" else res.label
        refused = host_keys.refusal(exc, name, res.host, res.port)
        if refused is not None:
            return refused
        if isinstance(exc, asyncssh.PermissionDenied):
            tried = [str(k) for k in res.key_files]
            if (os.environ if self.env is None else self.env).get("SSH_AUTH_SOCK"):
                tried.append("ssh-agent" + (" (IdentitiesOnly)" if res.identities_only else ""))
            return TransportError(
                f"authentication as {res.user} on {name} failed (tried: "
                f"{', '.join(tried) or 'no keys found'}); check that your public key is in "
                f"~{res.user}/.ssh/authorized_keys there, pass the right key with -i KEY, "
                "or load it with ssh-add"
            )
        if isinstance(exc, asyncssh.KeyExchangeFailed):
            return TransportError(
                f"cannot agree on SSH algorithms with {name} ({reason(exc)}); if its host key "
                "type changed, remove the old key with "
                f"`ssh-keygen -R '{fmt_host(res.host, res.port)}'`"
            )
        if isinstance(exc, asyncssh.ChannelOpenError):
            return TransportError(
                f"jump host could not reach {name} ({reason(exc)}); check HostName/Port "
                "of the target as seen from the jump host"
            )
        if isinstance(exc, asyncssh.ConnectionLost):
            return TransportError(
                f"{name} closed the connection during login ({reason(exc)}); check that it "
                "runs sshd on that port and its logs (MaxStartups, AllowUsers)"
            )
        if isinstance(exc, asyncssh.Error):
            return TransportError(
                f"SSH login to {name} failed ({reason(exc)}); check its sshd logs"
            )
        if isinstance(exc, TimeoutError):
            return TransportError(
                f"connecting to {name} timed out after {self.connect_timeout:g}s; check that the "
                "host is up and reachable (VPN, firewall) and the port is right"
            )
        if isinstance(exc, socket.gaierror):
            return TransportError(
                f"cannot resolve host name {res.host!r} ({reason(exc)}); check the spelling "
                "or the HostName in your ssh config"
            )
        if isinstance(exc, ConnectionRefusedError):
            return TransportError(
                f"connection to {name} refused; check that sshd runs there and the port is "
                "right (Port in ssh config, or ssh://host:PORT/path)"
            )
        if isinstance(exc, OSError):
            return TransportError(
                f"cannot connect to {name} ({reason(exc)}); check the network and the address"
            )
        return TransportError(
            f"invalid SSH setup for {name} ({reason(exc)}); fix the ssh config or key"
        )


async def connect(
    target: SshTarget,
    *,
    ssh_config: Path | None = None,
    identity: Path | None = None,
    accept_new_host_key: bool = False,
    known_hosts: Path | None = None,
    connect_timeout: float = 15.0,
    keepalive_interval: float = 15.0,
    verbose: Callable[[str], None] | None = None,
    env: Mapping[str, str] | None = None,
) -> SshConduit:
    """Open an authenticated SSH connection to ``target`` and return its conduit.

    Guarantees, on success: the server's host key matched the known_hosts files in
    use (``known_hosts``, else UserKnownHostsFile, else ``~/.ssh/known_hosts``; plus
    the global files), or it was unknown, ``accept_new_host_key`` was set and it has
    been appended to the first of those files. A changed key is always refused.

    ``ssh_config`` replaces ``~/.ssh/config`` and ``/etc/ssh/ssh_config`` (``ssh -F``).
    ``identity`` is tried before the configured keys (``ssh -i``), on every hop.
    ``known_hosts`` and ``accept_new_host_key`` also apply to ProxyJump hops, so the
    advice in a refusal is always actionable. ``connect_timeout`` bounds TCP connect,
    key exchange and login of each hop; a silent server is given up on after three
    missed keepalives. ``env``: the environment it is made in (the home of the default
    files, the ssh agent's socket); None: the process's.

    Raises ``TransportError`` with a one-line message naming the cause and the fix.
    """
    connector = _Connector(
        config=SshConfig.load(ssh_config, identity, known_hosts, env),
        accept_new=accept_new_host_key,
        connect_timeout=connect_timeout,
        keepalive_interval=keepalive_interval,
        verbose=verbose or (lambda _msg: None),
        env=env,
    )
    try:
        conn, res, client = await connector.open(
            target.host,
            target.user,
            target.port,
            via=None,
            follow_jump=True,
            depth=0,
            what="host",
        )
    except BaseException:
        for hop in reversed(connector.hops):
            hop.close()
        raise
    host = res.host.lower()
    if ":" in host:
        host = f"[{host}]"
    identity_str = f"ssh://{res.user}@{host}:{res.port}"
    return SshConduit(conn, connector.hops, identity_str, res.label, client)
