"""The remote helper's watched trees (inotify): a refresh lists exactly what a fresh walk
lists, and a quiet tree is answered without a walk. Used by the agent and long-lived
library callers (a watching ``WarmState``); the host side is ``tests/host/test_watched.py``."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from synctree import Pair, write
from treeops import MATCHER, OPS, apply_op, canon, seed

from filesync.core.exclude import ExcludeRule
from filesync.core.reconcile import Direction
from filesync.endpoint.helper import HelperEndpoint
from filesync.sync.engine import Options, run_pass
from filesync.sync.warm import WarmState
from filesync.transport.local import local_conduit
from filesync.tree.walk import walk
from filesync.tree.watch import WatchedTree, local_filesystems_only


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(OPS, min_size=1, max_size=12))
def test_a_refresh_lists_exactly_what_a_walk_lists(ops: list[tuple[str, ...]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "root"
        seed(root)
        tree = WatchedTree.create(str(root), MATCHER)
        assert tree is not None
        try:
            prev = {r[0]: r for r in tree.refresh()[0]}
            for n, op in enumerate(ops):
                apply_op(root, op, n)  # type: ignore[arg-type]
                result = tree.refresh()
                assert canon(result) == canon(walk(str(root), MATCHER)), op
                delta = result[3]
                if delta is not None:  # the delta turns the previous listing into this one
                    changed, removed = delta
                    for rel in removed:
                        del prev[rel]
                    prev.update((r[0], r) for r in changed)
                    assert sorted(map(tuple, prev.values())) == canon(result)[0]
                prev = {r[0]: r for r in result[0]}
        finally:
            tree.close()


def test_a_quiet_tree_is_answered_without_a_walk(tmp_path: Path) -> None:
    seed(tmp_path)
    tree = WatchedTree.create(str(tmp_path), MATCHER)
    assert tree is not None
    first = tree.refresh()
    assert first[3] is None and tree.walks == 1
    for _ in range(3):
        assert tree.refresh()[3] == ([], [])
    write(tmp_path / "a" / "f1.txt", "edited, longer than before\n")
    changed, removed = tree.refresh()[3]  # type: ignore[misc]
    assert [r[0] for r in changed] == ["a/f1.txt"] and removed == []
    (tmp_path / "c" / "f2.txt").unlink()
    assert tree.refresh()[3] == ([], ["c/f2.txt"])
    assert tree.walks == 1  # file-level changes never cost a walk
    shutil.rmtree(tmp_path / "node_modules")  # nor do pruned dirs coming and going
    write(tmp_path / "a" / "node_modules" / "pkg" / "index.js", "junk\n")
    result = tree.refresh()
    assert result[3] == ([], []) and result[2] == canon(walk(str(tmp_path), MATCHER))[2]
    assert tree.walks == 1
    (tmp_path / "c" / "newdir").mkdir()
    assert tree.refresh()[3] is None and tree.walks == 2  # a new directory does
    tree.close()


def test_a_full_walk_is_forced_every_so_often(tmp_path: Path) -> None:
    seed(tmp_path)
    tree = WatchedTree.create(str(tmp_path), MATCHER)
    assert tree is not None
    tree.FULL_EVERY = 0.0  # what a watch cannot see (an mmap write) is bounded by this
    tree.refresh()
    tree.refresh()
    assert tree.walks == 2
    tree.close()


MOUNTINFO = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
30 22 0:40 / /srv/data rw shared:9 - nfs4 server:/export rw
31 22 0:41 / /home/u/my\\040files rw shared:10 - tmpfs tmpfs rw
32 31 0:42 / /home/u/my\\040files/fuse rw shared:11 - fuse.sshfs host: rw
"""


@pytest.mark.parametrize(("root", "ok"), [
    ("/home/u/work", True),  # on the ext4 root
    ("/srv/data/x", False),  # on NFS: changes made by other clients never reach inotify
    ("/srv", False),  # an NFS mount below the root
    ("/home/u/my files/a", True),  # escaped mount point, tmpfs
    ("/home/u/my files", False),  # a FUSE mount below
])
def test_only_local_filesystems_are_watched(root: str, ok: bool) -> None:
    assert local_filesystems_only(root, MOUNTINFO) is ok


async def test_the_helper_answers_watched_listings_with_deltas(tmp_path: Path) -> None:
    seed(tmp_path / "r")
    rule = ExcludeRule.build(root=tmp_path)
    conduit = local_conduit()
    session = await HelperEndpoint.start(conduit, watch=True)
    try:
        root = str(tmp_path / "r")
        full = await session.list_tree(root, rule)
        write(tmp_path / "r" / "a" / "b" / "f0.txt", "changed on the remote side\n")
        (tmp_path / "r" / "c" / "f1.txt").unlink()
        sent_before = conduit.bytes_received
        again = await session.list_tree(root, rule)
        small = conduit.bytes_received - sent_before
        plain = await HelperEndpoint.start(local_conduit())
        try:
            fresh = await plain.list_tree(root, rule)
        finally:
            await plain.close()
        assert again.entries == fresh.entries and again.skipped == fresh.skipped
        assert "c/f1.txt" in full.entries and "c/f1.txt" not in again.entries
        assert small < 400  # two rows' worth: a delta, not the listing
    finally:
        await session.close()


async def test_watched_passes_see_every_change_on_both_sides(tmp_path: Path) -> None:
    pair = Pair(tmp_path / "local", tmp_path / "remote", tmp_path / "state")
    seed(pair.local)
    conduit = local_conduit()
    rule = ExcludeRule.build(root=pair.local)
    warm = WarmState(watch=True)

    async def run(direction: Direction) -> Any:
        opts = Options(direction, rule=rule, state_dir=pair.state)
        return await run_pass(conduit, pair.local, str(pair.remote), opts, warm=warm)

    try:
        assert (await run(Direction.PUSH)).uploaded == 10  # 9 + a/skip.log
        await asyncio.sleep(2.1)  # outside the racy window: stat decides, not hashing
        write(pair.local / "a" / "f0.txt", "host edit\n")
        os.utime(pair.local / "c" / "f0.txt", ns=(10**18, 10**18))  # mtime only
        (pair.local / "a" / "b" / "f2.txt").chmod(0o600)
        report = await run(Direction.PUSH)
        # the content edit and the chmod; an mtime-only change leaves the content alone
        assert sorted(a.path for a in report.plan) == ["a/b/f2.txt", "a/f0.txt"]
        assert (pair.remote / "a" / "b" / "f2.txt").stat().st_mode & 0o777 == 0o600
        write(pair.remote / "c" / "f1.txt", "remote edit\n")
        (pair.remote / "a" / "f1.txt").unlink()
        report = await run(Direction.PULL)
        assert (report.downloaded, report.deleted_local) == (1, 1)
        assert (pair.local / "c" / "f1.txt").read_text() == "remote edit\n"
        assert not (pair.local / "a" / "f1.txt").exists()
        assert (await run(Direction.SYNC)).plan == []
    finally:
        await warm.close()
        await conduit.close()
