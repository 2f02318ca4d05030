"""The one tree walk, for the host tree and the remote listing alike.

Guarantees: excluded directories are pruned before they are opened (their bytes are
never read); nothing is followed through a symlink; symlinks and special files are
reported as skipped, never listed; stale temp files of dead filesync processes are
removed on the way.
"""

from __future__ import annotations

import os
import stat

from filesync.tree.dirfd import DIR_FLAGS, ROOT_FLAGS, TEMP_PREFIX, is_temp_name, stale_temp
from filesync.tree.wire import Reason

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from filesync.tree.ignore import Matcher


def walk(root: str, matcher: Matcher) -> tuple[list[list[Any]], list[list[str]], int]:
    """List regular files under ``root``, pruning excluded dirs before descending.

    Returns ``(entries, skipped, excluded)``: entries are
    ``[rel, "f", size, mtime_ns, mode, ino, nlink]``; skipped are ``[rel, code, detail]``
    (a ``filesync.tree.wire.Reason`` value, the OS error's text or '') for symlinks,
    special files and unreadable directories; ``excluded`` counts pruned paths. Stale temp
    files of dead filesync processes are removed on the way.
    """
    entries: list[list[Any]] = []
    skipped: list[list[str]] = []
    excluded = 0
    stack = [(root, "")]
    while stack:
        path, prefix = stack.pop()
        dfd = open_listed(path, prefix, skipped)
        if dfd < 0:
            continue
        try:
            excluded += list_dir(dfd, path, prefix, matcher, entries, skipped, stack)
        finally:
            os.close(dfd)
    return entries, skipped, excluded


def open_listed(path: str, prefix: str, skipped: list[list[str]]) -> int:
    """A descriptor of the directory to list, or -1 with the reason in ``skipped``."""
    try:
        # The root itself may be a symlink to a directory (as ``scandir`` allows);
        # below it nothing is followed.
        return os.open(path, DIR_FLAGS if prefix else ROOT_FLAGS)
    except OSError as exc:
        skipped.append([prefix.rstrip("/") or ".", Reason.UNREADABLE.value, exc.strerror or ""])
        return -1


def list_dir(dfd: int, path: str, prefix: str, matcher: Matcher, entries: list[list[Any]],
              skipped: list[list[str]], subdirs: list[tuple[str, str]]) -> int:
    """List one open directory into ``entries``/``skipped``; queue its kept subdirectories
    as ``(path, prefix)`` on ``subdirs``; return how many names it pruned.

    The one listing rule, for the plain walk and for ``WatchedTree``'s re-listings.
    """
    excluded = 0
    matches = matcher.matches
    # Without patterns a file is never excluded by name: skip the call per file.
    match_files = bool(matcher.patterns)
    add = entries.append
    s_isdir, s_isreg, s_islnk = stat.S_ISDIR, stat.S_ISREG, stat.S_ISLNK
    lstat = os.stat
    base = path if path.endswith("/") else path + "/"
    try:
        it = os.scandir(dfd)
    except OSError as exc:
        skipped.append([prefix.rstrip("/") or ".", Reason.UNREADABLE.value, exc.strerror or ""])
        return 0
    with it:
        for entry in it:
            name = entry.name
            rel = prefix + name
            try:
                # Relative to the directory's descriptor, not by full path: one path
                # lookup per directory instead of one per component per file (~10 % of
                # the walk), and never through a symlink swapped in above.
                st = lstat(name, dir_fd=dfd, follow_symlinks=False)
            except OSError:
                continue
            mode = st.st_mode
            if s_isdir(mode):
                if matches(rel, True):
                    excluded += 1
                else:
                    subdirs.append((base + name, rel + "/"))
            elif match_files and matches(rel, False):
                excluded += 1
            elif s_isreg(mode):
                if name.startswith(TEMP_PREFIX) and is_temp_name(name):
                    if stale_temp(name):
                        try:
                            os.unlink(name, dir_fd=dfd)
                        except OSError:  # gone already, or not ours to remove
                            pass
                    continue
                add([rel, "f", st.st_size, st.st_mtime_ns, mode & 0o7777, st.st_ino,
                     st.st_nlink])
            elif s_islnk(mode):
                skipped.append([rel, Reason.SYMLINK.value, ""])
            else:
                skipped.append([rel, Reason.SPECIAL_FILE.value, ""])
    return excluded
