"""SSH destinations: which one a REMOTE argument names, and how messages name one, by both
SSH clients alike.

Standard library only, and light: the CLI reads a REMOTE's destination here before it
spawns ssh's login (``filesync.transport.target.parse_remote`` reads it here too).
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit

from filesync.errors import UsageError

#: The SSH port a label leaves unsaid.
DEFAULT_PORT = 22
#: How long a login may take to connect when the caller does not say (seconds).
CONNECT_TIMEOUT = 15.0

_SCP = re.compile(r"^(?:(?P<user>[^@/:]+)@)?(?P<host>\[[^\]]+\]|[^@/:\[\]]+):(?P<path>.*)$")

#: (host, user, port, path) of an SSH REMOTE; user and port None where it names none.
SshRemote = tuple[str, str | None, int | None, str]


def ssh_remote(text: str) -> SshRemote | None:
    """The destination and path of REMOTE ``text`` if it is an SSH form
    (``[user@]host:path``, an empty path being the remote home, or
    ``ssh://[user@]host[:port]/path``, where ``/~/p`` is home-relative); None for a
    local path or a ``file://`` URL. Raises ``UsageError`` for an ``ssh://`` URL
    without a host or with a bad port."""
    if text.startswith("file://"):
        return None
    if text.startswith("ssh://"):
        return _parse_url(text)
    match = _SCP.match(text)
    if match and "/" not in text.split(":", 1)[0]:
        return match.group("host").strip("[]"), match.group("user"), None, match.group(
            "path") or "."
    return None


def _parse_url(text: str) -> SshRemote:
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
    return url.hostname, url.username, port, path


def ssh_label(user: str, alias: str, host: str, port: int) -> str:
    """``user@alias (host:port)``: the alias only when it is not the host name, the port
    only when it is not 22."""
    shown = host if port == DEFAULT_PORT else f"{host}:{port}"
    if alias != host:
        shown = f"{alias} ({shown})"
    return f"{user}@{shown}"
