"""The host-side scan: walk with the exclusion rule, hash with a stat cache."""

from __future__ import annotations

import errno
import marshal
import os
import stat
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import eq, itemgetter, not_
from pathlib import Path
from typing import TYPE_CHECKING, cast

import xxhash

from filesync.core.exclude import ExcludeRule
from filesync.core.model import Entry, Listing, Skipped, filter_unsafe
from filesync.tree.walk import walk
from filesync.tree.wire import parse_reason

if TYPE_CHECKING:
    from filesync.host.watched import WatchedTrees

CHUNK = 1 << 20
#: A file modified this close to the scan may be modified again within the same
#: timestamp tick, so its hash is not cached (the racy-timestamp rule).
RACY_NS = 2_000_000_000
# O_NONBLOCK: a file swapped for a FIFO after the scan must not block the open.
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def open_regular(path: str | Path, dir_fd: int | None = None) -> int:
    """Open a regular file for reading, never following a symlink or opening a FIFO."""
    fd = os.open(path, _READ_FLAGS, dir_fd=dir_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file any more", str(path))
    return fd


def new_hasher() -> xxhash.xxh3_128:
    return xxhash.xxh3_128()


def hash_fd(fd: int) -> str:
    """xxh3-128 of the bytes readable from ``fd``."""
    hasher = new_hasher()
    while chunk := os.read(fd, CHUNK):
        hasher.update(chunk)
    return str(hasher.hexdigest())


def hash_file(path: str | Path, dir_fd: int | None = None) -> str:
    """xxh3-128 of a file's bytes (symlinks are not followed)."""
    fd = open_regular(path, dir_fd)
    try:
        return hash_fd(fd)
    finally:
        os.close(fd)


#: Prefix of the stand-in digest of a file that was not read (see ``hash_needed``).
UNREAD = "?"


@dataclass(slots=True)
class LocalScan:
    """The host tree: its listing, each file's hash, and the stat cache to persist.

    ``hashes`` holds a real digest for every cache hit and every file ``hash_needed``
    read; a file nobody needs to compare (new on the host, absent remotely, no
    ancestor) holds ``UNREAD + path`` instead and is hashed while it is uploaded.
    """

    listing: Listing
    #: (a carried watched pass's are read through from the stat cache: ``sync.carry``)
    hashes: MutableMapping[str, str] = field(default_factory=dict)
    cache_rows: MutableMapping[str, tuple[int, int, int, str]] = field(default_factory=dict)
    misses: list[str] = field(default_factory=list)
    started_ns: int = 0

    def cacheable(self, entry: Entry) -> bool:
        """Racy-timestamp rule: a file modified near the scan may change again unseen."""
        return entry.mtime_ns < self.started_ns - RACY_NS


def list_local(root: Path, rule: ExcludeRule, trees: WatchedTrees | None = None) -> Listing:
    """List regular files under ``root`` with the same walk the remote helper runs.

    ``trees``: list through (and keep) the tree's watch there, for the owner's next call.
    """
    if not root.is_dir():
        return Listing(str(root), root.exists())
    watched = trees.get(root, rule) if trees is not None else None
    if watched is not None:
        listing = watched.listing()
        if listing is not None:
            return listing  # unsafe names already filtered, by what changed
    rows, skipped, excluded = walk(str(root), rule.matcher())
    listing = Listing(str(root), True, excluded=excluded,
                      digest=walk_digest(rows, skipped, excluded))
    for rel, kind, size, mtime_ns, mode, ino, _nlink in rows:
        listing.entries[rel] = Entry(rel, kind, size, mtime_ns, mode, ino)
    listing.skipped = [Skipped.of(p, parse_reason(c), d) for p, c, d in skipped]
    filter_unsafe(listing)
    return listing


def walk_digest(rows: list[list[object]], skipped: list[list[str]], excluded: int) -> str:
    """The digest of one walk's rows (path, kind, size, mtime, mode, inode, links, in walk
    order), skipped rows and excluded count.

    marshal's format 2 has no back-references, so equal rows always give equal bytes; each
    piece is self-delimiting, so the pieces' concatenation stands for the rows alone. In
    pieces of ``DIGEST_ROWS``, so that a 100k-row walk never holds its 7 MB encoding.
    """
    h = xxhash.xxh3_128()
    for i in range(0, len(rows), DIGEST_ROWS):
        h.update(marshal.dumps(rows[i:i + DIGEST_ROWS], 2))
    h.update(marshal.dumps((skipped, excluded), 2))
    return h.hexdigest()


#: Rows per piece of ``walk_digest``'s encoding (~300 KB).
DIGEST_ROWS = 4096


def scan_cached(
    listing: Listing, cache: dict[str, tuple[int, int, int, str]], started_ns: int
) -> LocalScan:
    """Take every hash the stat cache still vouches for in a host listing.

    Reads no file content. ``started_ns`` is a time taken before the listing's walk
    began: racy timestamps are judged against it.
    """
    scan = LocalScan(listing, started_ns=started_ns)
    entries = listing.entries
    # C-level passes instead of a Python loop per file, which a warm pass over a large
    # tree would pay (docs/benchmarks.md): each entry's cache row (or a row that matches
    # nothing), then (size, mtime_ns, ino) against the row's first three fields.
    # (The stand-in rows never hit: they are dropped before a row is used.)
    rows = cast(list[CacheRow], list(map(cache.get, entries, repeat(_NO_ROW))))
    hit = list(map(eq, map(_ENTRY_STAT, entries.values()), map(_ROW_STAT, rows)))
    if not all(hit):
        rows = list(compress(rows, hit))
        scan.misses = list(compress(entries, map(not_, hit)))
        scan.cache_rows = dict(zip(compress(entries, hit), rows, strict=True))
    elif len(rows) == len(cache):
        # Every row vouches for a file: the rows are the cache itself. A copy in the
        # cache's own order, of the very same objects, lets ``_update_caches`` see that
        # nothing changed by identity alone.
        scan.cache_rows = dict(cache)
    else:
        scan.cache_rows = dict(zip(entries, rows, strict=True))
    # Keyed and ordered like the listing (``hash_needed`` adds the misses).
    scan.hashes = dict(zip(compress(entries, hit), map(_ROW_HASH, rows), strict=True))
    return scan


#: The cache row of a path the cache does not hold: equal to no entry's stat.
_NO_ROW: tuple[None, None, None, None] = (None, None, None, None)
_ENTRY_STAT = itemgetter(2, 3, 5)  # Entry: size, mtime_ns, ino
_ROW_STAT = itemgetter(0, 1, 2)  # cache row: size, mtime_ns, ino
_ROW_HASH = itemgetter(3)
CacheRow = tuple[int, int, int, str]


def hash_needed(scan: LocalScan, root: Path, needed: Callable[[str], bool]) -> None:
    """Hash the cache misses that ``needed`` says will be compared with something."""
    for rel in scan.misses:
        if not needed(rel):
            scan.hashes[rel] = UNREAD + rel
            continue
        entry = scan.listing.entries[rel]
        try:
            digest = hash_file(root / rel)
        except OSError as exc:
            del scan.listing.entries[rel]
            scan.listing.skipped.append(Skipped(rel, f"unreadable: {exc.strerror}"))
            continue
        scan.hashes[rel] = digest
        if scan.cacheable(entry):
            scan.cache_rows[rel] = (entry.size, entry.mtime_ns, entry.ino, digest)
    scan.misses = []


class HashingReader:
    """Reads a file in chunks for upload, hashing exactly the bytes handed out.

    The hasher lives only while the file is read: an upload of 100k files holds 100k
    readers until the remote confirms them, and an xxh3 state is ~600 bytes.
    """

    __slots__ = ("_digest", "_first", "path", "progress", "size")

    def __init__(self, path: str | Path, progress: Callable[[int], None] | None = None,
                 size_hint: int = CHUNK) -> None:
        self.path = path
        self.size = 0
        self.progress = progress
        self._digest: str | None = None
        # A small file is read with a buffer its size (+1 to see the end at once), not 1 MiB.
        self._first = min(CHUNK, max(size_hint, 0) + 1)

    def __call__(self) -> Iterator[bytes]:
        hasher = new_hasher()
        fd = open_regular(self.path)
        try:
            want = self._first
            while chunk := os.read(fd, want):
                want = CHUNK
                hasher.update(chunk)
                self.size += len(chunk)
                if self.progress is not None:
                    self.progress(len(chunk))
                yield chunk
        finally:
            os.close(fd)
            self._digest = str(hasher.hexdigest())

    @property
    def digest(self) -> str:
        """The xxh3-128 of the bytes handed out (of none before the file was read)."""
        if self._digest is None:
            self._digest = str(new_hasher().hexdigest())
        return self._digest
