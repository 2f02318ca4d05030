"""The host-side scan: walk with the exclusion rule, hash with a stat cache."""

from __future__ import annotations

import errno
import os
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import xxhash

from filesync.exclude import ExcludeRule
from filesync.helper import walk
from filesync.model import Entry, Listing, Skipped
from filesync.paths import all_safe, unsafe_reason

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
    hashes: dict[str, str] = field(default_factory=dict)
    cache_rows: dict[str, tuple[int, int, int, str]] = field(default_factory=dict)
    misses: list[str] = field(default_factory=list)
    started_ns: int = 0

    def cacheable(self, entry: Entry) -> bool:
        """Racy-timestamp rule: a file modified near the scan may change again unseen."""
        return entry.mtime_ns < self.started_ns - RACY_NS


def filter_unsafe(listing: Listing) -> None:
    """Move entries whose names fail the path-safety check to ``skipped``."""
    if all_safe(listing.entries.keys()):
        return
    for rel in list(listing.entries):
        reason = unsafe_reason(rel)
        if reason is not None:
            del listing.entries[rel]
            listing.skipped.append(Skipped(rel, reason))


def list_local(root: Path, rule: ExcludeRule) -> Listing:
    """List regular files under ``root`` with the same walk the remote helper runs."""
    if not root.is_dir():
        return Listing(str(root), root.exists())
    rows, skipped, excluded = walk(str(root), rule.matcher())
    listing = Listing(str(root), True, excluded=excluded)
    for rel, kind, size, mtime_ns, mode, ino, _nlink in rows:
        listing.entries[rel] = Entry(rel, kind, size, mtime_ns, mode, ino)
    listing.skipped = [Skipped(p, r) for p, r in skipped]
    filter_unsafe(listing)
    return listing


def scan_cached(
    listing: Listing, cache: dict[str, tuple[int, int, int, str]], started_ns: int
) -> LocalScan:
    """Take every hash the stat cache still vouches for in a host listing.

    Reads no file content. ``started_ns`` is a time taken before the listing's walk
    began: racy timestamps are judged against it.
    """
    scan = LocalScan(listing, started_ns=started_ns)
    for rel, entry in scan.listing.entries.items():
        cached = cache.get(rel)
        if cached is not None and cached[:3] == (entry.size, entry.mtime_ns, entry.ino):
            scan.hashes[rel] = cached[3]
            scan.cache_rows[rel] = cached
        else:
            scan.misses.append(rel)
    return scan


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


def scan_local(
    root: Path, rule: ExcludeRule, cache: dict[str, tuple[int, int, int, str]]
) -> LocalScan:
    """List and hash the whole host tree, re-reading only files whose stat changed."""
    started_ns = time.time_ns()
    scan = scan_cached(list_local(root, rule), cache, started_ns)
    hash_needed(scan, root, lambda _rel: True)
    return scan


class HashingReader:
    """Reads a file in chunks for upload, hashing exactly the bytes handed out."""

    def __init__(self, path: Path, progress: Callable[[int], None] | None = None) -> None:
        self.path = path
        self.hasher = new_hasher()
        self.size = 0
        self.progress = progress

    def __call__(self) -> Iterator[bytes]:
        fd = open_regular(self.path)
        try:
            while chunk := os.read(fd, CHUNK):
                self.hasher.update(chunk)
                self.size += len(chunk)
                if self.progress is not None:
                    self.progress(len(chunk))
                yield chunk
        finally:
            os.close(fd)

    @property
    def digest(self) -> str:
        return str(self.hasher.hexdigest())
