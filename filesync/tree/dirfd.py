"""File operations through directory descriptors: nothing outside the root, ever.

Every path is opened component by component with ``O_NOFOLLOW`` relative to the root's
descriptor; a replaced file is written to a temp name in its directory, fsynced and
renamed, and only if the target still has the size and mtime the client saw, checked
right before the rename. Existing directories are never chmodded.

A directory created here gets ``0o777`` less the umask: the process's, or the ``umask``
the caller gives (then exactly, whatever the process's is: the agent runs each client's
command with the client's umask, never changing its own).

Durability is paid per batch, not per file (``Batch``): the files of a batch are written,
then each one's writeback is started and each is fsynced (several at once,
``SYNC_THREADS``), then each is renamed, then each directory that received one is
fsynced once. So after a crash every file holds its old or its new content, and a file is
reported written only once its data and its name are on disk.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import time
from functools import cache

from filesync.tree.paths import split_rel
from filesync.tree.wire import Reason, Status, reason_of

#: ``typing`` is for the type checker only: the remote helper starts without importing it.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import re
    from collections.abc import Callable, Sequence
    from typing import Any, TypeVar

    T = TypeVar("T")
    R = TypeVar("R")

TEMP_PREFIX = ".filesync."
TEMP_SUFFIX = ".tmp"
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
ROOT_FLAGS = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)


@cache
def _temp_re() -> re.Pattern[str]:
    """A temp name, the writer's pid as its group; compiled when a name with
    ``TEMP_PREFIX`` is first seen (a walk of a tree without one never loads re)."""
    import re

    return re.compile(r"^\.filesync\.(\d+)\.\d+\.tmp$")


def is_temp_name(name: str) -> bool:
    """True for filesync's own in-flight temp files, which are never synced."""
    return name.startswith(TEMP_PREFIX) and _temp_re().match(name) is not None


def stale_temp(name: str) -> bool:
    match = _temp_re().match(name)
    if match is None:
        return False
    try:
        os.kill(int(match.group(1)), 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False



def open_parent(root_fd: int, parts: list[str], create: bool,
                umask: int | None = None) -> int:
    """Open the directory holding ``parts[-1]`` without following any symlink (creating
    the missing ones if ``create``, see ``open_dir``)."""
    fd = os.dup(root_fd)
    try:
        for part in parts[:-1]:
            nfd = open_dir(fd, part, create, umask)
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


def make_dirs(path: str | os.PathLike[str], umask: int | None = None,
              mode: int = 0o777) -> None:
    """``os.makedirs(path, mode, exist_ok=True)``: the directories it creates get ``mode``
    (the last) or ``0o777`` (its parents) less ``umask``, exactly; None: less the
    process's umask, as ``os.makedirs`` does."""
    if umask is None:
        os.makedirs(path, mode, exist_ok=True)
        return
    missing: list[str] = []
    here = os.path.abspath(path)
    while not os.path.isdir(here) and os.path.dirname(here) != here:
        missing.append(here)
        here = os.path.dirname(here)
    for i, made in enumerate(reversed(missing)):
        want = (mode if i == len(missing) - 1 else 0o777) & ~umask
        try:
            os.mkdir(made, 0o700)  # private until it has its mode
        except FileExistsError:
            continue
        os.chmod(made, want)
    os.makedirs(path, exist_ok=True)  # a file in the way is FileExistsError, as makedirs


def create_file(path: str | os.PathLike[str], mode: int, umask: int | None = None) -> None:
    """Create ``path`` (empty) if it is missing, with ``mode`` less ``umask`` exactly
    (None: less the process's umask); an existing file keeps its mode."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                     | getattr(os, "O_CLOEXEC", 0), 0o600 if umask is not None else mode)
    except FileExistsError:
        return
    try:
        if umask is not None:
            os.fchmod(fd, mode & ~umask)
    finally:
        os.close(fd)


def stat_at(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def unchanged(st: os.stat_result | None, expect: list[int] | None) -> bool:
    """True if the target is as the client saw it: absent, or a file of that size/mtime."""
    if expect is None:
        return st is None
    if st is None or not stat.S_ISREG(st.st_mode):
        return False
    return st.st_size == expect[0] and st.st_mtime_ns == expect[1]


def make_way(dir_fd: int, name: str, st: os.stat_result | None,
             expect: list[int] | None) -> Reason | None:
    """Whether a file may now be put at ``name`` (``st``: its stat, ``expect``: as listed).

    ``None``: it may. Directories are not tracked, so an **empty** directory where no file
    was listed is nothing to keep: it is removed, as rsync removes one in a file's way
    (``rmdir`` only ever removes an empty one). ``DIR_IN_WAY``: a directory holding
    anything stands there; it is left whole. ``CHANGED``: the target is not as listed.
    The one rule for the remote helper and the host apply.
    """
    if unchanged(st, expect):
        return None
    if expect is not None or st is None or not stat.S_ISDIR(st.st_mode):
        return Reason.CHANGED
    try:
        os.rmdir(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    except OSError as exc:
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
            return Reason.DIR_IN_WAY
        raise
    return None if stat_at(dir_fd, name) is None else Reason.CHANGED




class Dirs:
    """Directory descriptors of one request, kept from one file to the next.

    Holds the chain of directories leading to the last one used: files sent in path
    order reuse it, and only the components that differ are opened (each one
    ``O_NOFOLLOW`` relative to its opened parent, as ``open_parent`` does) or closed.
    The chain is bounded by the path depth. Like any open descriptor, a cached one
    keeps naming its directory if that is renamed meanwhile; a directory's own
    owner can do that, nobody can make it follow a symlink.

    ``parent`` also gives the directory's identity (device, inode), taken once when it
    was opened: an open descriptor's identity never changes, so files that share a
    directory need no ``fstat`` of their own to say so (``Batch.add``).
    """

    def __init__(self, root_fd: int) -> None:
        self.root_fd = root_fd
        self.root_key: tuple[int, int] | None = None
        self.names: list[str] = []
        self.fds: list[int] = []
        self.keys: list[tuple[int, int]] = []

    def parent(self, parts: list[str], create: bool) -> tuple[int, tuple[int, int]]:
        """The descriptor (owned by this cache) and identity of the directory holding
        ``parts[-1]``."""
        dirs = parts[:-1]
        names = self.names
        keep = 0
        limit = min(len(dirs), len(names))
        while keep < limit and dirs[keep] == names[keep]:
            keep += 1
        self._close_from(keep)
        for part in dirs[keep:]:
            fd = open_dir(self.fds[-1] if self.fds else self.root_fd, part, create)
            try:
                st = os.fstat(fd)
            except BaseException:
                os.close(fd)
                raise
            self.names.append(part)
            self.fds.append(fd)
            self.keys.append((st.st_dev, st.st_ino))
        if self.fds:
            return self.fds[-1], self.keys[-1]
        if self.root_key is None:
            st = os.fstat(self.root_fd)
            self.root_key = (st.st_dev, st.st_ino)
        return self.root_fd, self.root_key

    def forget(self) -> None:
        """Drop the cached chain (a directory of it went away meanwhile)."""
        self._close_from(0)

    def _close_from(self, depth: int) -> None:
        while len(self.fds) > depth:
            os.close(self.fds.pop())
            self.names.pop()
            self.keys.pop()

    def close(self) -> None:
        self._close_from(0)


def open_dir(fd: int, part: str, create: bool, umask: int | None = None) -> int:
    """Open the directory ``part`` in ``fd`` without following a symlink; if ``create``,
    a missing one is made, ``0o777`` less ``umask`` (None: the process's umask)."""
    try:
        return os.open(part, DIR_FLAGS, dir_fd=fd)
    except FileNotFoundError:
        if not create:
            raise
        try:
            os.mkdir(part, 0o777, dir_fd=fd)
        except FileExistsError:
            return os.open(part, DIR_FLAGS, dir_fd=fd)
        made = os.open(part, DIR_FLAGS, dir_fd=fd)
        if umask is not None:
            os.fchmod(made, 0o777 & ~umask)
        return made
    except NotADirectoryError:
        # Linux says ENOTDIR for O_DIRECTORY|O_NOFOLLOW on a symlink: name it.
        st = stat_at(fd, part)
        if st is not None and stat.S_ISLNK(st.st_mode):
            raise OSError(errno.ELOOP, "symlink in path", part) from None
        raise



class TempFile:
    """A temp file beside the target, committed by rename only if the target is unchanged.

    The parent directory's descriptor belongs to ``dirs`` (shared by the files of one
    request); only the temp file's own descriptor is this object's.
    """

    def __init__(self, dirs: Dirs, rel: str, temp: str,
                 error: tuple[Reason, str] | None) -> None:
        self.rel, self.temp = rel, temp
        self.error = error
        self.pfd = -1
        #: the parent directory's identity (``Dirs.parent``)
        self.dir_key = (-1, -1)
        self.fd = -1
        #: once placed: the file's listing row, as a walk would list it now
        self.listed: list[Any] | None = None
        if error:
            return
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        try:
            self.parts = split_rel(rel)
            try:
                self.pfd, self.dir_key = dirs.parent(self.parts, True)
                self.fd = os.open(temp, flags, 0o600, dir_fd=self.pfd)
            except FileNotFoundError:
                # A cached parent was removed since the last file: open the path afresh.
                dirs.forget()
                self.pfd, self.dir_key = dirs.parent(self.parts, True)
                self.fd = os.open(temp, flags, 0o600, dir_fd=self.pfd)
        except (OSError, ValueError) as exc:
            self.error = reason_of(exc)
            self._close()

    def write(self, data: bytes | memoryview) -> None:
        if self.error:
            return
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self.fd, view):]
        except OSError as exc:
            self.error = reason_of(exc)
            self.abort()

    def prepare(self, mode: int, mtime_ns: int) -> list[Any] | None:
        """Give the whole temp file its mode and mtime; the error row if that (or anything
        before) failed, else None (``Batch.flush`` commits it later)."""
        if self.error:
            self.abort()
            return [self.rel, Status.ERROR, *self.error]
        try:
            os.fchmod(self.fd, mode & 0o7777)
            os.utime(self.fd, ns=(mtime_ns, mtime_ns))
        except OSError as exc:
            self.abort()
            return [self.rel, Status.ERROR, *reason_of(exc)]
        return None

    def start_writeback(self) -> None:
        """Start the writeback of the written file (``start_writeback``)."""
        start_writeback(self.fd)

    def sync(self) -> list[Any] | None:
        """Flush the data (before any rename: a power loss never leaves a replaced file
        empty or torn; the writeback ``start_writeback`` began makes this cheap); the error row,
        or None."""
        try:
            os.fsync(self.fd)
        except OSError as exc:
            self.abort()
            return [self.rel, Status.ERROR, *reason_of(exc)]
        return None

    def place(self, expect: list[int] | None) -> list[Any]:
        """Rename over the target if it is unchanged: the result row,
        ``[rel, "ok", size, mtime_ns]`` or ``[rel, status, code, detail]``. The directory
        is flushed by the caller (once for all the files a batch put in it)."""
        try:
            # What the file system stored (it may keep coarser times than asked for).
            st = os.fstat(self.fd)
            blocked = make_way(self.pfd, self.parts[-1], stat_at(self.pfd, self.parts[-1]),
                               expect)
            if blocked is not None:
                self.abort()
                status = Status.CHANGED if blocked is Reason.CHANGED else Status.ERROR
                return [self.rel, status, blocked.value, ""]
            os.rename(self.temp, self.parts[-1], src_dir_fd=self.pfd, dst_dir_fd=self.pfd)
        except OSError as exc:
            self.abort()
            return [self.rel, Status.ERROR, *reason_of(exc)]
        self._close()
        self.listed = [self.rel, "f", st.st_size, st.st_mtime_ns, st.st_mode & 0o7777,
                       st.st_ino, st.st_nlink]
        return [self.rel, Status.OK, st.st_size, st.st_mtime_ns]

    def abort(self) -> None:
        if self.pfd >= 0:
            try:
                os.unlink(self.temp, dir_fd=self.pfd)
            except OSError:  # never created, or removed already
                pass
        self._close()

    def _close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
        self.fd = self.pfd = -1


def start_writeback(fd: int) -> None:
    """Have the kernel start writing ``fd``'s dirty pages now, without waiting: the fsyncs
    of a batch, issued after all of its writes, then find the data on its way and share
    the journal commits instead of waiting one fsync at a time (``docs/benchmarks.md``).
    Best effort: without ``posix_fadvise`` the fsync does it all."""
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except (OSError, AttributeError):
        pass


def fsync_dir(fd: int) -> None:
    """Flush a directory's entries (some file systems refuse fsync on a directory)."""
    try:
        os.fsync(fd)
    except OSError:
        pass


#: How many fsyncs of a batch run at once. Concurrent fsyncs share the file system's
#: journal commits (ext4 groups them), where one after another each waits for a commit of
#: its own (docs/benchmarks.md has the figures). Each file is still fsynced, and all of
#: them end before the call returns.
SYNC_THREADS = 8
#: A call of ``each_at_once`` that returns within this many seconds did not wait for a
#: disk (tmpfs, or data already written): while each one does, the calling thread goes
#: on alone, as threads would only add hand-offs of the interpreter's lock (on tmpfs they
#: cost a 20k-file push a quarter of its CPU and half of its wall time).
QUICK = 50e-6
#: The clock ``each_at_once`` times its calls with.
clock = time.perf_counter


def each_at_once(fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """``fn(item)`` for every item, the results in order: in the calling thread while each
    call is ``QUICK``; from the first that is not, the rest ``SYNC_THREADS`` at a time.
    An exception of any is raised here once all have ended. While the interpreter is
    finalizing (a sync-back from a finalizer) no thread can start: all run in this one."""
    out: list[Any] = [None] * len(items)
    first = 0
    while first < len(items):
        began = clock()
        out[first] = fn(items[first])
        first += 1
        if clock() - began >= QUICK:
            break
    rest = len(items) - first
    failed: list[BaseException] = []
    workers = 1 if sys.is_finalizing() else max(1, min(SYNC_THREADS, rest))

    def work(k: int) -> None:
        try:
            for i in range(first + k, len(items), workers):
                out[i] = fn(items[i])
        except BaseException as exc:  # re-raised in the calling thread, below
            failed.append(exc)

    started: list[threading.Thread] = []
    if workers > 1:  # a call waited for a disk: a push to tmpfs never loads threading
        import threading
    for k in range(1, workers):
        t = threading.Thread(target=work, args=(k,))
        try:
            t.start()
        except RuntimeError:  # no new thread now (interpreter shutdown): its share here
            work(k)
        else:
            started.append(t)
    work(0)
    for t in started:
        t.join()
    if failed:
        raise failed[0]
    return out


def batch_limit(open_files: int) -> int:
    """How many files a ``Batch`` holds before it commits them, where this process may
    open ``open_files`` descriptors (-1: no limit): 512, or fewer so that a batch (a
    descriptor per file and per directory) takes at most half of them. The more files one
    commit covers, the fewer rounds of journal commits (docs/benchmarks.md)."""
    return 512 if open_files < 0 else max(1, min(512, open_files // 4))


def batch_descriptors() -> int:
    """How many descriptors a request's ``Batch`` may hold at once, with room to spare (a
    temp file and a directory per pending file, the ``Dirs`` chain, the streams), within
    what this process may open."""
    limit, want = _open_files(), 2 * Batch.LIMIT + 64
    return want if limit < 0 else min(want, limit)


def _open_files() -> int:
    try:
        import resource

        return resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return 512  # unknown: a 128-file batch, as where 512 descriptors is the limit


class Batch:
    """Uploaded files of one request, committed together (see the module docstring).

    ``add`` takes a written ``TempFile``; every ``LIMIT`` files (bounding the descriptors
    held open) and at ``finish`` the pending ones are all fsynced, then renamed (each only
    if its target is unchanged, checked right before), then their directories are fsynced
    once each. ``finish`` returns every file's row in ``add`` order.
    """

    LIMIT = batch_limit(_open_files())

    def __init__(self) -> None:
        self.rows: list[list[Any]] = []
        #: the listing rows of the files placed so far (``TempFile.listed``)
        self.placed: list[list[Any]] = []
        self.pending: list[tuple[int, TempFile, list[int] | None]] = []
        #: a descriptor of its own per directory of the pending files (the ``Dirs``
        #: cache closes its own as the request moves on)
        self.dirs: dict[tuple[int, int], int] = {}

    def put(self, row: list[Any]) -> None:
        """A file's row that needs no commit (refused, or aborted by the client)."""
        self.rows.append(row)

    def add(self, sink: TempFile, mode: int, mtime_ns: int, expect: list[int] | None) -> None:
        row = sink.prepare(mode, mtime_ns)
        if row is not None:
            self.rows.append(row)
            return
        # By identity, not name: a directory replaced since an earlier file of the batch
        # is another directory, and the temp file is in the one it was made in.
        key = sink.dir_key
        if key not in self.dirs:
            try:
                self.dirs[key] = os.dup(sink.pfd)
            except OSError as exc:
                sink.abort()
                self.rows.append([sink.rel, Status.ERROR, *reason_of(exc)])
                return
        sink.pfd = self.dirs[key]
        self.rows.append([])
        self.pending.append((len(self.rows) - 1, sink, expect))
        if len(self.pending) >= self.LIMIT:
            self.flush()

    def flush(self) -> None:
        """Commit the pending files: data, then names, then directories."""
        pending, self.pending = self.pending, []
        synced = []
        sinks = [sink for _, sink, _ in pending]
        # Every file's writeback is under way before the first fsync waits, so that the
        # fsyncs share journal commits; started here, in the threads, it costs the
        # receiving thread nothing per file (docs/benchmarks.md).
        each_at_once(TempFile.start_writeback, sinks)
        rows = each_at_once(TempFile.sync, sinks)
        for (index, sink, expect), row in zip(pending, rows, strict=True):
            if row is None:
                synced.append((index, sink, expect))
            else:
                self.rows[index] = row
        for index, sink, expect in synced:
            self.rows[index] = sink.place(expect)
            if sink.listed is not None:
                self.placed.append(sink.listed)
        dirs, self.dirs = self.dirs, {}
        for fd in dirs.values():
            fsync_dir(fd)
            os.close(fd)

    def finish(self) -> list[list[Any]]:
        self.flush()
        rows, self.rows = self.rows, []
        return rows


def delete_file(rfd: int, rel: str, expect: list[int]) -> list[Any]:
    """Unlink ``rel`` if it is still as listed; prune directories it leaves empty."""
    try:
        parts = split_rel(rel)
        pfd = open_parent(rfd, parts, False)
    except FileNotFoundError:
        return [rel, Status.OK]
    except (OSError, ValueError) as exc:
        return [rel, Status.ERROR, *reason_of(exc)]
    try:
        st = stat_at(pfd, parts[-1])
        if st is None:
            return [rel, Status.OK]
        if not unchanged(st, expect):
            return [rel, Status.CHANGED, Reason.CHANGED.value, ""]
        os.unlink(parts[-1], dir_fd=pfd)
    except OSError as exc:
        return [rel, Status.ERROR, *reason_of(exc)]
    finally:
        os.close(pfd)
    prune_empty_dirs(rfd, parts[:-1])
    return [rel, Status.OK]


def prune_empty_dirs(rfd: int, dirs: list[str]) -> None:
    """Remove now-empty parent directories, deepest first, never the root."""
    while dirs:
        try:
            pfd = open_parent(rfd, dirs, False)
        except OSError:
            return
        try:
            os.rmdir(dirs[-1], dir_fd=pfd)
        except OSError:
            return
        finally:
            os.close(pfd)
        dirs = dirs[:-1]

