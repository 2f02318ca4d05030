"""REMOTE strings, and opening a conduit to the remote they name.

Forms:
- ``[user@]host:path`` (scp style; an empty path is the remote home);
- ``ssh://[user@]host[:port]/path`` (the path is absolute; ``/~/p`` is home-relative);
- a local path or ``file:///path`` (the local transport);
- any path together with ``--via 'CMD'``: a shell reached through CMD, such as
  ``docker exec -i web`` or ``kubectl exec -i pod --``.
"""

from __future__ import annotations

import copy
import os
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final
from urllib.parse import unquote, urlsplit

from filesync.core.record import FrozenRecord
from filesync.errors import FilesyncError, TransportError, UsageError
from filesync.transport.base import Conduit
from filesync.transport.spawn import Spawn
from filesync.transport.ssh.destination import CONNECT_TIMEOUT, ssh_remote
from filesync.transport.ssh.options import check_ssh_options
from filesync.tree.paths import expand_user

if TYPE_CHECKING:
    from filesync.transport.ssh.openssh_login import Pending

#: the context of a connection made by default: the process's (one, as the dataclass had)
_NO_SPAWN = Spawn()


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


def parse_remote(text: str, via: str | None = None, *, cwd: str | None = None,
                 env: Mapping[str, str] | None = None) -> Target:
    """Parse a REMOTE argument; raise ``UsageError`` naming the accepted forms. A local
    path is made absolute against ``cwd`` and ``env``'s ``~`` (None: the process's)."""
    if not text:
        raise UsageError("REMOTE is empty; give [user@]host:path, ssh://host/path or a path")
    if via is not None:
        via_argv(via)  # a command line that cannot run is bad input, found before any pass
        return Target("via", text, via=via)
    ssh = ssh_remote(text)
    if ssh is not None:
        host, user, port, path = ssh
        return Target("ssh", path, host, user, port)
    if text.startswith("file://"):
        return Target("local", _absolute(unquote(urlsplit(text).path), cwd))
    path = _absolute(expand_user(text, env), cwd)
    # A trailing '/' is kept: it says a single file goes inside that directory (as cp).
    return Target("local", path + "/" if text.endswith("/") and path != "/" else path)


def _absolute(path: str, cwd: str | None) -> str:
    return os.path.normpath(os.path.join(cwd, path)) if cwd else os.path.abspath(path)


def via_argv(via: str) -> list[str]:
    """The argv of a ``--via`` command line; ``UsageError`` if it is empty or unparsable."""
    try:
        argv = shlex.split(via)
    except ValueError as exc:
        raise UsageError(f"--via {via!r} is not a command line ({exc}); quote it as for sh, "
                         "e.g. --via 'docker exec -i NAME'") from None
    if not argv:
        raise UsageError("--via needs a command, such as --via 'docker exec -i NAME'")
    return argv


def via_error(target: Target, exc: FilesyncError) -> FilesyncError:
    """``exc`` naming the ``--via`` command it came through, if it is a transport failure
    of a ``via`` target: "the remote helper did not start" alone does not say that the
    shell at fault is the one ``--via`` reached."""
    if target.kind != "via" or not isinstance(exc, TransportError):
        return exc
    named = copy.copy(exc)  # same class and attributes (a partial report, say)
    named.message = f"through --via {target.via!r}: {exc.message}"
    named.args = (named.message,)
    return named


class ConnectOptions(FrozenRecord):
    """How a conduit is opened; equal options reach a remote the same way (a pool key).

    Paths are used as given: the caller makes them absolute if the working directory may
    change before the connection is made (the CLI does). ``spawn`` is the context the
    connection is made in: its environment (``HOME``, ``SSH_AUTH_SOCK``,
    ``XDG_RUNTIME_DIR``, ``PATH``, ``$FILESYNC_SSH_CLIENT``) is read and given whole to
    the ``ssh``, ``sh`` or ``--via`` command spawned, which also get its working
    directory and umask. ``log`` and ``spawn`` are not part of equality: a pool that
    serves several contexts keys by what matters in them (the agent does).

    A ``FrozenRecord``, not a dataclass: every CLI run imports this module, and creating
    a dataclass costs ~1 ms of CPU (``filesync.core.record``).
    """

    __slots__ = ("accept_new_host_key", "connect_timeout", "identity", "log", "spawn",
                 "ssh_client", "ssh_config", "ssh_options")
    _fields = ("ssh_config", "identity", "accept_new_host_key", "connect_timeout", "log",
               "ssh_client", "ssh_options", "spawn")
    _uncompared = frozenset({"log", "spawn"})

    def __init__(self, ssh_config: Path | None = None, identity: Path | None = None,
                 accept_new_host_key: bool = False, connect_timeout: float = CONNECT_TIMEOUT,
                 log: Callable[[str], None] | None = None, ssh_client: str | None = None,
                 ssh_options: tuple[str, ...] = (), spawn: Spawn = _NO_SPAWN) -> None:
        self.ssh_config: Final = ssh_config
        self.identity: Final = identity
        self.accept_new_host_key: Final = accept_new_host_key
        self.connect_timeout: Final = connect_timeout
        self.log: Final = log
        self.ssh_client: Final = ssh_client  # "openssh" or "asyncssh"; None: see choose_client
        #: more ``ssh`` options (the system ssh only), such as ("-o", "ControlPath=PATH")
        self.ssh_options: Final = ssh_options
        self.spawn: Final = spawn
        self._check()

    def _check(self) -> None:
        if not self.connect_timeout > 0:
            raise ValueError(f"connect_timeout must be positive, not {self.connect_timeout!r}")


async def open_conduit(target: Target, opts: ConnectOptions,
                       login: Pending | None = None) -> Conduit:
    """Open the conduit for ``target``. Only the asyncssh client pulls in asyncssh.
    ``login``: the OpenSSH login the CLI began early for ``target`` (``openssh.begin``)."""
    from filesync.transport.local import CommandConduit, local_conduit

    if target.kind == "local":
        return local_conduit(opts.spawn)
    if target.kind == "via":
        return CommandConduit(via_argv(target.via), f"via:{target.via}", opts.spawn)
    from filesync.transport.ssh import openssh

    if openssh.choose_client(opts.ssh_client, opts.spawn.environ) == "openssh":
        return await openssh.connect(
            target.host, target.user, target.port,
            ssh_config=opts.ssh_config,
            identity=opts.identity,
            accept_new_host_key=opts.accept_new_host_key,
            connect_timeout=opts.connect_timeout,
            ssh_options=opts.ssh_options,
            verbose=opts.log,
            login=login,
            spawn=opts.spawn,
        )
    if opts.ssh_options:
        raise UsageError("ssh_options need the system ssh (OpenSSH), not asyncssh; "
                         "leave them out or use ssh_client='openssh'")
    from filesync.transport.ssh import conduit as ssh

    return await ssh.connect(
        ssh.SshTarget(target.host, target.user, target.port),
        ssh_config=opts.ssh_config,
        identity=opts.identity,
        accept_new_host_key=opts.accept_new_host_key,
        connect_timeout=opts.connect_timeout,
        verbose=opts.log,
        env=opts.spawn.env,
    )


async def open_ssh(
    host: str,
    *,
    user: str | None = None,
    port: int | None = None,
    ssh_config: str | os.PathLike[str] | None = None,
    identity: str | os.PathLike[str] | None = None,
    accept_new_host_key: bool = False,
    ssh_client: str | None = None,
    connect_timeout: float = CONNECT_TIMEOUT,
    ssh_options: Sequence[str] = (),
    log: Callable[[str], None] | None = None,
) -> Conduit:
    """An authenticated SSH conduit to ``host`` (a Host of the ssh config, or a hostname),
    over the CLI's client: the system OpenSSH client whenever ``ssh`` is on PATH (the
    user's whole config applies; one ControlMaster, every remote process a multiplexed
    session on it), else asyncssh; ``ssh_client`` ("openssh", "asyncssh") or
    ``$FILESYNC_SSH_CLIENT`` chooses. ``ssh_options``: more options for the system ssh
    (``["-o", "ControlPath=PATH"]`` rides the caller's running master, and leaves it
    running). Paths take ``str`` or ``os.PathLike`` and expand ``~``. Raises
    ``TransportError`` (one line: the cause and the fix) when it cannot log in,
    ``UsageError`` for an unknown client. Close the conduit when done."""
    def path(p: str | os.PathLike[str] | None) -> Path | None:
        return None if p is None else Path(os.path.expanduser(os.fspath(p))).absolute()

    return await open_conduit(
        Target("ssh", ".", host, user, port),
        ConnectOptions(ssh_config=path(ssh_config), identity=path(identity),
                       accept_new_host_key=accept_new_host_key,
                       connect_timeout=connect_timeout, log=log, ssh_client=ssh_client,
                       ssh_options=tuple(check_ssh_options(ssh_options))),
    )
