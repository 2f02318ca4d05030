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
