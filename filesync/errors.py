"""Error classes. Each carries a one-line message that names the cause and the fix."""

from __future__ import annotations


class FilesyncError(Exception):
    """An expected failure: printed as ``filesync: error: <message>``, exit code 1."""

    exit_code = 1

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class UsageError(FilesyncError):
    """Bad command-line input (exit code 2)."""

    exit_code = 2


class SafetyRefusal(FilesyncError):
    """A safety guard refused the whole run before anything changed (exit code 3)."""

    exit_code = 3


class TransportError(FilesyncError):
    """The remote side could not be reached or misbehaved."""


class ConnectionLost(TransportError):
    """The connection dropped mid-run; the next run recovers from the persisted state."""


class RemoteSilent(TransportError):
    """A remote that owed bytes sent nothing for the idle deadline (``--idle-timeout``);
    its process was killed and the pass stopped."""


class LockBusy(FilesyncError):
    """Another run holds the lock of the same (local, remote) pair."""


class PatternError(UsageError):
    """An invalid exclude pattern (exit code 2); the message names the pattern and where it
    came from (``--exclude``, ``ROOT/.filesyncignore:LINE``, a config file's mapping)."""


class BadMapping(UsageError):
    """A mapping that cannot be synced as written (exit code 2), such as a single file
    whose remote side names a different file."""


class SelfSync(SafetyRefusal):
    """The remote root is the local root, contains it or lies inside it: the same tree
    reached twice (localhost, a shared mount). Refused before anything changed (exit 3)."""


class SessionClosed(FilesyncError):
    """A ``Session`` or ``AsyncSession`` was used after ``close()``; open a new one."""


class SessionTimeout(FilesyncError):
    """A session call took longer than its ``timeout``; nothing was half-applied."""


class ShutdownError(FilesyncError):
    """A session call that cannot run because the interpreter is shutting down past the
    point where it could (a finalizer that needs a thread, or a loop thread frozen by
    the shutdown). Sync before exit (an ``atexit`` hook works) or ``close()`` the
    session explicitly."""


class InternalError(FilesyncError):
    """A session call failed in a way filesync did not expect (a bug): the message names
    the original exception, which is also the ``__cause__``. Both sides stay whole (the
    engine journals every change); report it."""
