"""Listings kept current by Linux inotify, so a quiet tree costs no walk."""

from __future__ import annotations

import os
import struct
import sys
import time

from filesync.tree.walk import list_dir, open_listed

#: ``typing`` is for the type checker only: the remote helper starts without importing it.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from filesync.tree.ignore import Matcher

_IN_MODIFY, _IN_ATTRIB, _IN_CLOSE_WRITE = 0x2, 0x4, 0x8
_IN_MOVED_FROM, _IN_MOVED_TO, _IN_CREATE, _IN_DELETE = 0x40, 0x80, 0x100, 0x200
_IN_DELETE_SELF, _IN_MOVE_SELF = 0x400, 0x800
_IN_Q_OVERFLOW, _IN_IGNORED, _IN_ISDIR = 0x4000, 0x8000, 0x40000000
_IN_ONLYDIR = 0x01000000
_WATCH_MASK = (_IN_MODIFY | _IN_ATTRIB | _IN_CLOSE_WRITE | _IN_MOVED_FROM | _IN_MOVED_TO
               | _IN_CREATE | _IN_DELETE | _IN_DELETE_SELF | _IN_MOVE_SELF | _IN_ONLYDIR)
#: Events after which the set of directories may differ: the tree is walked again.
_STRUCTURAL = _IN_Q_OVERFLOW | _IN_IGNORED | _IN_DELETE_SELF | _IN_MOVE_SELF | _IN_ISDIR
_EVENT = struct.Struct("iIII")
if TYPE_CHECKING:
    #: A listed file as ``walk`` lists it: path, kind, size, mtime, mode, inode, links.
    Row = tuple[Any, ...]
#: Filesystems whose changes all pass through this kernel, so inotify sees every one.
#: (Network and FUSE filesystems change behind its back: those trees are walked.)
LOCAL_FS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "ramfs", "f2fs", "zfs",
                      "bcachefs", "jfs", "nilfs2", "overlay", "vfat", "exfat", "ntfs3"})


class _Inotify:
    """The three libc calls, through ctypes (stdlib); None where they are missing."""

    def __init__(self) -> None:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        self._init = libc.inotify_init1
        self._init.argtypes = [ctypes.c_int]
        self._add = libc.inotify_add_watch
        self._add.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        self._errno = ctypes.get_errno

    @classmethod
    def load(cls) -> _Inotify | None:
        if not sys.platform.startswith("linux") or not os.path.isdir("/proc/self/fd"):
            return None
        try:
            return cls()
        except (ImportError, OSError, AttributeError):
            return None

    def open(self) -> int:
        fd = int(self._init(os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)))
        if fd < 0:
            raise OSError(self._errno(), "inotify_init1 failed")
        return fd

    def watch(self, ifd: int, dfd: int) -> int:
        """Watch the directory open as ``dfd`` (the very inode listed, whatever its path)."""
        wd = int(self._add(ifd, f"/proc/self/fd/{dfd}".encode(), _WATCH_MASK))
        if wd < 0:
            raise OSError(self._errno(), "inotify_add_watch failed")
        return wd


def _unescape_mount(text: str) -> str:
    import re  # only a watched listing reads the mount table: a plain one never loads re

    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


def local_filesystems_only(root: str, mountinfo: str | None = None) -> bool:
    """True if ``root`` and every mount below it are on filesystems in ``LOCAL_FS``
    (``mountinfo``: the text of /proc/self/mountinfo, read when not given)."""
    if mountinfo is None:
        try:
            with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
                mountinfo = f.read()
        except OSError:
            return False
    lines = mountinfo.splitlines()
    real = os.path.realpath(root)
    holder, holder_fs, inner = "", "", []
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or not tail:
            continue
        point, fstype = _unescape_mount(fields[4]), tail[0]
        if point.startswith(real.rstrip("/") + "/"):
            inner.append(fstype)
        if (real == point or real.startswith(point.rstrip("/") + "/")) and len(point) >= len(
                holder):
            holder, holder_fs = point, fstype
    return holder_fs in LOCAL_FS and all(fs in LOCAL_FS for fs in inner)


class WatchedTree:
    """A listing of ``root`` kept current by inotify: a refresh lists again only the
    directories the kernel reported a change in, so a quiet tree costs no walk.

    Every directory is watched before it is listed, so no change slips between the two.
    Whatever may change the set of directories (a directory created, removed, moved or
    chmodded, a lost event, an overflowed queue) and every ``FULL_EVERY`` seconds, the
    tree is walked again in full. ``create`` returns None where inotify cannot be trusted
    (not Linux, no ctypes, a network filesystem, too few watches): callers then walk.
    """

    FULL_EVERY = 300.0

    def __init__(self, root: str, matcher: Matcher, api: _Inotify) -> None:
        self.root, self.matcher, self.api = root, matcher, api
        self.ifd = -1
        self.dirs: dict[str, tuple[list[Row], list[list[str]], int, list[str]]] = {}
        #: the permission bits seen, each value one object shared by every row
        self.modes: dict[int, int] = {}
        self.paths: dict[str, str] = {}  # prefix -> path
        self.wds: dict[int, str] = {}  # watch descriptor -> prefix
        self.walked_at = 0.0
        self.walks = 0  # full walks so far (tests and -v read it)
        #: a directory could not be opened (so not watched): walk in full every time
        self.blind = False
        #: directories holding files with more than one link
        self.linked: set[str] = set()
        #: prefixes drained by ``absorb`` ahead of the next refresh (None: a walk is due)
        self.pending: set[str] | None = set()

    @classmethod
    def create(cls, root: str, matcher: Matcher) -> WatchedTree | None:
        api = _Inotify.load()
        if api is None or not local_filesystems_only(root):
            return None
        return cls(root, matcher, api)

    def close(self) -> None:
        if self.ifd >= 0:
            os.close(self.ifd)
            self.ifd = -1

    def refresh(self) -> tuple[list[Row], list[list[str]], int,
                               tuple[list[Row], list[str]] | None]:
        """``(entries, skipped, excluded, delta)`` as ``walk`` gives them, now.

        ``delta`` is ``(changed rows, removed paths)`` against the previous refresh, or
        None after a full walk. Raises ``OSError`` when watching failed (the caller walks).
        """
        dirty = self._drain() if self.ifd >= 0 and not self.blind else None
        early, self.pending = self.pending, set()
        dirty = None if dirty is None or early is None else dirty | early
        if dirty is None or time.monotonic() - self.walked_at > self.FULL_EVERY:
            self._walk_all()
            return (*self._gather(), None)
        # A hard-linked file can change through a link in another directory, which raises
        # no event here: directories holding one are listed again every time.
        dirty |= self.linked
        changed: list[Row] = []
        removed: list[str] = []
        inodes: set[int] = set()
        for prefix in dirty:
            if not self._relist(prefix, changed, removed, inodes):
                self._walk_all()  # its subdirectories changed after all
                return (*self._gather(), None)
        # A link made or removed changes the link count of the file's other names too.
        others = {prefix for prefix, d in self.dirs.items() if prefix not in dirty
                  and any(row[5] in inodes for row in d[0])} if inodes else set()
        for prefix in others:
            if not self._relist(prefix, changed, removed, set()):
                self._walk_all()
                return (*self._gather(), None)
        return (*self._gather(), (changed, removed))

    def absorb(self) -> None:
        """Read the pending events now, keeping what they say for the next refresh.

        Lets a waiter (``filesync.tree.server``'s ``wait``) tell when a burst of changes
        has settled (the descriptor is readable again only for new events).
        """
        if self.ifd < 0:
            return
        dirty = self._drain()
        self.pending = None if dirty is None or self.pending is None else self.pending | dirty

    def _relist(self, prefix: str, changed: list[Row], removed: list[str],
                inodes: set[int]) -> bool:
        """List one directory again and record how its rows changed; False if its set of
        subdirectories changed (a full walk is due). ``inodes`` collects the inodes
        whose link count changed."""
        old = self.dirs[prefix]
        new = self._list(self.paths[prefix], prefix)
        if new[3] != old[3]:
            return False
        before = {row[0]: row for row in old[0]}
        for row in new[0]:
            was = before.pop(row[0], None)
            if was != row:
                changed.append(row)
                if row[6] > 1 or (was is not None and was[6] != row[6]):
                    inodes.add(row[5])
        for rel, row in before.items():
            removed.append(rel)
            if row[6] > 1:
                inodes.add(row[5])
        return True

    def _gather(self) -> tuple[list[Row], list[list[str]], int]:
        parts = self.dirs.values()
        return ([row for d in parts for row in d[0]], [s for d in parts for s in d[1]],
                sum(d[2] for d in parts))

    def _drain(self) -> set[str] | None:
        """Prefixes of the directories with pending events; None if a full walk is due."""
        dirty: set[str] = set()
        while True:
            try:
                data = os.read(self.ifd, 1 << 16)
            except BlockingIOError:
                return dirty
            offset = 0
            while offset < len(data):
                wd, mask, _cookie, size = _EVENT.unpack_from(data, offset)
                start, offset = offset + _EVENT.size, offset + _EVENT.size + size
                prefix = self.wds.get(wd)
                if prefix is None:
                    return None
                if mask & _STRUCTURAL and not (
                    mask & _IN_ISDIR and not mask & (_IN_Q_OVERFLOW | _IN_IGNORED)
                    and self._pruned(prefix, data[start:offset])
                ):
                    return None
                dirty.add(prefix)

    def _pruned(self, prefix: str, raw: bytes) -> bool:
        """True if the event's subdirectory is pruned by the rule (an excluded dir such as
        node_modules coming and going): its parent is listed again, nothing is walked."""
        name = os.fsdecode(raw.rstrip(b"\0"))
        return bool(name) and self.matcher.matches(prefix + name, True)

    def _walk_all(self) -> None:
        self.close()
        self.dirs, self.paths, self.wds = {}, {"": self.root}, {}
        self.blind, self.linked, self.pending = False, set(), set()
        self.walked_at = time.monotonic()
        self.walks += 1
        self.ifd = self.api.open()
        stack = [""]
        while stack:
            prefix = stack.pop()
            stack.extend(self._list(self.paths[prefix], prefix)[3])

    def _list(self, path: str, prefix: str) -> tuple[
            list[Row], list[list[str]], int, list[str]]:
        """Watch, then list, one directory, as ``walk`` lists it (an unreadable one is a
        skipped row). The result is kept in ``dirs``; its subdirectories in ``paths``."""
        entries: list[list[Any]] = []
        skipped: list[list[str]] = []
        subdirs: list[tuple[str, str]] = []
        excluded = 0
        dfd = open_listed(path, prefix, skipped)
        if dfd >= 0:
            try:
                self.wds[self.api.watch(self.ifd, dfd)] = prefix
                excluded = list_dir(dfd, path, prefix, self.matcher, entries, skipped, subdirs)
            finally:
                os.close(dfd)
        else:
            self.blind = True
        for sub_path, sub_prefix in subdirs:
            self.paths[sub_prefix] = sub_path
        # Kept until the directory changes: as tuples (a third smaller than the lists
        # the walk builds), their permission bits one object per distinct value.
        modes = self.modes
        rows: list[Row] = [(r[0], r[1], r[2], r[3], modes.setdefault(r[4], r[4]), r[5], r[6])
                           for r in entries]
        listed = (rows, skipped, excluded, [p for _path, p in subdirs])
        self.dirs[prefix] = listed
        if any(row[6] > 1 for row in rows):
            self.linked.add(prefix)
        else:
            self.linked.discard(prefix)
        return listed


