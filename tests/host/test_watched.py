"""The host's watched listing (``filesync.host.watched``) on real trees with the real
watchfiles: a watched listing lists exactly what a fresh walk lists, right after any
edit; a quiet tree is answered without a walk; excluded trees are never watched; every
doubt (a failed watch, a lost cookie, a burst, time) walks in full; a watch loop is woken
by the listing's own watch; the tree keeps one object per file."""

from __future__ import annotations

import ast
import gc
import shutil
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from synctree import until, write
from treeops import OPS, apply_op, seed

from filesync.core.exclude import ExcludeRule
from filesync.core.model import Listing
from filesync.host import watched
from filesync.host.scan import list_local
from filesync.host.watched import WatchedTree, WatchedTrees
from filesync.host.watcher import HostWatcher
from filesync.tree.dirfd import TEMP_PREFIX, is_temp_name

RULE = ExcludeRule.build(["*.log"])


def same(a: Listing, b: Listing) -> None:
    assert a.entries == b.entries
    assert sorted((s.path, s.code) for s in a.skipped) == sorted(
        (s.path, s.code) for s in b.skipped)
    assert a.excluded == b.excluded


def tree_of(trees: WatchedTrees, root: Path) -> WatchedTree:
    tree = trees.get(root, RULE)
    assert tree is not None
    return tree


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(OPS, min_size=1, max_size=12))
def test_a_watched_listing_lists_exactly_what_a_walk_lists(
        ops: list[tuple[str, ...]]) -> None:
    # Each listing is taken right after its edit: the cookie makes it wait for the
    # edit's events, which watchfiles hands over from its own thread.
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "root"
        seed(root)
        trees = WatchedTrees()
        try:
            prev = list_local(root, RULE, trees)
            same(prev, list_local(root, RULE))
            for n, op in enumerate(ops):
                apply_op(root, op, n)  # type: ignore[arg-type]
                now = list_local(root, RULE, trees)
                same(now, list_local(root, RULE))
                # The lineage names every path that changed since the previous listing
                # (there is none where the root itself went).
                since = now.lineage.changed_since(prev.lineage) if now.lineage else None
                if since is not None:
                    moved = {p for p in prev.entries.keys() | now.entries.keys()
                             if prev.entries.get(p) != now.entries.get(p)}
                    assert moved <= since, op
                prev = now
        finally:
            trees.close()


def test_a_quiet_tree_is_answered_without_a_walk(tmp_path: Path) -> None:
    seed(tmp_path)
    trees = WatchedTrees()
    tree = tree_of(trees, tmp_path)
    try:
        first = list_local(tmp_path, RULE, trees)
        assert tree.walks == 1
        for _ in range(3):
            again = list_local(tmp_path, RULE, trees)
            assert again.lineage is not None and first.lineage is not None
            assert again.lineage.changed_since(first.lineage) == set()
        write(tmp_path / "a" / "f1.txt", "edited, longer than before\n")
        (tmp_path / "c" / "f2.txt").unlink()
        (tmp_path / "c" / "scratch.log").write_text("excluded")
        edited = list_local(tmp_path, RULE, trees)
        assert edited.lineage is not None
        assert edited.lineage.changed_since(first.lineage) == {"a/f1.txt", "c/f2.txt"}
        same(edited, list_local(tmp_path, RULE))
        shutil.rmtree(tmp_path / "node_modules")  # pruned dirs coming and going
        write(tmp_path / "a" / "node_modules" / "pkg" / "index.js", "junk\n")
        same(list_local(tmp_path, RULE, trees), list_local(tmp_path, RULE))
        assert tree.walks == 1  # file-level changes never cost a walk
        (tmp_path / "c" / "newdir").mkdir()
        write(tmp_path / "c" / "newdir" / "g.txt", "in a new dir\n")
        same(list_local(tmp_path, RULE, trees), list_local(tmp_path, RULE))
        assert tree.walks == 2  # a new directory does, and is watched from then on
        assert str(tmp_path / "c" / "newdir") in tree.watched
        write(tmp_path / "c" / "newdir" / "g.txt", "edited in the new dir\n")
        same(list_local(tmp_path, RULE, trees), list_local(tmp_path, RULE))
        assert tree.walks == 2
    finally:
        trees.close()


def test_excluded_trees_are_never_watched(tmp_path: Path) -> None:
    for d in ("src/pkg", "node_modules/dep/lib", ".git/objects", "docs"):
        (tmp_path / d).mkdir(parents=True)
    trees = WatchedTrees()
    try:
        list_local(tmp_path, RULE, trees)
        watched_dirs = {Path(d).relative_to(tmp_path).as_posix()
                        for d in tree_of(trees, tmp_path).watched}
        assert watched_dirs == {".", "src", "src/pkg", "docs"}
    finally:
        trees.close()


def test_a_failing_watch_falls_back_to_full_walks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import watchfiles._rust_notify as rust

    class AtTheLimit:
        def __init__(self, *args: object) -> None:
            raise OSError("OS file watch limit reached.")

    seed(tmp_path)
    monkeypatch.setattr(rust, "RustNotify", AtTheLimit)
    trees = WatchedTrees()
    try:
        first = list_local(tmp_path, RULE, trees)
        write(tmp_path / "c" / "late.txt", "after the failure\n")
        second = list_local(tmp_path, RULE, trees)
        assert "c/late.txt" in second.entries and "c/late.txt" not in first.entries
        same(second, list_local(tmp_path, RULE))
        assert "watch limit" in tree_of(trees, tmp_path).why
        assert second.lineage is None  # a plain walk: nothing is carried across it
    finally:
        trees.close()


@pytest.mark.parametrize("doubt", ["cookie", "burst", "time", "error"])
def test_every_doubt_walks_in_full(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   doubt: str) -> None:
    seed(tmp_path)
    trees = WatchedTrees()
    tree = tree_of(trees, tmp_path)
    try:
        list_local(tmp_path, RULE, trees)
        list_local(tmp_path, RULE, trees)
        assert tree.walks == 1
        if doubt == "cookie":  # its cookie cannot be written, so it cannot wait for it
            shutil.rmtree(tree._cookie_dir)
        elif doubt == "burst":  # as many changes as could have overflowed the queue
            monkeypatch.setattr(watched, "BURST", 2)
            for i in range(3):
                write(tmp_path / "c" / f"f{i}.txt", f"burst {i}\n")
        elif doubt == "time":
            monkeypatch.setattr(watched, "FULL_EVERY", 0.0)
        else:  # the watcher reports an error of its own
            assert tree.notify is not None
            real = tree.notify

            class Failing:
                def watch(self, *args: Any) -> Any:
                    raise RuntimeError("error in underlying watcher: lost")

                def close(self) -> None:
                    real.close()

            tree.notify = Failing()
        write(tmp_path / "a" / "f0.txt", "seen by the walk\n")
        same(list_local(tmp_path, RULE, trees), list_local(tmp_path, RULE))
        assert tree.walks == 2
        monkeypatch.undo()
        write(tmp_path / "a" / "f0.txt", "seen by the next watched listing\n")
        same(list_local(tmp_path, RULE, trees), list_local(tmp_path, RULE))
        assert tree.walks == 2  # watched again after the walk
    finally:
        trees.close()


def test_a_watch_loop_is_woken_by_the_listings_own_watch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seed(tmp_path)
    placed: list[list[str]] = []
    real = watched.start_notify

    def counted(paths: list[str]) -> watched.Notify:
        placed.append(paths)
        return real(paths)

    monkeypatch.setattr(watched, "start_notify", counted)
    woken = threading.Event()
    trees = WatchedTrees()
    tree = tree_of(trees, tmp_path)
    host = HostWatcher([(tmp_path, RULE)], woken.set, trees=trees)
    try:
        list_local(tmp_path, RULE, trees)
        host.start()
        assert len(placed) == 1 and not host.polling  # one watch: the listing's
        assert host.dirs == tree.watched
        (tmp_path / "a" / "noise.log").write_text("excluded: wakes nobody")
        write(tmp_path / "a" / "f1.txt", "kept: wakes the loop\n")
        until(woken.is_set, "the loop is woken")
        # The follower took the events; the listing still lists the edit, unwalked.
        listing = list_local(tmp_path, RULE, trees)
        assert listing.entries["a/f1.txt"].size == len("kept: wakes the loop\n")
        same(listing, list_local(tmp_path, RULE))
        assert tree.walks == 1 and len(placed) == 1
        woken.clear()
        (tmp_path / "d").mkdir()  # a new directory: the next listing places a new watch
        until(woken.is_set, "the loop is woken by the new directory")
        list_local(tmp_path, RULE, trees)
        assert len(placed) == 2 and str(tmp_path / "d") in host.dirs
        woken.clear()
        write(tmp_path / "d" / "x.txt", "in the new dir\n")
        until(woken.is_set, "the loop is woken through the new watch")
    finally:
        host.stop()
        trees.close()


def test_changes_the_rule_drops_wake_nobody(tmp_path: Path) -> None:
    seed(tmp_path)
    trees = WatchedTrees()
    tree = tree_of(trees, tmp_path)
    list_local(tmp_path, RULE, trees)
    try:
        modified, added = watched.MODIFIED, watched.ADDED
        (tmp_path / "node_modules2").mkdir()
        (tmp_path / "a" / "node_modules").mkdir()
        with tree._state:
            assert not tree._record(modified, str(tmp_path / "a" / "scratch.log"))
            assert not tree._record(added, str(tmp_path / "a" / "node_modules"))
            assert not tree._record(modified, "/elsewhere/x")
            staged = f"{TEMP_PREFIX}1.{time.time_ns()}.tmp"  # a pass's own staging
            assert is_temp_name(staged)
            assert not tree._record(added, str(tmp_path / "c" / staged))
            assert tree._pending == {"a/"}  # the pruned names still count as excluded
            assert tree._record(modified, str(tmp_path / "a" / "f0.txt"))
            assert tree._pending == {"a/"}
            assert tree._record(added, str(tmp_path / "node_modules2"))
            assert tree._pending is None  # a new kept directory: walk and watch it
    finally:
        trees.close()


def test_the_tree_keeps_one_object_per_file(tmp_path: Path) -> None:
    for d in range(20):
        for f in range(250):
            write(tmp_path / f"d{d}" / f"file-{f}.txt", "x")
    gc.collect()
    tracemalloc.start()
    try:
        trees = WatchedTrees()
        first = list_local(tmp_path, RULE, trees)
        tree = tree_of(trees, tmp_path)
        # The listing's entries are the tree's own objects, kept while unchanged.
        assert all(first.entries[p] is e for p, e in tree.entries.items())
        write(tmp_path / "d0" / "file-0.txt", "changed")
        second = list_local(tmp_path, RULE, trees)
        assert second.entries["d1/file-1.txt"] is first.entries["d1/file-1.txt"]
        del first, second
        gc.collect()
        held_by_tree = tracemalloc.get_traced_memory()[0]
        trees.close()
        del tree, trees
        gc.collect()
        before_plain = tracemalloc.get_traced_memory()[0]
        plain = list_local(tmp_path, RULE)
        held_by_listing = tracemalloc.get_traced_memory()[0] - before_plain
        assert len(plain.entries) == 5000
    finally:
        tracemalloc.stop()
    # What the tree holds beyond one listing's worth is per directory, not per file: a
    # second copy of each file (a row beside its entry) would hold ~40 % more.
    assert held_by_tree < 1.2 * held_by_listing, (held_by_tree, held_by_listing)


def test_the_host_uses_no_ctypes_inotify() -> None:
    # One watcher on the host: watchfiles. The ctypes inotify is the remote helper's.
    host = Path(watched.__file__).parent
    for path in host.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "filesync.tree.watch":
                assert [a.name for a in node.names] == ["local_filesystems_only"], path
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert "inotify_" not in node.value, path  # no libc inotify calls of its own
            if isinstance(node, ast.Attribute):
                assert not node.attr.startswith("inotify"), path
