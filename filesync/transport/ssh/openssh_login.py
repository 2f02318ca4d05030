"""Logging in with the system ``ssh``: choosing the client, ``ssh -G``, and the early login.

Guarantees:

- ``begin`` starts a login without an event loop and returns at once (the CLI calls it
  before it imports the engine, so ssh's handshake overlaps filesync's own start). It
  returns an explicit handle, ``Pending``, that the caller passes down to ``connect``
  (``openssh``; no registry): with the same arguments, ``connect`` takes it over and
  raises what went wrong exactly as a login it started itself would. A login nobody
  takes over is ended by ``Pending.close``, or else with the process.
- Readiness needs no mux round trip: the master's control socket appears once it is
  logged in (``master.ControlMaster``).
- Every failure is one ``TransportError`` line (see ``openssh_errors``).

Standard library only, and neither asyncio nor ``typing`` nor ``dataclasses`` at run time:
the CLI imports this module (and starts the login) before anything heavier, and each of
those would cost the login more than all of this path's own code
(``tests/cli/test_cold_path.py``); the waiting half is ``openssh.connect``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from filesync.errors import TransportError, UsageError
from filesync.transport.ssh.destination import CONNECT_TIMEOUT
from filesync.transport.ssh.master import ControlMaster
from filesync.transport.ssh.resolved import Lookup

#: ``typing.TYPE_CHECKING`` without importing ``typing`` (mypy and ruff treat the name alike).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Final

    from filesync.transport.ssh.resolved import OpenSshSettings

#: The environment variable that picks the SSH client when ``--ssh-client`` is not given.
ENV_CLIENT = "FILESYNC_SSH_CLIENT"
CLIENTS = ("openssh", "asyncssh")

def choose_client(requested: str | None, env: Mapping[str, str] | None = None) -> str:
    """``openssh`` or ``asyncssh``: the request, else $FILESYNC_SSH_CLIENT, else openssh
    whenever an ``ssh`` binary is on PATH (both of ``env``, None: the process's). Raises
    ``UsageError`` for another name and ``TransportError`` when openssh is asked for but
    there is no ``ssh``."""
    env = os.environ if env is None else env
    choice = requested or env.get(ENV_CLIENT, "")
    if choice and choice not in CLIENTS:
        where = f"ssh client {choice!r}" if requested else f"{ENV_CLIENT}={choice!r}"
        raise UsageError(f"{where} is not a client; set it to openssh or asyncssh")
    if not choice:
        return "openssh" if _which(env) else "asyncssh"
    if choice == "openssh" and not _which(env):
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


def _which(env: Mapping[str, str] | None) -> str | None:
    return shutil.which("ssh", path=None if env is None else env.get("PATH", os.defpath))


def which_ssh(env: Mapping[str, str] | None = None) -> str:
    """The ``ssh`` on ``env``'s PATH (None: the process's)."""
    ssh = _which(env)
    if ssh is None:
        raise TransportError("no ssh binary on PATH; install the OpenSSH client "
                             "(openssh-client) or use --ssh-client asyncssh")
    return ssh


#: What ``begin`` and ``connect`` must agree on for one to take over the other's login.
LoginKey = tuple[str, str | None, int | None, Path | None, Path | None, bool, float]


class Pending:
    """A login under way: ``begin`` spawned it, and the caller hands it to ``connect``
    (through ``open_conduit(..., login=)``), which finishes it; ``error`` is what
    ``begin`` ran into, raised by ``connect``. ``close`` ends it if nobody took it."""

    __slots__ = ("base", "error", "key", "master", "res", "ssh", "taken")

    def __init__(self, key: LoginKey) -> None:
        self.key: Final = key
        self.ssh = ""
        self.base: list[str] | None = None
        self.res: OpenSshSettings | None = None
        self.error: TransportError | None = None
        #: filesync's own master, logging in; None when the user's config names a
        #: ControlPath (``connect`` looks for the user's running master first)
        self.master: ControlMaster | None = None
        #: set by the ``connect`` that took the login over (the conduit then owns the master)
        self.taken = False

    def close(self) -> None:
        """End the login unless a conduit took it over (the command failed before it
        connected). Without an event loop; idempotent. A login nobody closes still ends
        with the process (``master.ControlMaster``)."""
        if not self.taken and self.master is not None:
            self.taken = True
            self.master.stop_now()


def begin(
    host: str,
    user: str | None = None,
    port: int | None = None,
    *,
    ssh_config: Path | None = None,
    identity: Path | None = None,
    accept_new_host_key: bool = False,
    connect_timeout: float = CONNECT_TIMEOUT,
) -> Pending:
    """Start logging in to ``host`` now, without an event loop, and return at once.

    The CLI calls this (through ``begin_all``) right after parsing, so that ssh's
    handshake runs while the rest of filesync is imported and the host is walked; it
    passes the handle down to the ``connect`` of that host, which takes the login over if
    its arguments are the same (and raises what went wrong, as it would have). Never
    raises.
    """
    return begin_all([(host, user, port)], ssh_config=ssh_config, identity=identity,
                     accept_new_host_key=accept_new_host_key,
                     connect_timeout=connect_timeout)[0]


def begin_all(
    destinations: Sequence[tuple[str, str | None, int | None]],
    *,
    ssh_config: Path | None = None,
    identity: Path | None = None,
    accept_new_host_key: bool = False,
    connect_timeout: float = CONNECT_TIMEOUT,
) -> list[Pending]:
    """``begin`` for each ``(host, user, port)``, in order: their ``ssh -G`` lookups run
    side by side, and each login is spawned as soon as its own lookup has answered (a
    fan-out's last login does not wait for every other host's config lookup). Never
    raises."""
    pendings: list[Pending] = []
    lookups: list[Lookup | None] = []
    for host, user, port in destinations:
        pending = Pending((host, user, port, ssh_config, identity, accept_new_host_key,
                           connect_timeout))
        pendings.append(pending)
        try:
            pending.ssh = which_ssh()
            pending.base = base_args(ssh_config, identity, user, port)
            lookups.append(Lookup(pending.ssh, pending.base, host))
        except TransportError as exc:
            pending.error = exc
            lookups.append(None)
    for pending, lookup in zip(pendings, lookups, strict=True):
        if lookup is None:
            continue
        try:
            pending.res = lookup.result()
            if pending.res.get("controlpath", "none") == "none":
                assert pending.base is not None
                pending.master = ControlMaster.start(
                    pending.ssh, pending.base, pending.res, accept_new=accept_new_host_key,
                    connect_timeout=connect_timeout)
        except TransportError as exc:
            pending.error = exc
    return pendings
