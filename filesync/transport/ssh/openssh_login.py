"""Logging in with the system ``ssh``: choosing the client, ``ssh -G``, and the early login.

Guarantees:

- ``begin`` starts a login without an event loop and returns at once (the CLI calls it
  before it imports the engine, so ssh's handshake overlaps filesync's own start);
  ``connect`` (``openssh``) with the same arguments takes it over and raises what went
  wrong exactly as a login it started itself would. A login nobody takes over ends when
  the process exits.
- Readiness needs no mux round trip: the master's control socket appears once it is
  logged in (``master.ControlMaster``).
- Every failure is one ``TransportError`` line (see ``openssh_errors``).

Standard library only, and no asyncio: the CLI imports this module (and starts the login)
before anything heavier; the waiting half is ``openssh.connect``.
"""

from __future__ import annotations

import atexit
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from filesync.errors import TransportError, UsageError
from filesync.transport.ssh.master import ControlMaster
from filesync.transport.ssh.resolved import Resolved, resolve_now

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


def base_args(ssh_config: Path | None, identity: Path | None, user: str | None,
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


def which_ssh() -> str:
    ssh = shutil.which("ssh")
    if ssh is None:
        raise TransportError("no ssh binary on PATH; install the OpenSSH client "
                             "(openssh-client) or use --ssh-client asyncssh")
    return ssh


#: What ``begin`` and ``connect`` must agree on for one to take over the other's login.
LoginKey = tuple[str, str | None, int | None, Path | None, Path | None, bool, float]


@dataclass
class Pending:
    """A login under way: ``begin`` spawned it, ``connect`` (with the same arguments)
    finishes it. ``error`` is what ``begin`` ran into, raised by ``connect``."""

    key: LoginKey
    ssh: str = ""
    base: list[str] | None = None
    res: Resolved | None = None
    error: TransportError | None = None
    #: filesync's own master, logging in; None when the user's config names a ControlPath
    #: (``connect`` looks for the user's running master first)
    master: ControlMaster | None = None


_PENDING: dict[LoginKey, list[Pending]] = {}
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
    key: LoginKey = (host, user, port, ssh_config, identity, accept_new_host_key, connect_timeout)
    pending = Pending(key)
    try:
        pending.ssh = which_ssh()
        pending.base = base_args(ssh_config, identity, user, port)
        pending.res = resolve_now(pending.ssh, pending.base, host)
        if pending.res.get("controlpath", "none") == "none":
            pending.master = ControlMaster.start(
                pending.ssh, pending.base, pending.res, accept_new=accept_new_host_key,
                connect_timeout=connect_timeout)
    except TransportError as exc:
        pending.error = exc
    global _AT_EXIT
    if not _AT_EXIT:
        _AT_EXIT = atexit.register(end_unused) is not None
    _PENDING.setdefault(key, []).append(pending)
    return pending


def take(key: LoginKey) -> Pending | None:
    """The login ``begin`` started with ``key``, handed over once (None if there is none)."""
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
            if pending.master is not None:
                pending.master.stop_now()
    _PENDING.clear()
