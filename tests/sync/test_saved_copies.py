"""Saved copies (conflicts/, undo/) keep the file's permission bits: 0600 stays 0600."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest
from synctree import Pair, write

import filesync.host.apply
from filesync.host.apply import HostOp, HostTree


def mode(path: Path | str) -> int:
    return os.stat(path).st_mode & 0o777


@pytest.fixture
def pair(tmp_path: Path) -> Pair:
    p = Pair(tmp_path / "local", tmp_path / "remote", tmp_path / "state")
    write(p.local / "secret.txt", "v1\n", 0o600)
    write(p.local / "plain.txt", "v1\n", 0o644)
    p.ok("push")
    return p


@pytest.mark.parametrize("command", ["pull", "push", "sync"])
def test_a_conflict_copy_keeps_the_remote_files_mode(pair: Pair, command: str) -> None:
    write(pair.local / "secret.txt", "host edit\n")
    write(pair.remote / "secret.txt", "remote edit\n")
    write(pair.local / "plain.txt", "host edit\n")
    write(pair.remote / "plain.txt", "remote edit\n", 0o640)
    report = pair.ok(command)
    saved = {c["path"]: c["saved_to"] for c in report["conflicts"]}
    assert Path(saved["secret.txt"]).read_text() == "remote edit\n"
    assert mode(saved["secret.txt"]) == 0o600
    assert mode(saved["plain.txt"]) == 0o640


def undo_copies(pair: Pair) -> dict[str, int]:
    [pair_dir] = (pair.state / "pairs").iterdir()
    return {p.name: mode(p) for p in (pair_dir / "undo").rglob("files/*")}


def test_undo_copies_keep_the_mode_and_undo_restores_it(pair: Pair) -> None:
    write(pair.remote / "secret.txt", "pulled\n", 0o644)
    (pair.remote / "plain.txt").unlink()
    pair.ok("pull")
    assert mode(pair.local / "secret.txt") == 0o644
    assert undo_copies(pair) == {"secret.txt": 0o600, "plain.txt": 0o644}
    assert pair.run("undo")[0] == 0
    assert (pair.local / "secret.txt").read_text() == "v1\n"
    assert mode(pair.local / "secret.txt") == 0o600


def test_an_undo_copy_made_without_a_hard_link_keeps_the_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the undo dir is on another filesystem, the old file is copied, not linked."""
    root = tmp_path / "root"
    target = write(root / "d" / "secret.txt", "old\n", 0o600)
    staged = write(tmp_path / "staged", "new\n")

    def cross_device(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))

    monkeypatch.setattr(filesync.host.apply.os, "link", cross_device)
    tree = HostTree(root, tmp_path / "undo")
    try:
        st = target.stat()
        op = HostOp("write", "d/secret.txt", [st.st_size, st.st_mtime_ns], str(staged), None,
                    0o644, st.st_mtime_ns)
        assert tree.apply(op).status == "ok"
    finally:
        tree.close()
    kept = tmp_path / "undo" / "files" / "d" / "secret.txt"
    assert kept.read_text() == "old\n" and mode(kept) == 0o600
    assert target.read_text() == "new\n"
