"""REMOTE strings, and opening a conduit to the remote they name.

Forms:
- ``[user@]host:path`` (scp style; an empty path is the remote home);
- ``ssh://[user@]host[:port]/path`` (the path is absolute; ``/~/p`` is home-relative);
- a local path or ``file:///path`` (the local transport);
- any path together with ``--via 'CMD'``: a shell reached through CMD, such as
  ``docker exec -i web`` or ``kubectl exec -i pod --``.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from filesync.errors import UsageError
from filesync.transport.base import Conduit

_SCP = re.compile(r"^(?:(?P<user>[^@/:]+)@)?(?P<host>\[[^\]]+\]|[^@/:\[\]]+):(?P<path>.*)$")


@dataclass(frozen=True)
class Target:
    """Where the remote tree lives and how to reach it."""

    kind: str  # "local", "ssh" or "via"
    path: str
    host: str = ""
    user: str | None = None
    port: int | None = None
    via: str = ""

    def label(self) -> str:
        if self.kind == "ssh":
            user = f"{self.user}@" if self.user else ""
            return f"{user}{self.host}:{self.path}"
        if self.kind == "via":
            return f"via {self.via!r}:{self.path}"
        return self.path


def parse_remote(text: str, via: str | None = None) -> Target:
    """Parse a REMOTE argument; raise ``UsageError`` naming the accepted forms."""
    if not text:
        raise UsageError("REMOTE is empty; give [user@]host:path, ssh://host/path or a path")
    if via:
        return Target("via", text, via=via)
    if text.startswith("file://"):
        return Target("local", os.path.abspath(unquote(urlsplit(text).path)))
    if text.startswith("ssh://"):
        return _parse_url(text)
    match = _SCP.match(text)
    if match and "/" not in text.split(":", 1)[0]:
        host = match.group("host").strip("[]")
        return Target("ssh", match.group("path") or ".", host, match.group("user"))
    return Target("local", os.path.abspath(os.path.expanduser(text)))


def _parse_url(text: str) -> Target:
    url = urlsplit(text)
    if not url.hostname:
        raise UsageError(f"{text!r} has no host; write ssh://[user@]host[:port]/path")
    try:
        port = url.port
    except ValueError as exc:
        raise UsageError(f"{text!r} has an invalid port; write ssh://host:PORT/path") from exc
    path = unquote(url.path) or "."
    if path.startswith("/~"):
        path = path[1:]
    return Target("ssh", path, url.hostname, url.username, port)


@dataclass
class ConnectOptions:
    """Connection settings from the command line."""

    ssh_config: Path | None = None
    identity: Path | None = None
    accept_new_host_key: bool = False
    connect_timeout: float = 15.0
    log: Callable[[str], None] | None = None
    ssh_client: str | None = None  # "openssh" or "asyncssh"; None: see choose_client


async def open_conduit(target: Target, opts: ConnectOptions) -> Conduit:
    """Open the conduit for ``target``. Only the asyncssh client pulls in asyncssh."""
    from filesync.transport.local import CommandConduit, local_conduit

    if target.kind == "local":
        return local_conduit()
    if target.kind == "via":
        argv = shlex.split(target.via)
        if not argv:
            raise UsageError("--via needs a command, such as --via 'docker exec -i NAME'")
        return CommandConduit(argv, f"via:{target.via}")
    from filesync.transport.ssh import openssh

    if openssh.choose_client(opts.ssh_client) == "openssh":
        return await openssh.connect(
            target.host, target.user, target.port,
            ssh_config=opts.ssh_config,
            identity=opts.identity,
            accept_new_host_key=opts.accept_new_host_key,
            connect_timeout=opts.connect_timeout,
            verbose=opts.log,
        )
    from filesync.transport.ssh import conduit as ssh

    return await ssh.connect(
        ssh.SshTarget(target.host, target.user, target.port),
        ssh_config=opts.ssh_config,
        identity=opts.identity,
        accept_new_host_key=opts.accept_new_host_key,
        connect_timeout=opts.connect_timeout,
        verbose=opts.log,
    )
