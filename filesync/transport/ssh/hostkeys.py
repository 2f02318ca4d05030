"""Host key verification against known_hosts files, as ssh(1) with StrictHostKeyChecking.

Guarantees:

- The files are read like OpenSSH reads them: the user files, then the global ones; a
  missing file counts as empty and an unparsable line is skipped, never the whole file.
- A key that matches no entry is "changed" if any loaded file lists another key for that
  host (any key type): always refused, ``accept_new`` or not. Otherwise it is "unknown":
  refused, unless ``accept_new``; then it is appended as ``host`` (port 22) or
  ``[host]:port``, type and key, to the first user file, creating its directory (0700)
  and never gluing the line to a last line that has no newline. It is written only by
  ``store_pending``, i.e. after the login succeeded; with ``UserKnownHostsFile none`` it
  is accepted for this connection and not stored.
- ``refusal`` turns a refused key into one ``TransportError`` line that shows the
  offered key's type and fingerprint and the exact command that fixes it
  (``ssh-keyscan ... >> FILE``, ``ssh-keygen -R HOST -f FILE``) or the
  ``--accept-new-host-key`` flag.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from filesync.errors import TransportError
from filesync.transport.ssh._asyncssh import asyncssh, reason
from filesync.transport.ssh.destination import DEFAULT_PORT
from filesync.transport.ssh.openssh_errors import unknown_host_key

__all__ = ["HostKeys", "fmt_host"]


def fmt_host(host: str, port: int) -> str:
    """``host`` for port 22, ``[host]:port`` otherwise (the known_hosts spelling)."""
    return host if port == DEFAULT_PORT else f"[{host}]:{port}"


def _short_key_type(key: asyncssh.SSHKey) -> str:
    alg = key.get_algorithm()
    for prefix, short in (("ssh-ed25519", "ed25519"), ("ecdsa", "ecdsa"), ("ssh-rsa", "rsa")):
        if alg.startswith(prefix):
            return short
    return alg


@dataclass
class HostKeys:
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
        """Read every file; the merged entries, for asyncssh's own first check."""
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
        self.lookup_host = fmt_host(host, port)
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
        """Append the key accepted as new, if any, to the first user file."""
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

    def refusal(self, exc: BaseException, name: str, host: str, port: int) -> TransportError | None:
        """The one-line error if ``exc`` is a refused host key of ``name``; else ``None``.

        ``host`` and ``port`` are where ``name`` was reached (HostName, Port).
        """
        if not isinstance(exc, asyncssh.HostKeyNotVerifiable):
            return None
        hk_file = str(self.user_files[0]) if self.user_files else "~/.ssh/known_hosts"
        if self.problem and self.offered:
            fp = self.offered.get_fingerprint()
            if self.problem == "changed":
                return TransportError(
                    f"host key of {name} CHANGED (now {self.offered.get_algorithm()} {fp}) - "
                    "possibly a man-in-the-middle attack; if the change is expected, remove the "
                    f"old key with `ssh-keygen -R '{self.lookup_host}' -f {self.changed_in}` "
                    "and rerun"
                )
            return unknown_host_key(name, f"{self.offered.get_algorithm()} {fp}", host, port,
                                    _short_key_type(self.offered), hk_file)
        return TransportError(f"host key of {name} rejected ({reason(exc)}); check {hk_file}")
