"""Tar streams of the POSIX fallback: the upload stream's headers, and the fetch stream
read in stream mode and never extracted.

``TarFetch`` hands only regular-file members named exactly like a requested path to
the sink, each once; links, devices, directories, ``..``, absolute and unexpected names
are refused. A member whose size/mtime differs from the listing, or whose file changed
while tar read it (checked after the stream), is reported failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import tarfile
from dataclasses import dataclass, field
from typing import IO, cast

from filesync.core import offthread
from filesync.endpoint.contract import FetchHeader, FetchSink, call_sink
from filesync.endpoint.posix_parse import Listed
from filesync.errors import ConnectionLost
from filesync.transport.base import RemoteProcess
from filesync.tree.wire import Reason, describe

CHUNK = 1 << 20


class Bridge:
    """A blocking ``read`` for ``tarfile`` (in a worker thread) over an async process."""

    def __init__(self, proc: RemoteProcess, loop: asyncio.AbstractEventLoop,
                 pending: bytes = b"") -> None:
        self.proc = proc
        self.loop = loop
        self._reads = [b"", b""]
        self._pending = pending  # already read from the process: the stream's start

    def read(self, n: int = -1) -> bytes:
        if self._pending:
            data, self._pending = self._pending, b""
            self._reads = [self._reads[1], data]
            return data
        want = max(n, 1 << 18)  # tarfile copes with more than it asked for
        data = asyncio.run_coroutine_threadsafe(self.proc.read(want), self.loop).result()
        self._reads = [self._reads[1], data]
        return data

    async def feed(self, parser: TarFetch) -> None:
        """Run ``parser`` over this stream in a thread (it blocks on reads this loop
        serves, so never inline: ``ShutdownError`` once no thread can start)."""
        await offthread.start(parser.run, self, inline=False)

    @property
    def tail(self) -> bytes:
        """The last two reads: tarfile stops reading at the end-of-archive block, so all
        it read past the archive (the start of what follows) is in there."""
        return self._reads[0] + self._reads[1]


@dataclass(slots=True)
class TarFetch:
    """Reads a ``tar -c`` stream of requested files into a sink, refusing everything else.

    ``wanted`` maps each requested relative path to its listing (or ``None`` if it was
    not listed). Only regular-file members named exactly ``path`` or ``./path`` for a
    wanted, not yet delivered path are passed to the sink; their size and mtime must
    agree with the listing. Nothing is ever extracted to the filesystem.
    ``refused`` collects ``(member name, reason)`` for every member not delivered.
    """

    wanted: dict[str, Listed | None]
    sink: FetchSink
    delivered: dict[str, tuple[int, float]] = field(default_factory=dict)
    refused: list[tuple[str, str]] = field(default_factory=list)
    reported: set[str] = field(default_factory=set)

    def run(self, fileobj: IO[bytes] | Bridge) -> None:
        """Consume the stream up to its end-of-archive; ``TransportError`` if it breaks off."""
        try:
            with tarfile.open(fileobj=cast(IO[bytes], fileobj), mode="r|",
                              encoding="utf-8", errors="surrogateescape") as tar:
                for member in tar:
                    self._member(tar, member)
        except tarfile.TarError as exc:
            raise ConnectionLost(
                f"the remote tar stream broke off or is not a tar stream ({exc}); "
                "rerun to continue, nothing was half-applied"
            ) from exc

    def _refuse(self, rel: str | None, name: str, reason: str) -> None:
        self.refused.append((name, reason))
        if rel is not None:
            self.reported.add(rel)
            self.sink.failed(rel, reason)

    def _member(self, tar: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        name = member.name
        rel = name[2:] if name.startswith("./") else name
        if rel not in self.wanted or rel in self.reported or rel in self.delivered:
            self._refuse(None, name, "not a requested file")
            return
        if member.type not in (tarfile.REGTYPE, tarfile.AREGTYPE):
            self._refuse(rel, name, describe(Reason.NOT_REGULAR))
            return
        listed = self.wanted[rel]
        if listed is not None and (
            member.size != listed.size or int(member.mtime // 1) != listed.mtime_ns // 10**9
        ):
            self._refuse(rel, name, describe(Reason.CHANGED))
            return
        mtime_ns = listed.mtime_ns if listed is not None else int(member.mtime * 10**9)
        head = FetchHeader(rel, member.size, mtime_ns, member.mode & 0o7777)
        source = tar.extractfile(member)
        if source is None:  # not reachable for a regular file
            self._refuse(rel, name, describe(Reason.NOT_REGULAR))
            return
        write = call_sink(self.sink.begin, head, path=rel)
        got = 0
        try:
            while chunk := source.read(CHUNK):
                got += len(chunk)
                call_sink(write, chunk, path=rel)
        except BaseException:
            with contextlib.suppress(Exception):
                self.sink.end(head, False, "connection lost")
            self.reported.add(rel)
            raise
        whole = got == member.size
        call_sink(self.sink.end, head, whole, "" if whole else describe(Reason.TORN), path=rel)
        if whole:
            self.delivered[rel] = (member.size, member.mtime)
        else:
            self.reported.add(rel)

    def finish(self, post: dict[str, tuple[int, int, str]],
               errors: dict[str, tuple[Reason, str]]) -> None:
        """Settle every wanted path after the stream: report the missing and the torn.

        ``post`` is the remote's stat of each path after tar read it; a delivered file
        whose stat moved (or vanished) since the listing is revoked as torn.
        """
        for rel, listed in self.wanted.items():
            if rel in self.reported:
                continue
            if rel not in self.delivered:
                gone = (Reason.OS_ERROR, "vanished from the remote")
                self.sink.failed(rel, errors.get(rel, gone)[1])
                continue
            after = post.get(rel)
            size, mtime = self.delivered[rel]
            if after is None:
                torn = True
            elif listed is not None:
                torn = after[2] != listed.token
            else:
                torn = after[0] != size or after[1] // 10**9 != int(mtime // 1)
            if torn:
                self.sink.failed(rel, describe(Reason.TORN))


def header(name: str, size: int, mode: int, mtime_ns: int) -> bytes:
    """A pax tar header for a regular file; the pax mtime keeps the nanoseconds."""
    info = tarfile.TarInfo(name)
    info.size = size
    info.mode = mode & 0o7777
    info.type = tarfile.REGTYPE
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = mtime_ns // 10**9
    if mtime_ns % 10**9 and mtime_ns > 0:
        info.pax_headers = {"mtime": f"{mtime_ns // 10**9}.{mtime_ns % 10**9:09d}"}
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
