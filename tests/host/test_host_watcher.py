"""``HostWatcher`` on a real tree with the real watchfiles: excluded trees are never
watched, a new directory is watched once it exists, changes the rule keeps are reported,
and a native watcher that fails falls back to polling, said once (at the start, or when
the watch is placed anew later)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from synctree import until

from filesync.core.exclude import ExcludeRule
from filesync.host.scan import list_local
from filesync.host.watched import WatchedTrees
from filesync.host.watcher import HostWatcher


class Counter:
    def __init__(self) -> None:
        self.n = 0
        self.lock = threading.Lock()

    def __call__(self) -> None:
        with self.lock:
            self.n += 1


def _tree(root: Path) -> None:
    for d in ("src/pkg", "node_modules/dep/lib", ".git/objects", "docs"):
        (root / d).mkdir(parents=True)
    (root / "src" / "a.py").write_text("a")


def test_excluded_trees_are_never_watched_and_new_dirs_are(tmp_path: Path) -> None:
    _tree(tmp_path)
    changes = Counter()
    rule = ExcludeRule.build(["*.tmp"])
    w = HostWatcher([(tmp_path, rule)], changes)
    w.start()
    try:
        watched = {Path(d).relative_to(tmp_path).as_posix() for d in w.dirs}
        assert watched == {".", "src", "src/pkg", "docs"}
        (tmp_path / "src" / "a.py").write_text("a2")
        until(lambda: changes.n >= 1, "a kept change is reported")
        before = changes.n
        (tmp_path / "new" / "deep").mkdir(parents=True)
        until(lambda: changes.n > before, "a new directory is reported")
        list_local(tmp_path, rule, w.trees)  # the pass it asks for watches it
        assert str(tmp_path / "new" / "deep") in w.dirs
        before = changes.n
        (tmp_path / "new" / "deep" / "f.md").write_text("f")
        until(lambda: changes.n > before, "a change in the new dir is reported")
    finally:
        w.stop()


class AtTheLimit:
    """watchfiles' native watcher at the inotify watch limit."""

    def __init__(self, *args: object) -> None:
        raise OSError("OS file watch limit reached.")


@pytest.mark.parametrize("when", ["at the start", "placed anew later"])
def test_a_failing_native_watcher_falls_back_to_polling_said_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    import watchfiles._rust_notify as rust

    _tree(tmp_path)
    rule = ExcludeRule.build([])
    monkeypatch.setattr("filesync.host.watcher.POLL", 0.05)
    if when == "at the start":
        monkeypatch.setattr(rust, "RustNotify", AtTheLimit)
    said: list[str] = []
    changes = Counter()
    w = HostWatcher([(tmp_path, rule)], changes, said.append)
    w.start()
    try:
        if when == "placed anew later":
            assert not w.polling
            monkeypatch.setattr(rust, "RustNotify", AtTheLimit)
            (tmp_path / "docs" / "more").mkdir()
            until(lambda: changes.n >= 1, "the new directory is reported")
            listing = list_local(tmp_path, rule, w.trees)  # its watch cannot be placed
            assert "src/a.py" in listing.entries  # walked instead
        until(lambda: w.polling, "the watcher polls")
        before = changes.n
        until(lambda: changes.n >= before + 3, "polls ask for passes")
    finally:
        w.stop()
    assert len(said) == 1 and "watch limit" in said[0] and "polling" in said[0]


def test_a_tree_pushed_out_of_the_owners_watches_is_polled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.setattr("filesync.host.watcher.POLL", 0.05)
    trees = WatchedTrees(max_trees=1)
    said: list[str] = []
    changes = Counter()
    w = HostWatcher([(tmp_path / "a", ExcludeRule.build([]))], changes, said.append,
                    trees=trees)
    w.start()
    try:
        assert not w.polling
        list_local(tmp_path / "b", ExcludeRule.build([]), trees)  # a second tree
        until(lambda: w.polling, "the watcher polls the tree it lost")
        before = changes.n
        until(lambda: changes.n >= before + 3, "polls ask for passes")
    finally:
        w.stop()
        trees.close()
    assert len(said) == 1 and "too many trees" in said[0]
