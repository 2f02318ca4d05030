"""The context a conduit starts its processes in (``ssh``, the local ``sh``, a ``--via``
command): their environment, working directory and umask.

Guarantees: a ``Spawn`` never changes once made (mypy holds its attributes ``Final``);
``Spawn()`` is the process's own context. Standard library only, and neither ``typing``
nor ``dataclasses`` at run time: the CLI imports this before it spawns ssh's login,
where each of those would cost the login more than all of this path's own code.
"""

from __future__ import annotations

import os

#: ``typing.TYPE_CHECKING`` without importing ``typing`` (mypy and ruff treat the name alike).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any, Final


class Spawn:
    """The context of the processes a conduit starts, each part None for the process's
    own. The agent gives each request its client's, so nothing of the agent process
    changes per request."""

    __slots__ = ("cwd", "env", "umask")

    def __init__(self, env: Mapping[str, str] | None = None, cwd: str | None = None,
                 umask: int | None = None) -> None:
        self.env: Final = env
        self.cwd: Final = cwd
        self.umask: Final = umask

    def __repr__(self) -> str:
        return f"Spawn(env={self.env!r}, cwd={self.cwd!r}, umask={self.umask!r})"

    @property
    def environ(self) -> Mapping[str, str]:
        """The environment to read variables from (``HOME``, ``SSH_AUTH_SOCK``...)."""
        return os.environ if self.env is None else self.env

    def kwargs(self) -> dict[str, Any]:
        """``subprocess``/``asyncio`` keyword arguments that start a process in it."""
        given = {"env": None if self.env is None else dict(self.env), "cwd": self.cwd,
                 "umask": -1 if self.umask is None else self.umask}
        return {k: v for k, v in given.items() if v is not None}
