"""The host's watched listing: a host tree kept current by ``watchfiles`` (inotify on Linux,
FSEvents on macOS, ReadDirectoryChangesW on Windows), so that a quiet tree costs no walk;
and the one source of host change events for a watch loop (``follow``).

Guarantees:

- a listing lists exactly what a fresh walk lists (``tree.walk``'s rule, row for row), as
  of the call: every change made before the call is in it. watchfiles hands its events
  over from its own thread, so a listing first creates a cookie file in a private
  directory that the same watch watches and takes every event up to that cookie's (the
  events of one watch arrive in order);
- only the directories the exclusion rule keeps are watched, each on its own (never
  recursively): no watch is ever placed in ``node_modules``, ``.git`` and the like;
- whenever a listing cannot be sure, it walks the whole tree and places the watch anew:
  after a directory was created, removed, renamed or chmodded; when its cookie is not
  seen within ``SETTLE_MS`` or the watch reported an error; after more than ``BURST``
  changes since the last listing; and every ``FULL_EVERY`` seconds. (An inotify queue
  overflow is not reported through watchfiles: notify's rescan event carries no path and
  watchfiles drops it. A burst large enough to overflow is walked by the ``BURST`` rule;
  what else a watch cannot see, such as an mmap write or a hard link made from outside
  the tree, is bounded by ``FULL_EVERY``.) The watch is placed before the walk lists
  anything, so no change slips between the two;
- where no watch can be placed (no native watcher here, the watch limit, a network or
  FUSE filesystem at or below the root), ``WatchedTrees.get`` gives None or the listing
  gives None from then on: the caller walks in full every pass (``why`` says why);
- ``follow``: a watch loop is woken from the same watch, after each burst of changes the
  rule keeps has settled: one set of events feeds both its wake-ups and the listing;
- the tree holds one object per file, its ``Entry``; a listing's entries are those very
  objects, and an unchanged file keeps its object from listing to listing.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from filesync.core.exclude import ExcludeRule
from filesync.core.lineage import Series
from filesync.core.model import Entry, Listing, Skipped, filter_unsafe
from filesync.tree.bounded import Bounded
from filesync.tree.dirfd import TEMP_PREFIX, is_temp_name
from filesync.tree.ignore import Matcher
from filesync.tree.paths import all_safe
from filesync.tree.walk import list_dir, open_listed
from filesync.tree.watch import local_filesystems_only
from filesync.tree.wire import parse_reason

#: Seconds after which a listing walks in full again, whatever the watch says.
FULL_EVERY = 300.0
#: How long a listing waits for its cookie before it walks instead (milliseconds).
SETTLE_MS = 2000
#: Changes since the last listing beyond which it walks instead (see the module docstring).
BURST = 4096
#: A watch loop is woken once a burst has been quiet this long (milliseconds) ...
STEP_MS = 30
#: ... or this long after its first change, if it never quiets.
DEBOUNCE_MS = 500
#: watchfiles' change codes (``watchfiles.Change``).
ADDED, MODIFIED, DELETED = 1, 2, 3
#: Watched host trees one owner keeps; the oldest are closed beyond it.
MAX_WATCHED = 8


class Notify(Protocol):
    """What is used of ``watchfiles._rust_notify.RustNotify`` (untyped)."""

    def watch(self, debounce_ms: int, step_ms: int, timeout_ms: int,
              stop_event: Any) -> Any: ...
    def close(self) -> None: ...


def start_notify(paths: list[str]) -> Notify:
    """A running watchfiles watch of ``paths``, each directory on its own."""
    from watchfiles._rust_notify import RustNotify

    return RustNotify(paths, False, False, 0, False, True)


def all_local(root: str) -> bool:
    """True if every change under ``root`` passes through this machine's kernel, so a
    watch sees it. Checked on Linux (``tree.watch.local_filesystems_only``); elsewhere
    the native watcher is trusted."""
    return local_filesystems_only(root) if sys.platform.startswith("linux") else True


class CannotWatch(Exception):
    """No watch could be placed on the tree (the reason is the message)."""


def kept_dirs(root: str, matcher: Matcher) -> set[str]:
    """Every directory under ``root`` that the rule keeps, ``root`` included."""
    out: set[str] = set()
    stack = [(root, "")]
    while stack:
        path, rel = stack.pop()
        out.add(path)
        try:
            with os.scandir(path) as it:
                for entry in it:
                    if entry.is_dir(follow_symlinks=False):
                        sub = f"{rel}{entry.name}"
                        if not matcher.matches(sub, True):
                            stack.append((entry.path, sub + "/"))
        except OSError:
            continue  # unreadable: its walk reports it
    return out


#: One listed directory: its files' paths, its skipped rows, how many names it pruned,
#: its kept subdirectories' prefixes (sorted).
_Dir = tuple[tuple[str, ...], list[list[str]], int, tuple[str, ...]]


class _GiveUp:
    """The stop event of a follower's wait: set only when the wait can be ended no other
    way (no cookie could be written), after the tree was marked for a full walk."""

    def __init__(self) -> None:
        self.set = False

    def is_set(self) -> bool:
        return self.set


class WatchedTree:
    """One host tree under one rule, watched (see the module docstring).

    One listing at a time (``lock``: fan-out passes share the tree); the watch's events
    are taken by whichever thread waits on it, the listing's or the follower's."""

    def __init__(self, root: str, matcher: Matcher) -> None:
        self.root = os.path.abspath(root)
        self.matcher = matcher
        self._base = self.root.rstrip(os.sep) + os.sep
        self.entries: dict[str, Entry] = {}
        self.dirs: dict[str, _Dir] = {}
        #: the permission bits seen, each value one object shared by every entry
        self.modes: dict[int, int] = {}
        #: link counts of the files with more than one link, and the directories holding them
        self.links: dict[str, int] = {}
        self.linked: set[str] = set()
        #: every name in ``entries`` passes the path-safety rule
        self.safe = False
        #: the paths each listing changed (``filesync.core.lineage``); new at a full walk
        self.series = Series()
        self.lock = threading.Lock()
        self.walked_at = 0.0
        self.walks = 0  # full walks so far (tests read it)
        #: a directory could not be listed: walk in full every time
        self.blind = False
        #: why the tree cannot be watched ("" while it can)
        self.why = ""
        self.notify: Notify | None = None
        #: the directories watched now (absolute paths)
        self.watched: frozenset[str] = frozenset()
        self._cookie_dir = ""
        # Everything below is guarded by ``_state``.
        self._state = threading.Condition()
        self._pending: set[str] | None = None  # dirty prefixes; None: a full walk is due
        self._changes = 0
        self._written = 0
        self._seen: set[int] = set()
        self._inside = 0  # threads waiting on a watch now
        self._settling = 0  # of which listings waiting for their cookie
        self._retired: list[Notify] = []
        self._followers: list[Callable[[], None]] = []
        self._pump: threading.Thread | None = None
        self._give_up = _GiveUp()

    # -- the listing -------------------------------------------------------------------

    def listing(self) -> Listing | None:
        """A fresh listing, or None when the tree cannot be watched (the caller walks)."""
        with self.lock:
            if self.why:
                return None
            try:
                delta = self._refresh()
            except CannotWatch as exc:
                self._fail(str(exc))
                return None
            if delta is not None:
                changed, removed = delta
                # Only the names that came in can break a tree that was all safe.
                self.safe = self.safe and all_safe(changed)
                self.series.advance([*removed, *changed])
            parts = self.dirs.values()
            listing = Listing(self.root, True, excluded=sum(d[2] for d in parts),
                              lineage=self.series.now())
            listing.entries = dict(self.entries)
            listing.skipped = [Skipped.of(p, parse_reason(c), d)
                               for part in parts for p, c, d in part[1]]
            if not self.safe:
                filter_unsafe(listing)
            return listing

    def _refresh(self) -> tuple[list[str], list[str]] | None:
        """Bring the tree up to date: ``(changed, removed)`` paths, or None after a full
        walk."""
        if self.notify is None or self.blind or time.monotonic() - self.walked_at > FULL_EVERY:
            self._walk_all()
            return None
        settled = self._settle()
        with self._state:
            dirty, self._pending = self._pending, set()
            many, self._changes = self._changes > BURST, 0
        if not settled or dirty is None or many:
            self._walk_all()
            return None
        # A hard-linked file can change through a link in another directory, which raises
        # no event here: directories holding one are listed again every time.
        dirty |= self.linked
        changed: list[str] = []
        removed: list[str] = []
        inodes: set[int] = set()
        for prefix in dirty:
            if not self._relist(prefix, changed, removed, inodes):
                self._walk_all()  # its subdirectories changed after all
                return None
        # A link made or removed makes the file's other names linked (or not) too.
        others = {prefix for prefix, d in self.dirs.items() if prefix not in dirty
                  and any(self.entries[rel].ino in inodes for rel in d[0])} if inodes else set()
        for prefix in others:
            if not self._relist(prefix, changed, removed, set()):
                self._walk_all()
                return None
        return changed, removed

    def _relist(self, prefix: str, changed: list[str], removed: list[str],
                inodes: set[int]) -> bool:
        """List one directory again and record which of its files changed; False if it
        is gone or its set of subdirectories changed (a full walk is due). ``inodes``
        collects the inodes whose link count changed or is above one."""
        old = self.dirs.get(prefix)
        if old is None:
            return False
        listed = self._list(prefix)
        if listed is None or listed[3] != old[3]:
            return False
        entries, links = self.entries, self.links
        for rel, (size, mtime_ns, mode, ino, nlink) in listed[0].items():
            was = entries.get(rel)
            if was is None or was[2] != size or was[3] != mtime_ns or was[4] != mode \
                    or was[5] != ino:
                entries[rel] = Entry(rel, "f", size, mtime_ns, mode, ino)
                changed.append(rel)
            if nlink > 1 or links.get(rel, 1) != nlink:
                inodes.add(ino)
            if nlink > 1:
                links[rel] = nlink
            else:
                links.pop(rel, None)
        for rel in old[0]:
            if rel not in listed[0]:
                if links.pop(rel, 1) > 1:
                    inodes.add(entries[rel].ino)
                del entries[rel]
                removed.append(rel)
        self._keep(prefix, listed)
        return True

    def _walk_all(self) -> None:
        """Place the watch on every kept directory, then list them all. Raises
        ``CannotWatch`` where no watch can be placed."""
        self.walks += 1
        self.walked_at = time.monotonic()
        self.series = Series()
        for attempt in range(3):
            try:
                self._place(kept_dirs(self.root, self.matcher))
                placed = True
            except FileNotFoundError:  # a directory went between its listing and its watch
                placed = False
                if attempt < 2:
                    continue
            with self._state:
                self._pending, self._changes = set(), 0
            self.entries, self.dirs, self.links, self.linked = {}, {}, {}, set()
            self.blind = False
            stack = [""]
            while stack:
                prefix = stack.pop()
                listed = self._list(prefix)
                if listed is None:
                    self.blind = True
                    continue
                for rel, (size, mtime_ns, mode, ino, nlink) in listed[0].items():
                    self.entries[rel] = Entry(rel, "f", size, mtime_ns, mode, ino)
                    if nlink > 1:
                        self.links[rel] = nlink
                self._keep(prefix, listed)
                stack.extend(listed[3])
            self.safe = all_safe(self.entries.keys())
            if placed and {self._path(p) for p in self.dirs} <= self.watched:
                return
        # Directories keep appearing while it walks: the next listing walks again.
        self.blind = True

    def _list(self, prefix: str) -> tuple[dict[str, tuple[int, int, int, int, int]],
                                          list[list[str]], int, tuple[str, ...]] | None:
        """One directory as ``walk`` lists it: its files (path: size, mtime, mode, inode,
        links), skipped rows, pruned count, kept subdirectories; None if it cannot be
        opened (its skipped row is kept, and the tree is walked in full from then on)."""
        path = self._path(prefix)
        rows: list[list[Any]] = []
        skipped: list[list[str]] = []
        subdirs: list[tuple[str, str]] = []
        dfd = open_listed(path, prefix, skipped)
        if dfd < 0:
            self.dirs[prefix] = ((), skipped, 0, ())
            return None
        try:
            excluded = list_dir(dfd, path, prefix, self.matcher, rows, skipped, subdirs)
        finally:
            os.close(dfd)
        modes = self.modes
        files = {r[0]: (r[2], r[3], modes.setdefault(r[4], r[4]), r[5], r[6]) for r in rows}
        return files, skipped, excluded, tuple(sorted(p for _path, p in subdirs))

    def _keep(self, prefix: str, listed: tuple[dict[str, Any], list[list[str]], int,
                                               tuple[str, ...]]) -> None:
        self.dirs[prefix] = (tuple(listed[0]), listed[1], listed[2], listed[3])
        if any(rel in self.links for rel in listed[0]):
            self.linked.add(prefix)
        else:
            self.linked.discard(prefix)

    def _path(self, prefix: str) -> str:
        return self._base + prefix.rstrip("/") if prefix else self.root

    # -- the watch ---------------------------------------------------------------------

    def _place(self, dirs: set[str]) -> None:
        """Watch ``dirs`` (and the cookie directory) from now on, in place of the old
        watch."""
        if not self._cookie_dir or not os.path.isdir(self._cookie_dir):
            self._cookie_dir = self._new_cookie_dir()
        try:
            notify = start_notify([*sorted(dirs), self._cookie_dir])
        except FileNotFoundError:
            raise
        except Exception as exc:  # the watch limit, no native watcher here
            raise CannotWatch(str(exc).splitlines()[0] if str(exc)
                              else type(exc).__name__) from exc
        with self._state:
            self._give_up.set = False
            old, self.notify, self.watched = self.notify, notify, frozenset(dirs)
            if old is not None:
                self._retired.append(old)
            self._close_retired()
            waiting = self._inside > 0
            self._state.notify_all()
        if waiting:  # end the follower's wait on the old watch
            self._nudge()

    def _new_cookie_dir(self) -> str:
        """A private directory for the cookies, outside the tree (a cookie must never be
        listed), on a local filesystem."""
        real = os.path.realpath(self.root).rstrip(os.sep) + os.sep
        for parent in (tempfile.gettempdir(), os.path.expanduser("~"), "/dev/shm"):
            inside = (os.path.realpath(parent).rstrip(os.sep) + os.sep).startswith(real)
            if not inside and os.path.isdir(parent) and all_local(parent):
                with contextlib.suppress(OSError):
                    return tempfile.mkdtemp(prefix="filesync-watch-", dir=parent)
        raise CannotWatch("no local directory outside the tree for the watch's cookies")

    def _close_retired(self) -> None:
        if not self._inside:
            for old in self._retired:
                old.close()
            self._retired = []

    def _cookie(self) -> int:
        """Create (and remove) a new cookie file; its number."""
        with self._state:
            self._written += 1
            n = self._written
        path = os.path.join(self._cookie_dir, str(n))
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY | getattr(os, "O_CLOEXEC", 0), 0o600))
        os.unlink(path)
        return n

    def _nudge(self) -> None:
        """Make every wait on the watch return (a cookie nobody waits for)."""
        try:
            self._cookie()
        except OSError:
            with self._state:
                self._pending = None
            self._give_up.set = True

    def _settle(self) -> bool:
        """Take every event up to now (False: that cannot be told; walk instead)."""
        try:
            n = self._cookie()
        except OSError:
            return False
        deadline = time.monotonic() + SETTLE_MS / 1000
        while True:
            with self._state:
                if n in self._seen:
                    self._seen.clear()
                    return True
                notify = self.notify
                left = int((deadline - time.monotonic()) * 1000)
                if notify is None or left <= 0:
                    return False
                self._inside += 1
                self._settling += 1
            try:
                raw = notify.watch(50, 1, left, None)
            except Exception:  # the watcher's own error: it may have missed events
                raw = None
            finally:
                with self._state:
                    self._inside -= 1
                    self._settling -= 1
            if not isinstance(raw, set):
                # Timed out: watchfiles clears what came in as it gives up.
                return False
            self._take(raw, notify)

    def _take(self, raw: set[tuple[int, str]], notify: Notify) -> None:
        """Record what ``raw`` (drained from ``notify``) says; wake the followers for a
        change the rule keeps."""
        wanted = cookie = False
        with self._state:
            current = notify is self.notify
            for change, path in raw:
                if os.path.dirname(path) == self._cookie_dir:
                    if change == ADDED:
                        with contextlib.suppress(ValueError):
                            self._seen.add(int(os.path.basename(path)))
                        cookie = True
                    continue
                if not current:
                    continue  # the walk after its replacement lists it anew
                self._changes += 1
                wanted |= self._record(change, path)
            nudge = cookie and self._settling > 0
            self._close_retired()
            followers = list(self._followers) if wanted else []
            self._state.notify_all()
        if nudge:  # a listing may still wait for the cookie just taken here
            self._nudge()
        for wake in followers:
            wake()

    def _record(self, change: int, path: str) -> bool:
        """Mark what one event dirtied (under ``_state``); True if the rule keeps it."""
        if path == self.root or path in self.watched:
            self._pending = None  # a watched directory itself changed
            return True
        if not path.startswith(self._base):
            return False
        rel = path[len(self._base):].replace(os.sep, "/")
        parent, _, name = rel.rpartition("/")
        if name.startswith(TEMP_PREFIX) and is_temp_name(name):
            return False  # filesync's own staging, never listed; its rename is an event
        is_dir = change != DELETED and os.path.isdir(path) and not os.path.islink(path)
        pruned = self.matcher.matches(rel, is_dir)
        if is_dir and not pruned:
            self._pending = None  # a new directory: watched from the next walk on
            return True
        if self._pending is not None:
            self._pending.add(parent + "/" if parent else "")
        return not pruned

    def _fail(self, why: str) -> None:
        """Stop watching for good; the followers are woken one last time (they read
        ``why`` and poll from then on)."""
        self.why = why
        with self._state:
            followers = list(self._followers)
        self.close()
        for wake in followers:
            wake()

    # -- following -----------------------------------------------------------------------

    def follow(self, wake: Callable[[], None]) -> str:
        """Call ``wake`` (from a thread of the tree's; it must only signal) after each
        burst of changes the rule keeps has settled, until ``unfollow``. Returns "" once
        the watch is placed, or why the tree cannot be watched."""
        with self.lock:
            if not self.why and self.notify is None:
                try:
                    self._walk_all()
                except CannotWatch as exc:
                    self._fail(str(exc))
            if self.why:
                return self.why
            with self._state:
                self._followers.append(wake)
                if self._pump is None:
                    self._give_up.set = False
                    self._pump = threading.Thread(target=self._serve, daemon=True,
                                                  name="filesync-host-watch")
                    self._pump.start()
        return ""

    def unfollow(self, wake: Callable[[], None]) -> None:
        with self._state:
            with contextlib.suppress(ValueError):
                self._followers.remove(wake)
            pump = self._pump if not self._followers else None
            self._state.notify_all()
        if pump is not None:
            self._nudge()
            if pump is not threading.current_thread():
                pump.join()

    def _serve(self) -> None:
        """The followers' thread: wait on the watch, record, wake."""
        while True:
            with self._state:
                notify = self.notify
                if not self._followers or notify is None or self._give_up.set:
                    self._pump = None
                    return
                self._inside += 1
            try:
                raw = notify.watch(DEBOUNCE_MS, STEP_MS, 0, self._give_up)
            except Exception:  # the watcher's own error: walk in full next time
                raw = None
            finally:
                with self._state:
                    self._inside -= 1
            if isinstance(raw, set):
                self._take(raw, notify)
                continue
            with self._state:
                self._pending = None
                followers = list(self._followers)
            for wake in followers:
                wake()  # the pass walks in full and places a new watch
            self._await_new_watch(notify)

    def _await_new_watch(self, broken: Notify) -> None:
        with self._state:
            self._state.wait_for(lambda: self.notify is not broken or not self._followers)

    def close(self) -> None:
        """End the watch and the followers' thread."""
        with self._state:
            self._followers = []
            pump = self._pump
            self._state.notify_all()
        if pump is not None and pump is not threading.current_thread():
            self._nudge()
            pump.join()
        with self._state:
            notify, self.notify = self.notify, None
            if notify is not None:
                self._retired.append(notify)
            self._close_retired()
            self.watched = frozenset()
        if self._cookie_dir:
            shutil.rmtree(self._cookie_dir, ignore_errors=True)



class WatchedTrees:
    """The host trees one owner (``filesync.sync.warm.WarmState``) keeps watched between
    its passes, by (root, rule); ``close`` ends every watch. Thread-safe: fan-out passes
    list from worker threads."""

    def __init__(self, max_trees: int = MAX_WATCHED) -> None:
        # A tree pushed out while a loop follows it: the loop polls it from then on.
        self._trees: Bounded[tuple[str, str], WatchedTree | None] = Bounded(
            max_trees, lambda old: old._fail("too many trees watched") if old else None)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._trees)

    def get(self, root: Path, rule: ExcludeRule) -> WatchedTree | None:
        """The tree of ``root`` under ``rule``, watched from its first listing on (None
        where it cannot be watched: a network or FUSE filesystem at or below it)."""
        key = (str(root), json.dumps(rule.wire(), sort_keys=True))
        with self._lock:
            if key not in self._trees:
                local = all_local(str(root))
                self._trees.put(key, WatchedTree(str(root), rule.matcher()) if local else None)
            return self._trees.get(key)

    def close(self) -> None:
        with self._lock:
            for watched in self._trees.drain():
                if watched is not None:
                    watched.close()
