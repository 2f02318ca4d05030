"""``sync.memo``: a watched pass reuses the last pass's per-path results only for equal
inputs, and the watched listings check only the names that came in for path safety.

Real trees, the real helper over the local transport, real SQLite; passes run with
one watching ``WarmState`` on one conduit, as the agent and the terminal backends run them.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from synctree import snapshot, write
from watchedpair import RULE, watched_pair
from watchedpair import WatchedPair as Session

import filesync.sync.plan as planning
from filesync.core.reconcile import Direction
from filesync.sync.memo import PassMemo
from filesync.sync.warm import WarmState
from filesync.transport.local import local_conduit


def test_a_result_is_handed_out_only_for_equal_inputs() -> None:
    memo = PassMemo()
    anc, listing = {"a": (1, 2)}, {"a": ("a", 3), "b": ("b", 4)}
    memo.same.put(frozenset({"a"}), anc, listing)
    assert memo.same.get(dict(anc), dict(listing)) == frozenset({"a"})
    # the inputs were copied: changing the caller's dicts afterwards changes nothing kept
    listing["c"] = ("c", 5)
    assert memo.same.get(anc, listing) is None
    del listing["c"]
    for changed in ({"a": (1, 9)}, {"a": (1, 2), "z": (0, 0)}, {}):
        assert memo.same.get(changed, listing) is None, changed
    assert memo.same.get(anc) is None  # not the same inputs at all
    assert memo.quiet.get(anc, listing) is None  # each result is kept in its own field
    assert memo.same.get(anc, listing) == frozenset({"a"})
    memo.quiet.put(frozenset({"x"}), {"p", "q"})
    assert memo.quiet.get(frozenset({"p", "q"})) == frozenset({"x"})
    assert memo.quiet.get({"p"}) is None
    assert memo.same.get(anc, listing) == frozenset({"a"})


def test_only_a_watching_owner_keeps_a_memo_and_owners_never_share_one() -> None:
    assert WarmState().memo("/l", "/r") is None
    warm = WarmState(watch=True)
    first = warm.memo("/l", "/r")
    assert first is not None and warm.memo("/l", "/r") is first
    assert warm.memo("/l", "/other") is not first
    assert WarmState(watch=True).memo("/l", "/r") is not first


@pytest.fixture
def session(tmp_path: Path) -> Iterator[Session]:
    with watched_pair(tmp_path) as opened:
        yield opened


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How often the per-path passes the memo stands in for really ran."""
    calls = {"unchanged_remote": 0, "quiet_paths": 0, "scan_cached": 0}
    for name in calls:
        real: Callable[..., Any] = getattr(planning, name)

        def wrapped(*args: Any, _real: Callable[..., Any] = real, _name: str = name) -> Any:
            calls[_name] += 1
            return _real(*args)

        monkeypatch.setattr(planning, name, wrapped)
    return calls


def _old(path: Path) -> None:
    """Give ``path`` an mtime well outside the racy-timestamp window."""
    past = time.time() - 3600
    os.utime(path, (past, past))


def test_a_quiet_watched_pass_reuses_and_any_change_is_still_seen(
    session: Session, counted: dict[str, int]
) -> None:
    for i in range(20):
        write(session.local / f"d{i % 3}" / f"f{i}.txt", f"file {i}\n")
        _old(session.local / f"d{i % 3}" / f"f{i}.txt")
    assert session.run(Direction.SYNC).uploaded == 20
    session.run(Direction.SYNC)  # the first pass that lists both sides as in sync
    before = dict(counted)
    quiet = session.run(Direction.SYNC)
    assert (quiet.uploaded, quiet.downloaded, quiet.plan) == (0, 0, [])
    assert counted == before  # nothing was computed again

    # A host edit, a remote edit, a remote deletion: each is seen by the next pass.
    write(session.local / "d0" / "f0.txt", "edited on the host\n")
    _old(session.local / "d0" / "f0.txt")
    write(session.remote / "d1" / "f1.txt", "edited on the remote\n")
    _old(session.remote / "d1" / "f1.txt")
    (session.remote / "d2" / "f2.txt").unlink()
    report = session.run(Direction.SYNC)
    assert (report.uploaded, report.downloaded, report.deleted_local) == (1, 1, 1)
    assert snapshot(session.local) == snapshot(session.remote)
    assert counted["quiet_paths"] > before["quiet_paths"]


def test_a_state_written_by_another_process_is_never_answered_from_the_memo(
    session: Session, tmp_path: Path
) -> None:
    import subprocess
    import sys

    for name in ("a.txt", "keep.txt"):
        write(session.local / name, f"{name}\n")
        _old(session.local / name)
    session.run(Direction.PUSH)
    session.run(Direction.PUSH)
    # A one-shot run in another process changes the remote and records it.
    write(session.local / "a.txt", "changed by the other run\n")
    _old(session.local / "a.txt")
    done = subprocess.run(
        [sys.executable, "-m", "filesync", "push", str(session.local), str(session.remote),
         "--state-dir", str(session.state), "--no-default-excludes", "-q"],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    (session.remote / "a.txt").unlink()  # and then the remote loses the file
    report = session.run(Direction.SYNC)
    assert report.deleted_local == 1 and not (session.local / "a.txt").exists()


def test_an_unsafe_name_that_appears_between_watched_passes_is_skipped(
    session: Session,
) -> None:
    write(session.local / "ok.txt", "ok\n")
    write(session.remote / "ok-remote.txt", "ok\n")
    session.run(Direction.SYNC)
    session.run(Direction.SYNC)
    write(session.local / "bad\x01host.txt", "host\n")
    write(session.remote / "bad\x01remote.txt", "remote\n")
    report = session.run(Direction.SYNC)
    skipped = {s.path: s.code and s.code.value for s in report.skipped}
    assert skipped.get("bad\x01host.txt") == "unsafe-path", report.skipped
    assert skipped.get("bad\x01remote.txt") == "unsafe-path", report.skipped
    assert not (session.remote / "bad\x01host.txt").exists()
    assert not (session.local / "bad\x01remote.txt").exists()
    # Once gone again, the next passes are clean.
    (session.local / "bad\x01host.txt").unlink()
    (session.remote / "bad\x01remote.txt").unlink()
    assert session.run(Direction.SYNC).skipped == []


def test_watched_listings_filter_the_unsafe_names_that_came_in(tmp_path: Path) -> None:
    # Each side's watched listing checks only the names a refresh brought in; a name
    # that fails the path-safety rule is still never an entry, on either side.
    from filesync.endpoint.connect import Endpoints
    from filesync.host.scan import list_local
    from filesync.host.watched import WatchedTrees

    root = tmp_path / "tree"
    write(root / "ok.txt", "ok\n")

    def check(listing: Any) -> None:
        assert sorted(listing.entries) == ["ok.txt"]
        assert [(s.path, s.code and s.code.value) for s in listing.skipped] == [
            ("bad\x01name.txt", "unsafe-path")]

    trees = WatchedTrees()
    assert sorted(list_local(root, RULE, trees).entries) == ["ok.txt"]

    async def remote_side() -> None:
        conduit = local_conduit()
        endpoints = Endpoints()
        try:
            endpoint = await endpoints.endpoint_for(conduit, watch=True)
            endpoint.watch = True
            first = await endpoint.list_tree(str(root), RULE)
            assert sorted(first.entries) == ["ok.txt"]
            write(root / "bad\x01name.txt", "bad\n")
            check(await endpoint.list_tree(str(root), RULE))  # a delta listing
        finally:
            await endpoints.close()
            await conduit.close()

    asyncio.run(remote_side())
    check(list_local(root, RULE, trees))  # a watched refresh
    trees.close()
