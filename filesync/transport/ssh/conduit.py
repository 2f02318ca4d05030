"""The SSH conduit: commands run over exec channels of one asyncssh connection.

``connect()`` behaves like ``ssh HOST`` with respect to the user's OpenSSH setup:
``~/.ssh/config`` and ``/etc/ssh/ssh_config`` (or only the file given, like
``ssh -F``), Host aliases, HostName, User, Port, IdentityFile, IdentitiesOnly,
ProxyJump, UserKnownHostsFile, GlobalKnownHostsFile, the ssh-agent and
``~/.ssh/known_hosts``. Host keys are always verified; every failure becomes a
one-line ``TransportError`` that names the cause and the fix.

This is the only module that imports asyncssh (~0.35 s), so the CLI imports it
lazily.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes.util
import getpass
import os
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from filesync.errors import ConnectionLost, TransportError
from filesync.transport.base import Conduit, RemoteProcess

# asyncssh.crypto.pq looks for liboqs at import with ctypes.util.find_library("oqs")
# and ("liboqs"); on Linux each call runs `ldconfig -p` (and may try gcc and ld), ~18 ms
# of every CLI start. liboqs only adds the sntrup761 key exchange, which filesync does
# not want (it prefers curve25519; ML-KEM still comes from `cryptography`), so the
# lookup is answered "not found" for those two names during the import, and the real
# function is put back right after. Where liboqs is installed, sntrup761 is merely
# unavailable; nothing else changes (if asyncssh was imported before, this is a no-op).
_real_find_library = ctypes.util.find_library


def _find_library_without_oqs(name: str) -> str | None:
    return None if name in ("oqs", "liboqs") else _real_find_library(name)


ctypes.util.find_library = _find_library_without_oqs
try:
    import asyncssh
finally:
    ctypes.util.find_library = _real_find_library

__all__ = ["SshConduit", "SshProcess", "SshTarget", "connect"]

DEFAULT_PORT = 22

# AES-GCM runs on AES-NI and is about twice as fast as asyncssh's default first
# choice, chacha20-poly1305. "^" puts these first and keeps asyncssh's defaults after.
_CIPHERS = "^aes128-gcm@openssh.com,aes256-gcm@openssh.com"
# OpenSSH 9.x servers prefer sntrup761x25519 (~125 ms of CPU per connection).
_KEX = "^curve25519-sha256,curve25519-sha256@libssh.org"

# Per-channel flow control. asyncssh's 2 MiB window stalls a single stream on
# any link with latency; 8 MiB lets one exec channel run at cipher speed.
_WINDOW = 8 << 20
_MAX_PKTSIZE = 1 << 17
# Bytes of stderr kept per process (the tail); stderr is drained continuously
# because stdout and stderr share one channel window.
_STDERR_KEEP = 1 << 20
_MAX_JUMP_DEPTH = 8

# Key files OpenSSH (and asyncssh) try when no IdentityFile is configured.
_DEFAULT_KEY_NAMES = (
    "id_ed25519_sk",
    "id_ecdsa_sk",
    "id_ed448",
    "id_ed25519",
    "id_ecdsa",
    "id_rsa",
    "id_dsa",
)


@dataclass
class SshTarget:
    """Where to connect: a host (or ssh_config alias), optionally a user and a port.

    ``user`` and ``port`` override the ssh_config values, like ``ssh -l``/``-p``.
    """

    host: str
    user: str | None = None
    port: int | None = None


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
            self._lost_reason = _reason(exc) if exc else "closed by the server"

    def _lost(self, exc: BaseException | None, what: str) -> ConnectionLost:
        """The error for a failed read/write: a dropped connection, or the command's end."""
        if self._lost_reason is None and isinstance(exc, asyncssh.DisconnectError):
            self._lost_reason = _reason(exc)
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


def _reason(exc: BaseException) -> str:
    if isinstance(exc, asyncssh.DisconnectError):
        text = exc.reason or type(exc).__name__
    elif isinstance(exc, OSError) and exc.strerror:
        text = exc.strerror
    else:
        text = str(exc) or type(exc).__name__
    return " ".join(text.split()).rstrip(".")


def _fmt_host(host: str, port: int) -> str:
    """``host`` for port 22, ``[host]:port`` otherwise (the known_hosts spelling)."""
    return host if port == DEFAULT_PORT else f"[{host}]:{port}"


def _expand(path: str) -> Path:
    return Path(path.replace("%d", str(Path.home())).replace("%u", getpass.getuser())).expanduser()


def _short_key_type(key: asyncssh.SSHKey) -> str:
    alg = key.get_algorithm()
    for prefix, short in (("ssh-ed25519", "ed25519"), ("ecdsa", "ecdsa"), ("ssh-rsa", "rsa")):
        if alg.startswith(prefix):
            return short
    return alg


@dataclass
class _HostKeys:
    """Known-hosts state for one hop: the files in use and what the server showed."""

    user_files: list[Path]
    global_files: list[Path]
    accept_new: bool
    loaded: list[tuple[Path, asyncssh.SSHKnownHosts]] = field(default_factory=list)
    problem: str | None = None  # "unknown" or "changed"
    offered: asyncssh.SSHKey | None = None
    lookup_host: str = ""
    changed_in: Path | None = None
    pending: str | None = None  # known_hosts line to store once logged in

    def load(self) -> asyncssh.SSHKnownHosts:
        merged = asyncssh.SSHKnownHosts()
        for path in (*self.user_files, *self.global_files):
            try:
                text = path.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue  # like ssh(1): a missing known_hosts file is an empty one
            single = asyncssh.SSHKnownHosts()
            for line in text.splitlines():
                # OpenSSH skips lines it cannot parse; asyncssh would reject the file.
                with contextlib.suppress(ValueError):
                    single.load(line)
                    merged.load(line)
            self.loaded.append((path, single))
        return merged

    def check(self, host: str, addr: str, port: int, key: asyncssh.SSHKey) -> bool:
        """Called by asyncssh for a key that matched no known_hosts entry."""
        lookup_port = None if port == DEFAULT_PORT else port
        self.offered = key
        self.lookup_host = _fmt_host(host, port)
        for path, known in self.loaded:
            keys, *_ = known.match(host, addr, lookup_port)
            if keys:
                self.problem, self.changed_in = "changed", path
                return False
        if not self.accept_new:
            self.problem = "unknown"
            return False
        public = key.export_public_key("openssh").decode("ascii").split()
        self.pending = f"{self.lookup_host} {public[0]} {public[1]}\n"
        return True

    def store_pending(self, verbose: Callable[[str], None]) -> None:
        if self.pending is None:
            return
        if not self.user_files:
            verbose(f"ssh: accepted new host key for {self.lookup_host} (UserKnownHostsFile none)")
            return
        path = self.user_files[0]
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with path.open("ab+") as f:
                f.seek(0, os.SEEK_END)
                if f.tell():
                    f.seek(-1, os.SEEK_END)
                    if f.read(1) != b"\n":
                        f.write(b"\n")
                f.write(self.pending.encode("ascii"))
        except OSError as exc:
            raise TransportError(
                f"cannot add the host key of {self.lookup_host} to {path}: {exc.strerror}; "
                "fix the file's permissions"
            ) from exc
        verbose(f"ssh: added host key of {self.lookup_host} to {path}")
        self.pending = None


class _Client(asyncssh.SSHClient):
    def __init__(self, host_keys: _HostKeys) -> None:
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
class _Resolved:
    """What ssh_config says about one hop."""

    alias: str
    host: str
    port: int
    user: str
    jump: str | None
    key_files: list[Path]
    identities_only: bool
    host_keys: _HostKeys
    own_ciphers: bool
    own_kex: bool

    @property
    def label(self) -> str:
        shown = self.host if self.port == DEFAULT_PORT else f"{self.host}:{self.port}"
        if self.alias != self.host:
            shown = f"{self.alias} ({shown})"
        return f"{self.user}@{shown}"


@dataclass
class _Connector:
    config_paths: list[Path]
    identity: Path | None
    accept_new: bool
    known_hosts: Path | None
    connect_timeout: float
    keepalive_interval: float
    verbose: Callable[[str], None]
    hops: list[asyncssh.SSHClientConnection] = field(default_factory=list)

    def resolve(self, alias: str, user: str | None, port: int | None) -> _Resolved:
        try:
            opts = asyncssh.SSHClientConnectionOptions(
                config=[str(p) for p in self.config_paths],
                host=alias,
                port=port if port is not None else (),
                username=user if user is not None else (),
                client_keys=None,  # only reading the config here; keys load in connect()
                known_hosts=None,
            )
        except (OSError, ValueError) as exc:
            where = ", ".join(map(str, self.config_paths)) or "ssh config"
            raise TransportError(f"cannot read {where}: {exc}; fix the ssh config") from exc
        config = opts.config

        def strings(name: str) -> list[str] | None:
            value = config.get(name)
            return [str(v) for v in value] if isinstance(value, list | tuple) else None

        key_files = [self.identity] if self.identity is not None else []
        configured = strings("IdentityFile")
        if configured:
            key_files += [_expand(k) for k in configured]
        else:
            key_files += [Path.home() / ".ssh" / name for name in _DEFAULT_KEY_NAMES]
        # ssh(1) skips identity files that do not exist; asyncssh would fail on them.
        key_files = [k for k in dict.fromkeys(key_files) if k.is_file()]

        if self.known_hosts is not None:
            user_files = [self.known_hosts]
        else:
            listed = strings("UserKnownHostsFile")
            if listed is None:
                home_ssh = Path.home() / ".ssh"
                user_files = [home_ssh / "known_hosts", home_ssh / "known_hosts2"]
            else:
                user_files = [_expand(p) for p in listed]  # [] means "none"
        global_listed = strings("GlobalKnownHostsFile")
        global_files = (
            [_expand(p) for p in global_listed]
            if global_listed is not None
            else [Path("/etc/ssh/ssh_known_hosts"), Path("/etc/ssh/ssh_known_hosts2")]
        )
        jump = opts.tunnel if isinstance(opts.tunnel, str) and opts.tunnel else None
        return _Resolved(
            alias=alias,
            host=opts.host,
            port=int(opts.port),
            user=opts.username,
            jump=jump,
            key_files=key_files,
            identities_only=bool(config.get("IdentitiesOnly")),
            host_keys=_HostKeys(user_files, global_files, self.accept_new),
            own_ciphers=config.get("Ciphers") is not None,
            own_kex=config.get("KexAlgorithms") is not None,
        )

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
    ) -> tuple[asyncssh.SSHClientConnection, _Resolved, _Client]:
        """Connect and log in to one hop, first opening its ProxyJump chain if any."""
        if depth > _MAX_JUMP_DEPTH:
            raise TransportError(
                f"ProxyJump chain for {alias} is longer than {_MAX_JUMP_DEPTH} hops; "
                "check the ssh config for a ProxyJump loop"
            )
        res = self.resolve(alias, user, port)
        if follow_jump and res.jump and res.jump.lower() != "none":
            for hop in res.jump.split(","):
                hop_user, hop_host, hop_port = _parse_jump(hop)
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
        known = res.host_keys.load()
        client = _Client(res.host_keys)
        try:
            conn = await asyncssh.connect(
                res.alias,  # the alias, so asyncssh applies the same ssh_config block
                res.port,
                tunnel=via,  # explicit: asyncssh must not open ProxyJump itself
                config=[str(p) for p in self.config_paths],
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
            )
        except (OSError, ValueError, asyncssh.Error) as exc:
            raise self._explain(exc, res, what) from exc
        res.host_keys.store_pending(self.verbose)
        self.verbose(f"ssh: logged in to {res.label}, cipher {conn.get_extra_info('send_cipher')}")
        return conn, res, client

    def _explain(self, exc: BaseException, res: _Resolved, what: str) -> TransportError:
        """Turn a connect failure into one line naming the cause and the fix."""
        name = f"{what} {res.label}" if what != "host" else res.label
        hk = res.host_keys
        hk_file = str(hk.user_files[0]) if hk.user_files else "~/.ssh/known_hosts"
        if isinstance(exc, asyncssh.HostKeyNotVerifiable) and hk.problem and hk.offered:
            fp = hk.offered.get_fingerprint()
            if hk.problem == "changed":
                return TransportError(
                    f"host key of {name} CHANGED (now {hk.offered.get_algorithm()} {fp}) - "
                    "possibly a man-in-the-middle attack; if the change is expected, remove the "
                    f"old key with `ssh-keygen -R '{hk.lookup_host}' -f {hk.changed_in}` and rerun"
                )
            port_flag = "" if res.port == DEFAULT_PORT else f"-p {res.port} "
            return TransportError(
                f"host key of {name} is unknown ({hk.offered.get_algorithm()} {fp}); after "
                f"checking it, add it with `ssh-keyscan {port_flag}-t "
                f"{_short_key_type(hk.offered)} {res.host} >> {hk_file}`, "
                "or rerun with --accept-new-host-key"
            )
        if isinstance(exc, asyncssh.HostKeyNotVerifiable):
            return TransportError(f"host key of {name} rejected ({_reason(exc)}); check {hk_file}")
        if isinstance(exc, asyncssh.PermissionDenied):
            tried = [str(k) for k in res.key_files]
            if os.environ.get("SSH_AUTH_SOCK"):
                tried.append("ssh-agent" + (" (IdentitiesOnly)" if res.identities_only else ""))
            return TransportError(
                f"authentication as {res.user} on {name} failed (tried: "
                f"{', '.join(tried) or 'no keys found'}); check that your public key is in "
                f"~{res.user}/.ssh/authorized_keys there, pass the right key with -i KEY, "
                "or load it with ssh-add"
            )
        if isinstance(exc, asyncssh.KeyExchangeFailed):
            return TransportError(
                f"cannot agree on SSH algorithms with {name} ({_reason(exc)}); if its host key "
                "type changed, remove the old key with "
                f"`ssh-keygen -R '{_fmt_host(res.host, res.port)}'`"
            )
        if isinstance(exc, asyncssh.ChannelOpenError):
            return TransportError(
                f"jump host could not reach {name} ({_reason(exc)}); check HostName/Port "
                "of the target as seen from the jump host"
            )
        if isinstance(exc, asyncssh.ConnectionLost):
            return TransportError(
                f"{name} closed the connection during login ({_reason(exc)}); check that it "
                "runs sshd on that port and its logs (MaxStartups, AllowUsers)"
            )
        if isinstance(exc, asyncssh.Error):
            return TransportError(
                f"SSH login to {name} failed ({_reason(exc)}); check its sshd logs"
            )
        if isinstance(exc, TimeoutError):
            return TransportError(
                f"connecting to {name} timed out after {self.connect_timeout:g}s; check that the "
                "host is up and reachable (VPN, firewall) and the port is right"
            )
        if isinstance(exc, socket.gaierror):
            return TransportError(
                f"cannot resolve host name {res.host!r} ({_reason(exc)}); check the spelling "
                "or the HostName in your ssh config"
            )
        if isinstance(exc, ConnectionRefusedError):
            return TransportError(
                f"connection to {name} refused; check that sshd runs there and the port is "
                "right (Port in ssh config, or ssh://host:PORT/path)"
            )
        if isinstance(exc, OSError):
            return TransportError(
                f"cannot connect to {name} ({_reason(exc)}); check the network and the address"
            )
        return TransportError(
            f"invalid SSH setup for {name} ({_reason(exc)}); fix the ssh config or key"
        )


def _parse_jump(spec: str) -> tuple[str | None, str, int | None]:
    """``[user@]host[:port]`` or ``ssh://[user@]host[:port]`` from a ProxyJump list."""
    spec = spec.strip().removeprefix("ssh://").rstrip("/")
    user, _, hostport = spec.rpartition("@")
    host, port = hostport, None
    if hostport.startswith("["):
        host, _, rest = hostport[1:].partition("]")
        if rest.startswith(":") and rest[1:].isdigit():
            port = int(rest[1:])
    elif hostport.count(":") == 1:
        name, _, port_text = hostport.partition(":")
        if port_text.isdigit():
            host, port = name, int(port_text)
    return user or None, host, port


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
    missed keepalives.

    Raises ``TransportError`` with a one-line message naming the cause and the fix.
    """
    if ssh_config is not None:
        # Any readable file, /dev/null included (``ssh -F /dev/null``: no config at all).
        if not (ssh_config.exists() and not ssh_config.is_dir()):
            raise TransportError(f"ssh config {ssh_config} does not exist; check the path")
        config_paths = [ssh_config]
    else:
        candidates = [Path.home() / ".ssh" / "config", Path("/etc/ssh/ssh_config")]
        config_paths = [p for p in candidates if os.access(p, os.R_OK)]
    if identity is not None and not os.access(identity, os.R_OK):
        raise TransportError(f"identity file {identity} is not readable; check the -i path")
    connector = _Connector(
        config_paths=config_paths,
        identity=identity,
        accept_new=accept_new_host_key,
        known_hosts=known_hosts,
        connect_timeout=connect_timeout,
        keepalive_interval=keepalive_interval,
        verbose=verbose or (lambda _msg: None),
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
