"""Where passes get their conduits: a pool keyed by the target and the connect options.

``Conduits`` opens one conduit per ``acquire`` and closes it on ``release``; the persistent
agent subclasses it to keep conduits open between commands, keyed by ``Target`` (less its
path) and ``ConnectOptions``, both frozen values. ``acquire`` says whether the conduit was
reused, so that a pass that finds a reused connection dead can be retried once on a fresh
one (a pass that failed on a dead connection changed nothing).

The pool knows nothing of what runs on a conduit: a layer above that started something
there (the endpoint, its helper) ends it in ``end``, which ``release`` calls before
closing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from filesync.transport.base import Conduit
from filesync.transport.target import ConnectOptions, Target, open_conduit

if TYPE_CHECKING:
    from filesync.transport.ssh.openssh_login import Pending


class Conduits:
    """Opens a conduit per ``acquire``; ``release`` ends what runs on it and closes it.
    ``logins``: OpenSSH logins begun early (the CLI's, ``openssh.begin``), per target,
    each handed to the first connection to its target."""

    def __init__(self, logins: dict[Target, Pending] | None = None) -> None:
        self._logins = dict(logins or {})

    async def acquire(self, target: Target, opts: ConnectOptions) -> tuple[Conduit, bool]:
        """A conduit to ``target`` and whether it was reused (never, here)."""
        return await open_conduit(target, opts, self._logins.pop(target, None)), False

    async def release(self, conduit: Conduit, healthy: bool) -> None:
        """Done with ``conduit``; ``healthy``: its last use ended well, so end it politely."""
        await self.end(conduit, healthy)
        await conduit.close()

    async def end(self, conduit: Conduit, healthy: bool) -> None:
        """Hook run before a conduit is closed; nothing runs on a bare conduit."""
