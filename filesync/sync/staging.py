"""The staging area of a pass: fetched remote files, whole and hashed, fsynced before any
apply.

A file counts as staged once every byte was written and hashed; one that failed (or was
found torn later) is dropped and its reason kept, so the plan leaves it out and the next
run retries it. Durability is paid once for all of them (``flush``, before the apply's
journal names them): each file's writeback starts as soon as it is whole, and the fsyncs
come together at the end, several at once (``tree.dirfd.each_at_once``: they share the
file system's journal commits), instead of one full flush per file.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from filesync.endpoint.contract import FetchHeader, FetchSink
from filesync.host.scan import new_hasher
from filesync.tree.dirfd import (
    ROOT_FLAGS,
    each_at_once,
    fsync_dir,
    make_dirs,
    start_writeback,
)


@dataclass(slots=True)
class Staged:
    """A fetched remote file, whole under the staging dir (fsynced by ``flush``)."""

    path: Path
    hash: str
    size: int
    mode: int
    mtime_ns: int


class StagingSink(FetchSink):
    """Writes fetched files into the staging dir, hashing while writing."""

    def __init__(self, directory: Path, umask: int | None = None) -> None:
        self.dir = directory
        self._umask = umask  # of the directories it creates (None: the process's)
        self.staged: dict[str, Staged] = {}
        self.failed_paths: dict[str, str] = {}
        self._n = 0
        self._fd = -1
        self._hasher = new_hasher()
        self._file = Path()
        self.progress: Callable[[int], None] | None = None
        #: staged since the last ``flush``: not yet known to be on disk
        self._unflushed: list[str] = []

    def begin(self, head: FetchHeader) -> Callable[[bytes], None]:
        if self._n == 0:
            # Created lazily: recovery empties the staging area at the start of a run.
            make_dirs(self.dir, self._umask)
        self._n += 1
        self._file = self.dir / f"{self._n}"
        self._fd = os.open(self._file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        self._hasher = new_hasher()
        return self._write

    def _write(self, data: bytes) -> None:
        if self.progress is not None:
            self.progress(len(data))
        self._hasher.update(data)
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]

    def end(self, head: FetchHeader, ok: bool, reason: str) -> None:
        if ok:
            start_writeback(self._fd)
        os.close(self._fd)
        if not ok:
            os.unlink(self._file)
            self.failed(head.path, reason)
            return
        digest = str(self._hasher.hexdigest())
        self.staged[head.path] = Staged(self._file, digest, head.size, head.mode & 0o777,
                                        head.mtime_ns)
        self._unflushed.append(head.path)

    def flush(self) -> None:
        """Put every file staged so far on disk (data, then the staging dir's names):
        called before anything renames a staged file into place."""
        paths, self._unflushed = self._unflushed, []
        # (A path dropped since, by a torn read found later, has nothing to flush.)
        each_at_once(_fsync_file,
                     [s.path for p in paths if (s := self.staged.get(p)) is not None])
        if paths:
            fd = os.open(self.dir, ROOT_FLAGS)
            try:
                fsync_dir(fd)
            finally:
                os.close(fd)

    def failed(self, path: str, reason: str) -> None:
        """``path`` is not whole; a copy staged before (a torn read found later) is dropped."""
        self.failed_paths[path] = reason
        staged = self.staged.pop(path, None)
        if staged is not None:
            staged.path.unlink(missing_ok=True)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
