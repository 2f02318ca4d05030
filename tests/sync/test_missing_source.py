"""A missing source is an error with its fix (exit 1), never an empty tree synced."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from synctree import Pair, write

import filesync.transport.ssh.conduit
from filesync.backends.ssh import SSHTerminal
from filesync.core.exclude import ExcludeRule
from filesync.core.reconcile import Direction
from filesync.errors import FilesyncError, SafetyRefusal
from filesync.mapping import Mapping
from filesync.sync.engine import Options, run_pass
from filesync.transport.local import local_conduit


def one_clean_line(pair: Pair) -> str:
    assert pair.stderr.count("\n") == 1 and pair.stderr.startswith("filesync: error: ")
    assert "Traceback" not in pair.stderr
    return pair.stderr


@pytest.mark.parametrize("command", ["push", "sync"])
def test_push_or_sync_from_a_missing_local_root_fails_with_its_fix(
    tmp_path: Path, command: str
) -> None:
    pair = Pair(tmp_path / "no-such-dir", tmp_path / "remote", tmp_path / "state")
    write(pair.remote / "kept.txt", "remote\n")
    code, _ = pair.run(command)
    assert code == 1
    line = one_clean_line(pair)
    assert f"local root {pair.local} does not exist" in line and "check the path" in line
    assert not pair.local.exists()  # a sync does not create it from the remote either
    assert [p.name for p in pair.remote.iterdir()] == ["kept.txt"]


def test_first_pull_from_a_missing_remote_root_fails_with_its_fix(tmp_path: Path) -> None:
    pair = Pair(tmp_path / "local", tmp_path / "no-such-remote", tmp_path / "state")
    code, _ = pair.run("pull")
    assert code == 1
    line = one_clean_line(pair)
    assert f"remote root {pair.remote} does not exist" in line and "push creates it" in line
    assert not pair.remote.exists()


def test_pull_from_a_remote_root_gone_after_a_sync_is_the_safety_guard(tmp_path: Path) -> None:
    pair = Pair(tmp_path / "local", tmp_path / "remote", tmp_path / "state")
    write(pair.local / "a.txt", "a\n")
    pair.ok("push")
    (pair.remote / "a.txt").unlink()
    pair.remote.rmdir()
    code, _ = pair.run("pull")
    assert code == 3 and "missing or empty" in one_clean_line(pair)
    assert (pair.local / "a.txt").read_text() == "a\n"


def test_push_to_a_missing_remote_root_creates_it(tmp_path: Path) -> None:
    pair = Pair(tmp_path / "local", tmp_path / "new" / "remote", tmp_path / "state")
    write(pair.local / "a.txt", "a\n")
    assert pair.ok("push")["uploaded"] == 1
    assert (pair.remote / "a.txt").read_text() == "a\n"


def test_the_library_gets_the_same_error(tmp_path: Path) -> None:
    async def main() -> None:
        conduit = local_conduit()
        try:
            opts = Options(Direction.PUSH, ExcludeRule.build(), tmp_path / "state")
            with pytest.raises(FilesyncError, match="does not exist") as err:
                await run_pass(conduit, tmp_path / "missing", str(tmp_path / "remote"), opts)
            assert not isinstance(err.value, SafetyRefusal) and err.value.exit_code == 1
        finally:
            await conduit.close()

    asyncio.run(main())


def test_ssh_terminal_refuses_a_mapping_with_a_missing_local_root_before_connecting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("connected despite a missing local root")

    monkeypatch.setattr(filesync.transport.ssh.conduit, "connect", never)
    (tmp_path / "present").mkdir()
    mappings = [Mapping(str(tmp_path / "present"), "/srv/a"),
                Mapping(str(tmp_path / "absent"), "/srv/b")]

    async def main() -> None:
        async with SSHTerminal("remote0", mappings=mappings, state_dir=tmp_path / "state"):
            pass

    with pytest.raises(FilesyncError, match=r"absent of mapping .* does not exist; create it"):
        asyncio.run(main())


def test_a_pull_whose_excludes_match_everything_says_so_not_missing(tmp_path: Path) -> None:
    pair = Pair(tmp_path / "local", tmp_path / "remote", tmp_path / "state")
    write(pair.local / "a.txt", "a\n")
    write(pair.local / "d" / "b.txt", "b\n")
    pair.ok("push")
    code, _ = pair.run("pull", "--exclude", "*")
    line = one_clean_line(pair)
    assert code == 3 and "is excluded" in line and "missing" not in line, line
    assert (pair.local / "a.txt").read_text() == "a\n"


def test_max_file_size_limits_a_pull_and_says_so_on_stderr(tmp_path: Path) -> None:
    pair = Pair(tmp_path / "local", tmp_path / "remote", tmp_path / "state")
    write(pair.remote / "small.txt", "s\n")
    write(pair.remote / "big.bin", "b" * 5000)
    code, report = pair.run("pull", "--max-file-size", "1K")
    assert code == 0
    assert (pair.local / "small.txt").exists() and not (pair.local / "big.bin").exists()
    assert [s["path"] for s in report["skipped"]] == ["big.bin"]
    assert "max-file-size" in report["skipped"][0]["reason"]
    warning = [ln for ln in pair.stderr.splitlines() if ln.startswith("filesync: warning: ")]
    assert len(warning) == 1 and "big.bin left out: 5000 bytes" in warning[0], pair.stderr


def test_max_file_size_never_stops_a_push_nor_what_it_must_keep(tmp_path: Path) -> None:
    pair = Pair(tmp_path / "local", tmp_path / "remote", tmp_path / "state")
    write(pair.local / "big.bin", "host " * 1000)
    write(pair.remote / "big.bin", "remote " * 1000)  # differs, no ancestor: saved, replaced
    code, report = pair.run("push", "--max-file-size", "1K", "--max-pull-bytes", "1K")
    assert code == 0, pair.stderr
    assert (pair.remote / "big.bin").read_text() == "host " * 1000
    assert report["skipped"] == [] and "warning" not in pair.stderr
    saved = [Path(c["saved_to"]) for c in report["conflicts"]]
    assert [p.read_text() for p in saved] == ["remote " * 1000]


@pytest.mark.parametrize("command", ["push", "sync"])
def test_an_empty_tree_pushed_leaves_an_empty_remote_root(tmp_path: Path, command: str) -> None:
    pair = Pair(tmp_path / "local", tmp_path / "remote", tmp_path / "state")
    pair.local.mkdir()
    pair.ok(command)
    assert pair.remote.is_dir() and list(pair.remote.iterdir()) == []
    assert pair.ok("pull")["downloaded"] == 0  # an empty tree, not a missing one
