"""What the user's OpenSSH client configuration says about a host, read as ``ssh HOST`` would.

Guarantees:

- ``SshConfig.load`` reads ``~/.ssh/config`` and ``/etc/ssh/ssh_config`` (those that
  are readable), or only the file given (``ssh -F``; ``/dev/null`` means no config).
  A missing ``-F`` file or an unreadable ``-i`` key is a one-line ``TransportError``
  before anything touches the network.
- ``SshConfig.resolve`` applies the Host/Match blocks for an alias like ssh(1):
  HostName, User (else the local user), Port (else 22), with an explicit user or port
  winning (``ssh -l``/``-p``); IdentityFile, the ``-i`` key first, then the configured
  files or OpenSSH's default key names, files that do not exist skipped as ssh skips
  them; IdentitiesOnly; ProxyJump; UserKnownHostsFile (replaced by an explicit
  known_hosts file; ``none`` means no file) and GlobalKnownHostsFile; whether the user
  chose Ciphers or KexAlgorithms.
- Nothing here connects, loads a key or reads a known_hosts file.
"""

from __future__ import annotations

import getpass
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from filesync.errors import TransportError
from filesync.transport.ssh._asyncssh import asyncssh
from filesync.transport.ssh.destination import DEFAULT_PORT, ssh_label
from filesync.tree.paths import expand_user

__all__ = ["DEFAULT_PORT", "HopSettings", "SshConfig", "SshTarget", "parse_jump"]


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


def _expand(path: str, env: Mapping[str, str] | None) -> Path:
    """A path of the config, with ``%d``, ``%u`` and ``~`` of ``env`` (None: the process's)."""
    values = os.environ if env is None else env
    user = values.get("LOGNAME") or values.get("USER") or getpass.getuser()
    home = expand_user("~", env)
    return Path(expand_user(path.replace("%d", home).replace("%u", user), env))


def _is_port(text: str) -> bool:
    # str.isdigit() also accepts '²' and other digits int() refuses.
    return text.isascii() and text.isdigit()


def parse_jump(spec: str) -> tuple[str | None, str, int | None]:
    """``[user@]host[:port]`` or ``ssh://[user@]host[:port]`` from a ProxyJump list."""
    spec = spec.strip().removeprefix("ssh://").rstrip("/")
    user, _, hostport = spec.rpartition("@")
    host, port = hostport, None
    if hostport.startswith("["):
        host, _, rest = hostport[1:].partition("]")
        if rest.startswith(":") and _is_port(rest[1:]):
            port = int(rest[1:])
    elif hostport.count(":") == 1:
        name, _, port_text = hostport.partition(":")
        if _is_port(port_text):
            host, port = name, int(port_text)
    return user or None, host, port


@dataclass
class HopSettings:
    """What ssh_config says about one hop, as the asyncssh client reads it."""

    alias: str
    host: str
    port: int
    user: str
    jump: str | None
    key_files: list[Path]
    identities_only: bool
    user_known_hosts: list[Path]
    global_known_hosts: list[Path]
    own_ciphers: bool
    own_kex: bool

    @property
    def label(self) -> str:
        return ssh_label(self.user, self.alias, self.host, self.port)

    def jump_hops(self) -> list[tuple[str | None, str, int | None]]:
        """The ProxyJump hops, first first; none without ProxyJump or with ``ProxyJump none``."""
        if not self.jump or self.jump.lower() == "none":
            return []
        return [parse_jump(hop) for hop in self.jump.split(",")]


@dataclass(frozen=True)
class SshConfig:
    """The config files in use and the command-line overrides that apply to every hop."""

    paths: list[Path]
    identity: Path | None
    known_hosts: Path | None
    #: whose home the default files are in (None: the process's environment)
    env: Mapping[str, str] | None = field(default=None, compare=False)

    @property
    def home(self) -> Path:
        return Path(expand_user("~", self.env))

    @classmethod
    def load(
        cls, ssh_config: Path | None, identity: Path | None, known_hosts: Path | None,
        env: Mapping[str, str] | None = None,
    ) -> SshConfig:
        """Check the given files and pick the config files, like ``ssh [-F FILE] [-i KEY]``
        run in ``env`` (its home's ``.ssh``; None: the process's environment)."""
        if ssh_config is not None:
            # Any readable file, /dev/null included (``ssh -F /dev/null``: no config at all).
            if not (ssh_config.exists() and not ssh_config.is_dir()):
                raise TransportError(f"ssh config {ssh_config} does not exist; check the path")
            paths = [ssh_config]
        else:
            home = Path(expand_user("~", env))
            candidates = [home / ".ssh" / "config", Path("/etc/ssh/ssh_config")]
            paths = [p for p in candidates if os.access(p, os.R_OK)]
        if identity is not None and not os.access(identity, os.R_OK):
            raise TransportError(f"identity file {identity} is not readable; check the -i path")
        return cls(paths, identity, known_hosts, env)

    @property
    def path_args(self) -> list[str]:
        """The config files as asyncssh's ``config`` argument."""
        return [str(p) for p in self.paths]

    def resolve(self, alias: str, user: str | None, port: int | None) -> HopSettings:
        """What the config says about ``alias``; ``user``/``port`` win over it when given."""
        try:
            opts = asyncssh.SSHClientConnectionOptions(
                config=self.path_args,
                host=alias,
                port=port if port is not None else (),
                username=user if user is not None else (),
                client_keys=None,  # only reading the config here; keys load at connect
                known_hosts=None,
            )
        except (OSError, ValueError) as exc:
            where = ", ".join(map(str, self.paths)) or "ssh config"
            raise TransportError(f"cannot read {where}: {exc}; fix the ssh config") from exc
        config = opts.config

        def strings(name: str) -> list[str] | None:
            value = config.get(name)
            return [str(v) for v in value] if isinstance(value, list | tuple) else None

        key_files = [self.identity] if self.identity is not None else []
        configured = strings("IdentityFile")
        if configured:
            key_files += [_expand(k, self.env) for k in configured]
        else:
            key_files += [self.home / ".ssh" / name for name in _DEFAULT_KEY_NAMES]
        # ssh(1) skips identity files that do not exist; asyncssh would fail on them.
        key_files = [k for k in dict.fromkeys(key_files) if k.is_file()]

        if self.known_hosts is not None:
            user_files = [self.known_hosts]
        else:
            listed = strings("UserKnownHostsFile")
            if listed is None:
                home_ssh = self.home / ".ssh"
                user_files = [home_ssh / "known_hosts", home_ssh / "known_hosts2"]
            else:
                user_files = [_expand(p, self.env) for p in listed]  # [] means "none"
        global_listed = strings("GlobalKnownHostsFile")
        global_files = (
            [_expand(p, self.env) for p in global_listed]
            if global_listed is not None
            else [Path("/etc/ssh/ssh_known_hosts"), Path("/etc/ssh/ssh_known_hosts2")]
        )
        jump = opts.tunnel if isinstance(opts.tunnel, str) and opts.tunnel else None
        return HopSettings(
            alias=alias,
            host=opts.host,
            port=int(opts.port),
            user=opts.username,
            jump=jump,
            key_files=key_files,
            identities_only=bool(config.get("IdentitiesOnly")),
            user_known_hosts=user_files,
            global_known_hosts=global_files,
            own_ciphers=config.get("Ciphers") is not None,
            own_kex=config.get("KexAlgorithms") is not None,
        )
