"""The host journal, its recovery and undo, reached directly (no transport, no pass)."""

from __future__ import annotations

from pathlib import Path

import pytest
from synctree import write

from filesync.errors import FilesyncError
from filesync.host.apply import HostOp, HostTree
from filesync.host.journal import Journal, commit_journal, recover, run_journal
from filesync.host.scan import hash_file
from filesync.host.state import Ancestor, PairState
from filesync.host.undo import undo_in

OLD = Ancestor("old-hash", 4, 0o644, 4, 1, 2)


@pytest.fixture
def state(tmp_path: Path) -> PairState:
    st = PairState.open(tmp_path / "state", str(tmp_path / "local"), "test", "/remote")
    yield st
    st.close()


def stage(state: PairState, name: str, data: str) -> tuple[str, str]:
    path = write(state.staging / "run" / name, data)
    return str(path), hash_file(path)


def pull_like(state: PairState, local: Path, edits: dict[str, str | None]) -> Journal:
    """A journal writing (str) or deleting (None) host files, run and committed."""
    journal = Journal("run", undo_dir=str(state.undo_dir / "0001-run"))
    for rel, data in edits.items():
        target = local / rel
        expect = [target.stat().st_size, target.stat().st_mtime_ns] if target.exists() else None
        if data is None:
            journal.ops.append(HostOp("delete", rel, expect))
            journal.forget.append(rel)
        else:
            staged, digest = stage(state, rel.replace("/", "_"), data)
            journal.ops.append(HostOp("write", rel, expect, staged, digest, 0o640, 5))
            journal.ancestors.append([rel, digest, len(data), 0o640, len(data), 5, 6])
        journal.previous.append([rel, *OLD] if rel in state.ancestors() else [rel])
    journal.save(state.journal_path)
    tree = HostTree(local, Path(journal.undo_dir))
    try:
        results = run_journal(tree, journal)
    finally:
        tree.close()
    commit_journal(state, journal, results)
    return journal


def test_commit_records_only_the_ops_that_were_done(state: PairState, tmp_path: Path) -> None:
    local = tmp_path / "local"
    write(local / "kept.txt", "host\n")
    journal = Journal("run")
    staged, digest = stage(state, "1", "new\n")
    journal.ops.append(HostOp("write", "new.txt", None, staged, digest, 0o644, 5))
    journal.ancestors.append(["new.txt", digest, 4, 0o644, 4, 5, 6])
    # The scan saw no kept.txt: a file there now is not overwritten, so not recorded.
    staged2, digest2 = stage(state, "2", "remote\n")
    journal.ops.append(HostOp("write", "kept.txt", None, staged2, digest2, 0o644, 5))
    journal.ancestors.append(["kept.txt", digest2, 7, 0o644, 7, 5, 6])
    journal.save(state.journal_path)
    tree = HostTree(local, None)
    results = run_journal(tree, journal)
    tree.close()
    assert [r.status for r in results] == ["ok", "changed"]
    commit_journal(state, journal, results)
    assert set(state.ancestors()) == {"new.txt"}
    assert not state.journal_path.exists()
    assert (local / "kept.txt").read_text() == "host\n"


def test_recover_replays_an_unfinished_journal_and_empties_staging(
    state: PairState, tmp_path: Path
) -> None:
    local = tmp_path / "local"
    local.mkdir()
    staged, digest = stage(state, "1", "from the journal\n")
    journal = Journal("run", [HostOp("write", "a.txt", None, staged, digest, 0o600, 5)],
                      [["a.txt", digest, 17, 0o600, 17, 5, 6]])
    journal.save(state.journal_path)
    recover(state, local)
    assert (local / "a.txt").read_text() == "from the journal\n"
    assert (local / "a.txt").stat().st_mode & 0o777 == 0o600
    assert state.ancestors()["a.txt"].hash == digest
    assert not state.journal_path.exists() and not state.staging.exists()


def test_undo_restores_replaced_and_deleted_files_and_their_ancestors(
    state: PairState, tmp_path: Path
) -> None:
    local = tmp_path / "local"
    write(local / "d" / "changed.txt", "before\n")
    write(local / "gone.txt", "deleted by the pull\n")
    state.put_ancestors([("d/changed.txt", OLD), ("gone.txt", OLD)])
    pull_like(state, local, {"d/changed.txt": "pulled\n", "gone.txt": None, "born.txt": "new\n"})
    assert (local / "d" / "changed.txt").read_text() == "pulled\n"
    restored = undo_in(state, local)
    assert sorted(restored) == ["born.txt", "d/changed.txt", "gone.txt"]
    assert (local / "d" / "changed.txt").read_text() == "before\n"
    assert (local / "gone.txt").read_text() == "deleted by the pull\n"
    assert not (local / "born.txt").exists()
    assert state.ancestors() == {"d/changed.txt": OLD, "gone.txt": OLD}
    assert not state.staging.exists()  # its scratch copies gone: nothing left to recover
    # Consumed: a second undo has nothing left.
    with pytest.raises(FilesyncError, match="nothing to undo"):
        undo_in(state, local)


def test_undo_leaves_a_file_edited_after_the_pull(state: PairState, tmp_path: Path) -> None:
    local = tmp_path / "local"
    write(local / "a.txt", "before\n")
    state.put_ancestors([("a.txt", OLD)])
    pull_like(state, local, {"a.txt": "pulled\n"})
    write(local / "a.txt", "edited after the pull\n")
    assert undo_in(state, local) == []
    assert (local / "a.txt").read_text() == "edited after the pull\n"
    assert state.ancestors()["a.txt"] != OLD  # the pull's row stays: nothing was undone


def test_undo_never_recreates_a_deleted_file_over_a_new_one(
    state: PairState, tmp_path: Path
) -> None:
    local = tmp_path / "local"
    write(local / "a.txt", "before\n")
    state.put_ancestors([("a.txt", OLD)])
    pull_like(state, local, {"a.txt": None})
    write(local / "a.txt", "made after the pull\n")
    assert undo_in(state, local) == []
    assert (local / "a.txt").read_text() == "made after the pull\n"


def test_only_an_empty_staging_dir_is_dropped(state: PairState) -> None:
    # A crashed run's staged files are the recovery's to clear, never a clean-up's.
    stage(state, "1", "a crashed run's\n")
    state.drop_staging_if_empty()
    assert (state.staging / "run" / "1").exists()
    (state.staging / "run" / "1").unlink()
    (state.staging / "run").rmdir()
    state.drop_staging_if_empty()
    assert not state.staging.exists()
    state.drop_staging_if_empty()  # none at all: nothing to do, no error
