"""The journaled host apply: stage, journal, apply with a re-check, commit.

Local transport (the same helper protocol as SSH, in a ``sh -c`` subprocess), so these run
in well under a second each. The SIGKILL and lost-connection versions of the same
guarantees against the real sshd are in test_reliability_kill.py and
test_reliability_faults.py.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
from synctree import Pair, write
from test_reliability_support import (
    assert_clean_failure,
    check_old_or_new,
    files_under,
    leftovers,
    record,
    state_leftovers,
)

import filesync.core.faults
import filesync.sync.transition
from filesync.core.faults import crash_point
from filesync.errors import FilesyncError
from filesync.host.apply import HostOp, HostTree
from filesync.host.journal import Journal


@pytest.fixture
def pair(tmp_path: Path) -> Pair:
    p = Pair(tmp_path / "local", tmp_path / "remote", tmp_path / "state")
    p.local.mkdir()
    for i in range(6):
        write(p.remote / "d" / f"f{i}.txt", f"v1 {i}\n")
    p.ok("pull")
    return p


def pair_dir(pair: Pair) -> Path:
    [d] = (pair.state / "pairs").iterdir()
    return d


def test_pull_stages_every_file_before_the_journal_and_the_journal_before_the_host(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(6):
        write(pair.remote / "d" / f"f{i}.txt", f"v2 {i}\n" * 100)
    write(pair.remote / "d" / "new.txt", "new\n")
    (pair.remote / "d" / "f5.txt").unlink()
    before = files_under(pair.local)
    seen: list[dict[str, Any]] = []
    real_save = Journal.save

    def save(self: Journal, path: Path) -> None:
        # At the moment the intent is written, every file is staged and the host untouched.
        seen.append({
            "host": files_under(pair.local),
            "staged": {op.path: Path(op.staged).read_bytes() for op in self.ops if op.staged},
            "kinds": sorted(op.kind for op in self.ops),
        })
        real_save(self, path)
        assert json.loads(path.read_text())["ops"]  # durable before the first op

    monkeypatch.setattr(Journal, "save", save)
    report = pair.ok("pull")
    [at_save] = seen
    assert at_save["host"] == before
    assert at_save["kinds"] == ["delete"] + ["write"] * 6
    remote = files_under(pair.remote)
    assert at_save["staged"] == {p: remote[p] for p in at_save["staged"]}
    assert files_under(pair.local) == remote
    assert (report["downloaded"], report["deleted_local"]) == (6, 1)
    assert state_leftovers(pair.state) == []


def test_each_write_is_fsynced_then_renamed_over_the_old_inode(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = pair.local / "d" / "f0.txt"
    reader = target.open("rb")  # a reader of the old version keeps it whole
    write(pair.remote / "d" / "f0.txt", "v2\n" * 5000)
    events: list[tuple[str, str]] = []
    real_fsync, real_rename = os.fsync, os.rename

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def rename(src: Any, dst: Any, **kw: Any) -> None:
        events.append(("rename", str(src)))
        real_rename(src, dst, **kw)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)
    pair.ok("pull")
    monkeypatch.undo()
    [staged] = [path for kind, path in events if kind == "rename"]
    assert ("fsync", staged) in events
    assert events.index(("fsync", staged)) < events.index(("rename", staged))
    assert reader.read() == b"v1 0\n"  # replaced by rename, never rewritten in place
    reader.close()
    assert target.read_bytes() == b"v2\n" * 5000


def test_host_file_edited_between_scan_and_apply_becomes_a_conflict(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(pair.remote / "d" / "f0.txt", "remote v2\n")
    (pair.remote / "d" / "f1.txt").unlink()
    write(pair.remote / "d" / "born.txt", "remote's new file\n")
    write(pair.remote / "d" / "f2.txt", "remote v2 of f2\n")
    real = filesync.sync.transition.run_journal

    def edit_then_apply(tree: HostTree, journal: Journal) -> Any:
        write(pair.local / "d" / "f0.txt", "host edit made during the run\n")
        write(pair.local / "d" / "f1.txt", "host edit of a file the remote deleted\n")
        write(pair.local / "d" / "born.txt", "host created the same name meanwhile\n")
        return real(tree, journal)

    monkeypatch.setattr(filesync.sync.transition, "run_journal", edit_then_apply)
    report = pair.ok("pull")
    monkeypatch.undo()
    host = files_under(pair.local)
    assert host["d/f0.txt"] == b"host edit made during the run\n"
    assert host["d/f1.txt"] == b"host edit of a file the remote deleted\n"
    assert host["d/born.txt"] == b"host created the same name meanwhile\n"
    assert host["d/f2.txt"] == b"remote v2 of f2\n"  # the untouched one still applies
    saved = {c["path"]: Path(c["saved_to"]).read_bytes() for c in report["conflicts"]}
    assert saved == {"d/f0.txt": b"remote v2\n",
                     "d/born.txt": b"remote's new file\n"}  # remote versions kept
    assert [s["path"] for s in report["skipped"]] == ["d/f1.txt"]
    assert "changed on the host during the run" in report["skipped"][0]["reason"]
    # Nothing is lost on the next run either: pull keeps the host's edits.
    pair.ok("pull")
    assert files_under(pair.local)["d/f0.txt"] == b"host edit made during the run\n"
    assert files_under(pair.local)["d/f1.txt"] == b"host edit of a file the remote deleted\n"
    record("host-race", faults=3, survived=3, bytes_lost=0)


@pytest.mark.timeout(60)
def test_a_fifo_swapped_in_between_scan_and_apply_is_never_opened(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The re-check must not block reading a FIFO that replaced the target."""
    write(pair.remote / "d" / "f0.txt", "remote v2\n")
    real = filesync.sync.transition.run_journal

    def swap_then_apply(tree: HostTree, journal: Journal) -> Any:
        (pair.local / "d" / "f0.txt").unlink()
        os.mkfifo(pair.local / "d" / "f0.txt")
        return real(tree, journal)

    monkeypatch.setattr(filesync.sync.transition, "run_journal", swap_then_apply)
    report = pair.ok("pull")
    monkeypatch.undo()
    assert stat.S_ISFIFO((pair.local / "d" / "f0.txt").lstat().st_mode)
    [conflict] = report["conflicts"]
    assert Path(conflict["saved_to"]).read_bytes() == b"remote v2\n"
    record("host-race", faults=1, survived=1, bytes_lost=0)


def test_interrupted_apply_is_finished_or_redone_by_the_next_run(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C in the middle of the ops: exit 130, old-or-new, and the rerun converges."""
    for i in range(6):
        write(pair.remote / "d" / f"f{i}.txt", f"v2 {i}\n")
    old, new = files_under(pair.local), files_under(pair.remote)
    real_apply = HostTree.apply
    calls = []

    def apply(self: HostTree, op: HostOp) -> Any:
        calls.append(op.path)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_apply(self, op)

    monkeypatch.setattr(HostTree, "apply", apply)
    code, _ = pair.run("pull")
    monkeypatch.undo()
    assert code == 130 and "interrupted" in pair.stderr and "Traceback" not in pair.stderr
    check_old_or_new(files_under(pair.local), old, new, "interrupted apply")
    assert (pair_dir(pair) / "journal.json").exists()  # the intent survived the interrupt
    pair.ok("pull")
    assert files_under(pair.local) == new
    assert state_leftovers(pair.state) == [] and leftovers(pair.local, pair.remote) == []
    record("interrupt", faults=1, survived=1, bytes_lost=0)


def test_unfinished_journal_is_completed_before_anything_else(pair: Pair, tmp_path: Path) -> None:
    """A journal left by a crash after its first op (built here by hand) is replayed first."""
    directory = pair_dir(pair)
    staging = directory / "staging" / "crashed-run"
    staging.mkdir(parents=True)
    journal = Journal("crashed-run", forget=["d/f2.txt"])
    for i in (0, 1):
        data = f"journal v2 {i}\n".encode()
        write(pair.remote / "d" / f"f{i}.txt", data)  # the remote side already has it
        (staging / str(i)).write_bytes(data)
        digest = filesync.host.scan.hash_file(staging / str(i))
        st, rst = (pair.local / "d" / f"f{i}.txt").stat(), (pair.remote / "d" / f"f{i}.txt").stat()
        journal.ops.append(HostOp("write", f"d/f{i}.txt", [st.st_size, st.st_mtime_ns],
                                  str(staging / str(i)), digest, 0o644, rst.st_mtime_ns))
        journal.ancestors.append([f"d/f{i}.txt", digest, len(data), 0o644, len(data),
                                  rst.st_mtime_ns, rst.st_mtime_ns + 1])
    (pair.remote / "d" / "f2.txt").unlink()
    st = (pair.local / "d" / "f2.txt").stat()
    journal.ops.append(HostOp("delete", "d/f2.txt", [st.st_size, st.st_mtime_ns]))
    journal.save(directory / "journal.json")
    tree = HostTree(pair.local, None)  # the crashed run had done its first op
    assert tree.apply(journal.ops[0]).status == "ok"
    tree.close()
    report = pair.ok("pull")
    # Replayed before the scan: the pass itself found nothing left to download or delete.
    assert (report["downloaded"], report["deleted_local"], report["conflicts"]) == (0, 0, [])
    assert files_under(pair.local) == files_under(pair.remote)
    assert not (directory / "journal.json").exists() and not staging.exists()
    record("journal-replay", faults=1, survived=1, bytes_lost=0)


def test_journal_save_writes_every_byte_despite_short_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, bytes(data[:7])))
    journal = Journal("r", [HostOp("write", f"p{i}", None, f"/s/{i}", "h") for i in range(50)])
    journal.save(tmp_path / "journal.json")
    monkeypatch.undo()
    assert Journal.load(tmp_path / "journal.json") == journal


def test_journal_save_on_a_full_disk_fails_cleanly_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(FilesyncError) as err:
        Journal("r", [HostOp("delete", "p", None)]).save(tmp_path / "journal.json")
    monkeypatch.undo()
    assert "No space left on device" in str(err.value) and "\n" not in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_a_corrupt_journal_is_one_clean_line(pair: Pair) -> None:
    (pair_dir(pair) / "journal.json").write_text('{"run_id": "x", "ops": [{"kind"')
    code, _ = pair.run("pull")
    assert_clean_failure(code, pair.stderr)
    assert "journal" in pair.stderr and "move it away" in pair.stderr


def test_crash_hook_is_inert_without_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(filesync.core.faults.CRASH_ENV, raising=False)
    for _ in range(3):
        crash_point("before-op")  # would SIGKILL pytest if it were not inert
    monkeypatch.setenv(filesync.core.faults.CRASH_ENV, "placed:1")
    crash_point("before-op")  # another step: still alive


@pytest.mark.timeout(60)
def test_a_full_state_disk_before_anything_started_is_one_clean_line(tmp_path: Path) -> None:
    """Even the lock file's pid write and SQLite failing with ENOSPC end in one line."""
    full = tmp_path / "state"
    full.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(full)], check=True)
    try:
        with open(full / "filler", "wb") as f, contextlib.suppress(OSError):
            f.write(b"\0" * (1 << 20))
        pair = Pair(tmp_path / "local", tmp_path / "remote", full)
        write(pair.remote / "a.txt", "a\n")
        code, report = pair.run("pull")
        assert_clean_failure(code, pair.stderr)
        assert "No space left on device" in pair.stderr
        assert report["exit_code"] == 1
        assert files_under(pair.local) == {}
        (full / "filler").unlink()
        subprocess.run(["mount", "-o", "remount,size=16m", str(full)], check=True)
        pair.ok("pull")  # nothing stayed locked or half-created
        assert files_under(pair.local) == {"a.txt": b"a\n"}
    finally:
        subprocess.run(["umount", "-l", str(full)], check=False)
    record("disk-full", faults=1, survived=1, bytes_lost=0)
