"""A name that turns from a directory into a file (or back) converges in one pass."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from synctree import Pair, snapshot, write


@pytest.fixture
def pair(tmp_path: Path) -> Pair:
    p = Pair(tmp_path / "local", tmp_path / "remote", tmp_path / "state")
    write(p.local / "keep.txt", "keep\n")
    write(p.local / "d" / "a.txt", "a\n")
    write(p.local / "d" / "sub" / "b.txt", "b\n")
    p.ok("push")
    return p


def test_remote_dir_replaced_by_a_file_converges_in_one_pull(pair: Pair) -> None:
    shutil.rmtree(pair.remote / "d")
    write(pair.remote / "d", "now a file\n")
    report = pair.ok("pull")
    assert report["conflicts"] == [] and report["skipped"] == []
    assert (report["downloaded"], report["deleted_local"]) == (1, 2)
    assert (pair.local / "d").read_text() == "now a file\n"
    assert snapshot(pair.local) == snapshot(pair.remote)
    again = pair.ok("pull")
    assert (again["downloaded"], again["deleted_local"], again["conflicts"]) == (0, 0, [])
    assert pair.ok("status")["plan"] == []


def test_remote_file_replaced_by_a_dir_converges_in_one_pull(pair: Pair) -> None:
    write(pair.remote / "f", "a file first\n")
    pair.ok("pull")
    (pair.remote / "f").unlink()
    write(pair.remote / "f" / "inside.txt", "now a dir\n")
    report = pair.ok("pull")
    assert report["conflicts"] == [] and report["skipped"] == []
    assert (report["downloaded"], report["deleted_local"]) == (1, 1)
    assert (pair.local / "f" / "inside.txt").read_text() == "now a dir\n"
    assert snapshot(pair.local) == snapshot(pair.remote)
    assert pair.ok("status")["plan"] == []


def test_a_dir_turned_file_is_undone_in_one_step(pair: Pair) -> None:
    before = snapshot(pair.local)
    shutil.rmtree(pair.remote / "d")
    write(pair.remote / "d", "now a file\n")
    pair.ok("pull")
    assert pair.run("undo")[0] == 0
    assert snapshot(pair.local) == before


def test_a_host_file_still_in_the_dir_keeps_it_a_dir(pair: Pair) -> None:
    """The dir holds a host file the remote never had: nothing of it is lost."""
    write(pair.local / "d" / "host-only.txt", "host only\n")
    shutil.rmtree(pair.remote / "d")
    write(pair.remote / "d", "now a file\n")
    report = pair.ok("pull")
    assert (pair.local / "d" / "host-only.txt").read_text() == "host only\n"
    [conflict] = report["conflicts"]
    assert conflict["path"] == "d" and Path(conflict["saved_to"]).read_text() == "now a file\n"


def test_host_dir_replaced_by_a_file_converges_in_one_push(pair: Pair) -> None:
    shutil.rmtree(pair.local / "d")
    write(pair.local / "d", "now a file\n")
    report = pair.ok("push")
    assert report["conflicts"] == [] and report["skipped"] == []
    assert (report["uploaded"], report["deleted_remote"]) == (1, 2)
    assert snapshot(pair.remote) == snapshot(pair.local)
    assert pair.ok("status")["plan"] == []
