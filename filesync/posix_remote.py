"""The POSIX fallback for remotes without python3 (sh, find, tar). Not built yet."""

from __future__ import annotations

from filesync.remote import NoPython, RemoteSession
from filesync.transport.base import Conduit


class PosixSession(RemoteSession):
    """Placeholder until the fallback lands: refuses with the install hint."""

    @classmethod
    async def start(cls, conduit: Conduit) -> RemoteSession:
        raise NoPython("the remote has no python3; install python3 there")
