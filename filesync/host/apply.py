"""Apply on the host: atomic per file, re-checked, never following links.

``HostTree`` carries out one ``HostOp`` at a time, each idempotent and guarded:
- a write renames the staged file into place, only if the target still has the
  size and mtime the scan saw (else it becomes a conflict, and nothing is lost);
- a delete unlinks only a target that is unchanged since the scan;
- before either, the old file is kept (hard-linked, or copied with its permission
  bits) in the undo dir;
- the directories that received a file are fsynced once each, by ``flush`` (the staged
  files' data was flushed before: ``StagingSink.flush``), before the apply is committed.
The intent journal that orders these ops, and the recovery that replays it after a
crash, are ``filesync.host.journal``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import time
from pathlib import Path
from typing import NamedTuple

from filesync.core.faults import crash_point
from filesync.host.scan import hash_fd
from filesync.tree.dirfd import (
    TEMP_PREFIX,
    TEMP_SUFFIX,
    delete_file,
    fsync_dir,
    make_dirs,
    make_way,
    open_parent,
    unchanged,
)
from filesync.tree.paths import split_rel
from filesync.tree.wire import Reason, Status, describe, parse_reason, reason_of

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)


class HostOp(NamedTuple):
    """One host change. ``expect`` is the target's (size, mtime_ns) at scan, or None.

    Named tuples, not dataclasses: a pull loads this module, and creating a dataclass
    costs ~0.6 ms, five times a named tuple's."""

    kind: str  # "write" or "delete"
    path: str
    expect: list[int] | None
    staged: str | None = None
    hash: str | None = None
    mode: int = 0o644
    mtime_ns: int = 0


class OpResult(NamedTuple):
    """``OK`` (done), ``CHANGED`` (target edited since the scan) or ``ERROR``."""

    op: HostOp
    status: Status
    reason: str = ""
    #: the code of a refusal of the remote's kind (symlinked parent...), else None
    code: Reason | None = None


def _refused(op: HostOp, exc: BaseException) -> OpResult:
    """The ``error`` result of an op whose path could not be opened, with its code."""
    code, detail = reason_of(exc)
    return OpResult(op, Status.ERROR, describe(code, detail), code)


class HostTree:
    """The host root, opened once; every access goes through its descriptor."""

    def __init__(self, root: Path, undo_dir: Path | None, umask: int | None = None) -> None:
        make_dirs(root, umask)
        self.root = root
        #: the umask the directories it creates get (None: the process's)
        self.umask = umask
        self.fd = os.open(root, DIR_FLAGS)
        self.undo_dir = undo_dir
        #: directories (as path components) a file was renamed into since the last flush
        self.unflushed: set[tuple[str, ...]] = set()

    def flush(self) -> None:
        """Put the names of every file placed so far on disk: each directory fsynced once."""
        dirs, self.unflushed = self.unflushed, set()
        for parts in sorted(dirs):
            try:
                fd = open_parent(self.fd, [*parts, "."], False)
            except (OSError, ValueError):
                continue  # gone since (a later op pruned it): nothing of it to keep
            try:
                fsync_dir(fd)
            finally:
                os.close(fd)

    def close(self) -> None:
        if self.fd >= 0:
            self.flush()
            os.close(self.fd)
            self.fd = -1

    def apply(self, op: HostOp) -> OpResult:
        """Carry out one op; safe to repeat after a crash."""
        try:
            parts = split_rel(op.path)
            pfd = open_parent(self.fd, parts, op.kind == "write", self.umask)
        except FileNotFoundError:
            return OpResult(op, Status.OK if op.kind == "delete" else Status.ERROR,
                            "parent vanished")
        except (OSError, ValueError) as exc:
            return _refused(op, exc)
        try:
            if op.kind == "write":
                return self._write(pfd, parts, op)
            return self._delete(pfd, parts, op)
        except OSError as exc:
            return _refused(op, exc)
        finally:
            os.close(pfd)

    def _current(self, pfd: int, name: str) -> os.stat_result | None:
        try:
            return os.stat(name, dir_fd=pfd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def _write(self, pfd: int, parts: list[str], op: HostOp) -> OpResult:
        name = parts[-1]
        st = self._current(pfd, name)
        if not unchanged(st, op.expect):
            if st is not None and _holds(pfd, name, op.hash):
                return OpResult(op, Status.OK)  # replayed after a crash: already in place
            blocked = make_way(pfd, name, st, op.expect)
            if blocked is Reason.DIR_IN_WAY:
                return OpResult(op, Status.ERROR, describe(blocked), blocked)
            if blocked is not None:
                return OpResult(op, Status.CHANGED, "changed on the host during the run")
            st = None  # an empty directory was in the way: removed
        assert op.staged is not None
        if st is not None:
            self._keep(pfd, op.path, name)
            crash_point("kept")
        self._place(pfd, name, Path(op.staged), op)
        self.unflushed.add(tuple(parts[:-1]))
        crash_point("placed")
        return OpResult(op, Status.OK)

    def _place(self, pfd: int, name: str, staged: Path, op: HostOp) -> None:
        os.chmod(staged, op.mode & 0o777)
        os.utime(staged, ns=(op.mtime_ns, op.mtime_ns))
        try:
            os.rename(staged, name, dst_dir_fd=pfd)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
            self._copy_in(pfd, name, staged, op)

    def _copy_in(self, pfd: int, name: str, staged: Path, op: HostOp) -> None:
        temp = f"{TEMP_PREFIX}{os.getpid()}.{time.monotonic_ns()}{TEMP_SUFFIX}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        fd = os.open(temp, flags, op.mode & 0o777, dir_fd=pfd)
        try:
            with open(staged, "rb") as src, os.fdopen(os.dup(fd), "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            os.fchmod(fd, op.mode & 0o777)
            os.utime(fd, ns=(op.mtime_ns, op.mtime_ns))
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=pfd)
            raise
        os.close(fd)
        os.rename(temp, name, src_dir_fd=pfd, dst_dir_fd=pfd)
        os.unlink(staged)

    def _delete(self, pfd: int, parts: list[str], op: HostOp) -> OpResult:
        st = self._current(pfd, parts[-1])
        if st is None:
            return OpResult(op, Status.OK)
        if not unchanged(st, op.expect):
            return OpResult(op, Status.CHANGED, "changed on the host during the run")
        self._keep(pfd, op.path, parts[-1])
        crash_point("kept")
        result = delete_file(self.fd, op.path, [st.st_size, st.st_mtime_ns])
        if result[1] != Status.OK:
            code = parse_reason(result[2])
            return OpResult(op, Status.CHANGED if result[1] == Status.CHANGED else Status.ERROR,
                            describe(code, str(result[3])), code)
        crash_point("placed")
        return OpResult(op, Status.OK)

    def _keep(self, pfd: int, rel: str, name: str) -> None:
        """Keep the old file in the undo dir before it is replaced or deleted."""
        if self.undo_dir is None:
            return
        dest = self.undo_dir / "files" / rel
        if dest.exists():
            return  # kept already by an earlier attempt of the same journal
        make_dirs(dest.parent, self.umask)
        try:
            os.link(name, dest, src_dir_fd=pfd, follow_symlinks=False)
        except OSError:
            # A copy lands under its final name only once whole: a partial copy (disk
            # full, crash) must never pass for the kept old version.
            tmp = dest.with_name(dest.name + ".filesync-partial")
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=pfd)
                with os.fdopen(fd, "rb") as src:
                    # Created 0600, then given the file's own bits: a private file is never
                    # readable by others, not even while it is copied.
                    out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                    with os.fdopen(out, "wb") as dst:
                        os.fchmod(out, stat.S_IMODE(os.fstat(fd).st_mode) & 0o777)
                        shutil.copyfileobj(src, dst, 1 << 20)
                        dst.flush()
                        os.fsync(out)
                os.replace(tmp, dest)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise


def _holds(pfd: int, name: str, digest: str | None) -> bool:
    """True if ``name`` is a regular file with that digest (never opens a FIFO or device)."""
    if digest is None:
        return False
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=pfd)
    except OSError:
        return False
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode) and hash_fd(fd) == digest
    except OSError:
        return False
    finally:
        os.close(fd)
