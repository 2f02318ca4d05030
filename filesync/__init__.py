"""filesync: bidirectional, crash-safe file sync over SSH.

The public API is what ``__all__`` names; everything else is internal and may change.

- ``Session`` (blocking, any thread) and ``AsyncSession`` push, pull, sync and report the
  status of ``Mapping``s over one kept connection, returning a ``SessionReport``; this is
  the API for agent frameworks (``docs/library.md``);
- ``Mapping`` describes one synced tree or file (``TWO_WAY`` or ``UPLOAD_ONLY``);
- ``run_pass`` runs one pass (push, pull or sync: ``Direction``) of one local root against
  one remote root over a ``Conduit``, with ``Options``, and returns a ``Report``;
  ``drop_session`` ends the remote helper a conduit keeps between passes;
- ``open_ssh(host, ...)`` opens an SSH conduit with the CLI's client (the system OpenSSH
  client wherever ``ssh`` exists, else asyncssh); ``connect_ssh(SshTarget(...))`` opens
  one with asyncssh; ``Conduit``/``RemoteProcess`` are the protocols a custom transport
  implements;
- ``ExcludeRule`` is the one exclusion rule; ``default_state_dir`` where state lives;
- ``nested_excludes(mapping, mappings)`` is the one ownership rule of mappings synced
  together: the innermost mapping owns a path;
- ``FilesyncError`` is the base of every expected failure (its message names the cause and
  the fix; ``exit_code`` is the CLI's), with one subclass per failure kind.

Names are imported on first use, so ``import filesync`` (and the CLI's cold start) loads
no SSH library until a name that needs one is asked for.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from filesync.errors import (
    BadMapping,
    ConnectionLost,
    FilesyncError,
    LockBusy,
    PatternError,
    RemoteSilent,
    SafetyRefusal,
    SelfSync,
    SessionClosed,
    SessionTimeout,
    TransportError,
    UsageError,
)
from filesync.mapping import TWO_WAY, UPLOAD_ONLY, Mapping, nested_excludes
from filesync.version import __version__

if TYPE_CHECKING:
    from filesync.core.exclude import DEFAULT_EXCLUDED_DIRS, ExcludeRule
    from filesync.core.reconcile import Direction
    from filesync.endpoint.connect import drop_session
    from filesync.host.state import default_state_dir
    from filesync.profile_d import profile_snippet
    from filesync.session import AsyncSession, Session, SessionReport, Watch, WatchLoop
    from filesync.sync.engine import Options, Report, TransferFailed, run_pass
    from filesync.transport.base import Conduit, RemoteProcess
    from filesync.transport.ssh.conduit import SshTarget
    from filesync.transport.ssh.conduit import connect as connect_ssh
    from filesync.transport.target import open_ssh

#: Public name -> (module, attribute), imported on first access.
_LAZY: dict[str, tuple[str, str]] = {
    "DEFAULT_EXCLUDED_DIRS": ("filesync.core.exclude", "DEFAULT_EXCLUDED_DIRS"),
    "ExcludeRule": ("filesync.core.exclude", "ExcludeRule"),
    "Direction": ("filesync.core.reconcile", "Direction"),
    "drop_session": ("filesync.endpoint.connect", "drop_session"),
    "default_state_dir": ("filesync.host.state", "default_state_dir"),
    "profile_snippet": ("filesync.profile_d", "profile_snippet"),
    "AsyncSession": ("filesync.session", "AsyncSession"),
    "Session": ("filesync.session", "Session"),
    "SessionReport": ("filesync.session", "SessionReport"),
    "Watch": ("filesync.session", "Watch"),
    "WatchLoop": ("filesync.session", "WatchLoop"),
    "TransferFailed": ("filesync.sync.engine", "TransferFailed"),
    "Options": ("filesync.sync.engine", "Options"),
    "Report": ("filesync.sync.engine", "Report"),
    "run_pass": ("filesync.sync.engine", "run_pass"),
    "Conduit": ("filesync.transport.base", "Conduit"),
    "RemoteProcess": ("filesync.transport.base", "RemoteProcess"),
    "SshTarget": ("filesync.transport.ssh.conduit", "SshTarget"),
    "connect_ssh": ("filesync.transport.ssh.conduit", "connect"),
    "open_ssh": ("filesync.transport.target", "open_ssh"),
}

__all__ = [
    "DEFAULT_EXCLUDED_DIRS", "TWO_WAY", "UPLOAD_ONLY", "AsyncSession", "BadMapping", "Conduit",
    "ConnectionLost", "Direction", "ExcludeRule", "FilesyncError", "LockBusy", "Mapping",
    "Options", "PatternError", "RemoteProcess", "RemoteSilent", "Report", "SafetyRefusal",
    "SelfSync", "Session", "SessionClosed", "SessionReport", "SessionTimeout", "SshTarget",
    "TransferFailed", "TransportError", "UsageError", "Watch", "WatchLoop", "__version__",
    "connect_ssh",
    "default_state_dir", "drop_session", "nested_excludes", "open_ssh", "profile_snippet",
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
