"""filesync: bidirectional, crash-safe file sync over SSH.

The public API is the Session tier, what ``__all__`` names (``docs/library.md``); every
other module is internal and may change:

- ``Session`` (blocking, any thread, teardown from ``atexit`` and finalizers included)
  and ``AsyncSession`` push, pull, sync and report the status of ``Mapping``s over one
  kept connection, returning a ``SessionReport``;
- ``Mapping`` describes one synced tree or file (``TWO_WAY`` or ``UPLOAD_ONLY``);
  ``nested_excludes(mapping, mappings)`` is the one ownership rule of mappings synced
  together (the innermost mapping owns a path);
- ``Session.watch`` / ``AsyncSession.watch`` sync continuously and return a ``Watch`` /
  ``WatchLoop`` handle whose ``stop()`` runs one last pass;
- the reports: ``Report`` (one pass), ``SessionReport`` (one call), ``Change`` and its
  ``ChangeAction`` (a ``StrEnum``: each member equals its JSON string);
- ``FilesyncError`` is the base of every failure a call raises (its message names the
  cause and the fix; ``exit_code`` is the CLI's), with one subclass per failure kind;
- custom transports: ``Conduit``/``RemoteProcess`` are the protocols one implements, and
  ``open_ssh(host, ...)`` opens an SSH conduit with the CLI's client, to share with one's
  own commands;
- ``default_state_dir`` is where state lives by default; ``DEFAULT_EXCLUDED_DIRS`` the
  directories pruned by default; ``profile_snippet`` a PATH snippet for
  ``/etc/profile.d`` (docs/terminal.md).

Names are imported on first use, so ``import filesync`` (and the CLI's cold start) loads
no SSH library until a name that needs one is asked for. What the CLI loads before it
spawns ssh's login delays the login, so this package itself loads only the errors, the
version and ``core.deferred`` (which makes the names lazy): not even ``typing`` or
``dataclasses`` (``Mapping``'s) at run time.
"""

from __future__ import annotations

from filesync.core.deferred import lazy_names
from filesync.errors import (
    BadMapping,
    ConnectionLost,
    FilesyncError,
    InternalError,
    LockBusy,
    PatternError,
    RemoteSilent,
    SafetyRefusal,
    SelfSync,
    SessionClosed,
    SessionTimeout,
    ShutdownError,
    TransportError,
    UsageError,
)
from filesync.version import __version__

#: ``typing.TYPE_CHECKING`` without importing ``typing`` (mypy and ruff treat the name alike).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from filesync.core.exclude import DEFAULT_EXCLUDED_DIRS
    from filesync.host.state import default_state_dir
    from filesync.mapping import TWO_WAY, UPLOAD_ONLY, Mapping, nested_excludes
    from filesync.profile_d import profile_snippet
    from filesync.session import AsyncSession, Session, SessionReport, Watch, WatchLoop
    from filesync.sync.changes import Change, ChangeAction
    from filesync.sync.engine import Report, TransferFailed
    from filesync.transport.base import Conduit, RemoteProcess
    from filesync.transport.target import open_ssh

__all__ = [
    "DEFAULT_EXCLUDED_DIRS", "TWO_WAY", "UPLOAD_ONLY", "AsyncSession", "BadMapping", "Change",
    "ChangeAction", "Conduit", "ConnectionLost", "FilesyncError", "InternalError", "LockBusy",
    "Mapping", "PatternError", "RemoteProcess", "RemoteSilent", "Report", "SafetyRefusal",
    "SelfSync", "Session", "SessionClosed", "SessionReport", "SessionTimeout", "ShutdownError",
    "TransferFailed", "TransportError", "UsageError", "Watch", "WatchLoop", "__version__",
    "default_state_dir", "nested_excludes", "open_ssh", "profile_snippet",
]  # fmt: skip

#: Public name -> the module defining it, imported on first access.
_LAZY: dict[str, str] = {
    "DEFAULT_EXCLUDED_DIRS": "filesync.core.exclude",
    "default_state_dir": "filesync.host.state",
    "TWO_WAY": "filesync.mapping",
    "UPLOAD_ONLY": "filesync.mapping",
    "Mapping": "filesync.mapping",
    "nested_excludes": "filesync.mapping",
    "profile_snippet": "filesync.profile_d",
    "AsyncSession": "filesync.session",
    "Session": "filesync.session",
    "SessionReport": "filesync.session",
    "Watch": "filesync.session",
    "WatchLoop": "filesync.session",
    "Change": "filesync.sync.changes",
    "ChangeAction": "filesync.sync.changes",
    "TransferFailed": "filesync.sync.engine",
    "Report": "filesync.sync.engine",
    "Conduit": "filesync.transport.base",
    "RemoteProcess": "filesync.transport.base",
    "open_ssh": "filesync.transport.target",
}

__getattr__, __dir__ = lazy_names(__name__, _LAZY, __all__)
