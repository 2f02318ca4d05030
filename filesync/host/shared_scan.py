"""Host-side work shared by the concurrent passes of one command (a fan-out).

A ``HostScans`` is made per command run (never module state) and handed to each pass
through ``run_pass``'s ``host_scans``. It shares three things, each only where sharing cannot
change what a pass decides:

- **One walk per (root, exclusion rule).** The first pass walks; the others await the
  same walk and get their own copy of the listing (a pass drops unreadable and unsafe
  entries from its copy). The walk's start time comes with it, so the racy-timestamp rule
  is judged against a time before the walk, as for a walk of the pass's own. Once any
  pass is about to change the host tree (a journal to apply or to recover), ``changed``
  drops the walks of every related root: a pass that lists later walks again, so no pass
  plans on a listing older than a host change it could have seen running alone.
- **One digest per file.** A digest read for one pair serves every pair whose listing
  shows the same (size, mtime_ns, ino); each pair still keeps its own stat cache, written
  by its own racy-timestamp rule, and the re-check before apply is the pair's own.
- **One read per file per send round** (``ContentCache``): the bytes read for one upload
  serve the same file's uploads to the other remotes, within a byte budget.

All of it is used from the event loop thread only, and no await lies between a look-up
and the store that follows it: the first pass to ask is the only walker without a lock.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from filesync.core import offthread
from filesync.core.exclude import ExcludeRule
from filesync.core.model import Entry, Listing
from filesync.host.scan import (
    CHUNK,
    HashingReader,
    LocalScan,
    hash_needed,
    list_local,
    new_hasher,
    open_regular,
)

if TYPE_CHECKING:
    from filesync.host.watched import WatchedTrees

#: A file's stat as the walk saw it: size, mtime_ns, inode.
Stat = tuple[int, int, int]
#: Bytes kept for the other remotes' uploads at once (oldest dropped first).
CONTENT_BUDGET = 64 << 20
#: A file larger than this is read by each upload (it would crowd out everything else).
CONTENT_MAX_FILE = 8 << 20


@dataclass(slots=True)
class _Held:
    chunks: tuple[bytes, ...]
    digest: str
    left: int  # uploads still to serve


class ContentCache:
    """Whole files' bytes and digest by (path, stat), at most ``budget`` bytes in all.

    An entry is stored only when exactly the listed size was read and the file's stat
    after the read is the listed one, so what it serves is what the listing describes.
    It is dropped once served ``uses`` times (the other passes on its root), or when the
    budget needs room (the oldest first): a dropped file is simply read again.
    """

    def __init__(self, budget: int = CONTENT_BUDGET, max_file: int = CONTENT_MAX_FILE) -> None:
        self.budget = budget
        self.max_file = min(max_file, budget)
        self.held = 0
        self._items: dict[tuple[str, Stat], _Held] = {}

    def wants(self, size: int) -> bool:
        return size <= self.max_file

    def take(self, path: str, stat: Stat) -> tuple[tuple[bytes, ...], str] | None:
        """The bytes and digest of ``path`` read at ``stat``, counted as one use."""
        item = self._items.get((path, stat))
        if item is None:
            return None
        item.left -= 1
        if item.left < 1:
            self._drop((path, stat))
        return item.chunks, item.digest

    def put(self, path: str, stat: Stat, chunks: tuple[bytes, ...], digest: str,
            uses: int) -> None:
        if uses < 1 or not self.wants(stat[0]) or (path, stat) in self._items:
            return
        self._items[path, stat] = _Held(chunks, digest, uses)
        self.held += stat[0]
        while self.held > self.budget:
            self._drop(next(iter(self._items)))

    def _drop(self, key: tuple[str, Stat]) -> None:
        del self._items[key]
        self.held -= key[1][0]


class HostScans:
    """The host walks, digests and upload reads of one command run (see the module doc)."""

    def __init__(self, readers: Mapping[Path, int], content: ContentCache | None = None
                 ) -> None:
        """``readers``: how many passes of the run read each local root (the bytes one
        upload reads are kept for that many, less one, other uploads)."""
        self._walks: dict[tuple[str, str], tuple[asyncio.Future[Listing], int]] = {}
        self._digests: dict[str, tuple[Stat, str]] = {}
        self._readers = {str(root): n for root, n in readers.items()}
        self.content = content or ContentCache()
        #: walks started (one per root and rule in a fan-out that changes no host file)
        self.walks = 0

    def listing(self, root: Path, rule: ExcludeRule, trees: WatchedTrees | None,
                started_ns: int) -> asyncio.Future[tuple[Listing, int]]:
        """A copy of the host listing of ``root`` under ``rule``, and the time taken before
        its walk began (``started_ns`` if this call walks). A new walk starts in a thread
        at once, before the caller's next await."""
        key = (str(root), json.dumps(rule.wire(), sort_keys=True))
        if key not in self._walks:
            self.walks += 1
            walk = offthread.start(list_local, root, rule, trees)
            self._walks[key] = (walk, started_ns)
        walk, began = self._walks[key]
        out: asyncio.Future[tuple[Listing, int]] = asyncio.get_running_loop().create_future()

        def copy(done: asyncio.Future[Listing]) -> None:
            if out.cancelled():
                return
            if done.cancelled():
                out.cancel()
            elif (exc := done.exception()) is not None:
                out.set_exception(exc)
            else:
                listing = done.result()
                out.set_result((Listing(listing.root, listing.exists, dict(listing.entries),
                                        list(listing.skipped), listing.excluded), began))

        walk.add_done_callback(copy)
        return out

    def changed(self, root: Path) -> None:
        """The host tree under ``root`` is about to change: later passes walk again."""
        for key in [k for k in self._walks if _related(Path(k[0]), root)]:
            del self._walks[key]

    def hash_needed(self, scan: LocalScan, root: Path, needed: Callable[[str], bool]) -> None:
        """``host.scan.hash_needed``, taking a digest another pair read this run whenever
        the listing shows the file as it was then, and offering the digests it reads."""
        base = str(root).rstrip("/") + "/"
        entries = scan.listing.entries
        rest = []
        for rel in scan.misses:
            e = entries[rel]
            got = self._digests.get(base + rel)
            if got is None or got[0] != (e.size, e.mtime_ns, e.ino) or not needed(rel):
                rest.append(rel)
                continue
            scan.hashes[rel] = got[1]
            if scan.cacheable(e):
                scan.cache_rows[rel] = (e.size, e.mtime_ns, e.ino, got[1])
        reading = [rel for rel in rest if needed(rel)]
        scan.misses = rest
        hash_needed(scan, root, needed)
        for rel in reading:
            if rel in entries:  # else it was unreadable
                e = entries[rel]
                self._digests[base + rel] = ((e.size, e.mtime_ns, e.ino), scan.hashes[rel])

    def reader(self, root: Path, path: str, progress: Callable[[int], None] | None,
               entry: Entry) -> HashingReader:
        """The upload reader of ``path`` under ``root`` (listed as ``entry``): served from
        the bytes another pass read this round when it can, offering what it reads to the
        other passes on ``root`` otherwise."""
        uses = self._readers.get(str(root), 1) - 1
        return SharedReader(path, progress, entry, self.content, uses)


class SharedReader(HashingReader):
    """A ``HashingReader`` that reads a file at most once for all remotes of a round."""

    __slots__ = ("content", "stat", "uses")

    def __init__(self, path: str, progress: Callable[[int], None] | None, entry: Entry,
                 content: ContentCache, uses: int) -> None:
        super().__init__(path, progress, entry.size)
        self.stat: Stat = (entry.size, entry.mtime_ns, entry.ino)
        self.content = content
        self.uses = uses

    def __call__(self) -> Iterator[bytes]:
        path = str(self.path)
        got = self.content.take(path, self.stat)
        if got is None and (self.uses < 1 or not self.content.wants(self.stat[0])):
            yield from super().__call__()
            return
        if got is None:
            # Read whole before the first chunk is handed out: no await falls between the
            # first read and the store, so a concurrent upload of the file finds it stored.
            chunks, digest = self._read(path)
        else:
            chunks, digest = got
        for chunk in chunks:
            self.size += len(chunk)
            if self.progress is not None:
                self.progress(len(chunk))
            yield chunk
        self._digest = digest

    def _read(self, path: str) -> tuple[tuple[bytes, ...], str]:
        hasher = new_hasher()
        fd = open_regular(path)
        try:
            chunks = []
            want = self._first
            while chunk := os.read(fd, want):
                want = CHUNK
                hasher.update(chunk)
                chunks.append(chunk)
            st = os.fstat(fd)
        finally:
            os.close(fd)
        out = tuple(chunks)
        digest = str(hasher.hexdigest())
        if (st.st_size, st.st_mtime_ns, st.st_ino) == self.stat \
                and sum(map(len, out)) == self.stat[0]:
            self.content.put(path, self.stat, out, digest, self.uses)
        return out, digest


def _related(a: Path, b: Path) -> bool:
    return a == b or a.is_relative_to(b) or b.is_relative_to(a)
