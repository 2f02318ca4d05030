"""filesync: bidirectional, crash-safe file sync over SSH.

The public API is what ``__all__`` names; everything else is internal and may change.

- ``Mapping`` describes one synced tree (``TWO_WAY`` or ``UPLOAD_ONLY``);
- ``run_pass`` runs one pass (push, pull or sync: ``Direction``) of one local root against
  one remote root over a ``Conduit``, with ``Options``, and returns a ``Report``;
  ``drop_session`` ends the remote helper a conduit keeps between passes;
- ``connect_ssh(SshTarget(...))`` opens an SSH conduit; ``Conduit``/``RemoteProcess`` are
  the protocols a custom transport implements;
- ``ExcludeRule`` is the one exclusion rule; ``default_state_dir`` where state lives;
- ``FilesyncError`` is the base of every expected failure (its message names the cause and
  the fix; ``exit_code`` is the CLI's), with one subclass per failure kind.

Names are imported on first use, so ``import filesync`` (and the CLI's cold start) loads
no SSH library until a name that needs one is asked for.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from filesync.errors import (
    ConnectionLost,
    FilesyncError,
    LockBusy,
    RemoteSilent,
    SafetyRefusal,
    TransportError,
    UsageError,
)
from filesync.mapping import TWO_WAY, UPLOAD_ONLY, Mapping
from filesync.version import __version__

if TYPE_CHECKING:
    from filesync.core.exclude import DEFAULT_EXCLUDED_DIRS, ExcludeRule
    from filesync.core.reconcile import Direction
    from filesync.endpoint.connect import drop_session
    from filesync.host.state import default_state_dir
    from filesync.profile_d import profile_snippet
    from filesync.sync.engine import Options, Report, run_pass
    from filesync.transport.base import Conduit, RemoteProcess
    from filesync.transport.ssh.conduit import SshTarget
    from filesync.transport.ssh.conduit import connect as connect_ssh

#: Public name -> (module, attribute), imported on first access.
_LAZY: dict[str, tuple[str, str]] = {
    "DEFAULT_EXCLUDED_DIRS": ("filesync.core.exclude", "DEFAULT_EXCLUDED_DIRS"),
    "ExcludeRule": ("filesync.core.exclude", "ExcludeRule"),
    "Direction": ("filesync.core.reconcile", "Direction"),
    "drop_session": ("filesync.endpoint.connect", "drop_session"),
    "default_state_dir": ("filesync.host.state", "default_state_dir"),
    "profile_snippet": ("filesync.profile_d", "profile_snippet"),
    "Options": ("filesync.sync.engine", "Options"),
    "Report": ("filesync.sync.engine", "Report"),
    "run_pass": ("filesync.sync.engine", "run_pass"),
    "Conduit": ("filesync.transport.base", "Conduit"),
    "RemoteProcess": ("filesync.transport.base", "RemoteProcess"),
    "SshTarget": ("filesync.transport.ssh.conduit", "SshTarget"),
    "connect_ssh": ("filesync.transport.ssh.conduit", "connect"),
}

__all__ = [
    "DEFAULT_EXCLUDED_DIRS", "TWO_WAY", "UPLOAD_ONLY", "Conduit", "ConnectionLost", "Direction",
    "ExcludeRule", "FilesyncError", "LockBusy", "Mapping", "Options", "RemoteProcess",
    "RemoteSilent", "Report", "SafetyRefusal", "SshTarget", "TransportError", "UsageError",
    "__version__", "connect_ssh", "default_state_dir", "drop_session", "profile_snippet",
    "run_pass",
]  # fmt: skip


def __getattr__(name: str) -> Any:
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'filesync' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
