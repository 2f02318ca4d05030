"""Self-sync is refused by the CLI's push, pull and sync too: one line, exit 3, nothing changed."""

from __future__ import annotations

from pathlib import Path

import pytest
from synctree import Pair, snapshot, write


@pytest.mark.parametrize("command", ["push", "pull", "sync"])
@pytest.mark.parametrize("where", ["same", "inside", "contains"])
def test_the_same_tree_reached_twice_is_refused(tmp_path: Path, command: str,
                                                where: str) -> None:
    local = tmp_path / "tree" / "local"
    write(local / "a.txt", "a\n")
    write(local / "sub" / "b.txt", "b\n")
    remote = {"same": local, "inside": local / "sub", "contains": tmp_path / "tree"}[where]
    before = snapshot(tmp_path / "tree")
    pair = Pair(local, remote, tmp_path / "state")
    code, _ = pair.run(command)
    assert code == 3, (code, pair.stderr)
    assert pair.stderr.count("\n") == 1 and "the same tree reached twice" in pair.stderr
    assert snapshot(tmp_path / "tree") == before  # no file, no check file left behind

