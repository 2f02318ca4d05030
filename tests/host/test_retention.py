"""Retention of conflicts/ and undo/: bounded by runs and bytes, newest and open kept."""

from __future__ import annotations

from pathlib import Path

from synctree import write

from filesync.host.retention import KEEP_BYTES, KEEP_RUNS, prune_runs, run_of


def runs(directory: Path, sizes: list[int]) -> list[str]:
    names = [f"{1000 + i:020d}-1" for i in range(len(sizes))]
    for name, size in zip(names, sizes, strict=True):
        write(directory / name / "files" / "d" / "f.bin", b"x" * size)
    return names


def left(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_defaults_are_twenty_runs_and_one_gib() -> None:
    assert (KEEP_RUNS, KEEP_BYTES) == (20, 1 << 30)


def test_only_the_last_runs_are_kept(tmp_path: Path) -> None:
    names = runs(tmp_path, [1] * 6)
    dropped = prune_runs(tmp_path, keep_runs=4, keep_bytes=1 << 20)
    assert [p.path.name for p in dropped] == names[:2]
    assert left(tmp_path) == names[2:]


def test_the_byte_bound_drops_the_oldest_and_keeps_the_history_contiguous(
    tmp_path: Path
) -> None:
    names = runs(tmp_path, [10, 10, 100, 10, 10])
    dropped = prune_runs(tmp_path, keep_runs=20, keep_bytes=50)
    # 10 + 10 fit, the 100-byte run does not: it and everything older go.
    assert left(tmp_path) == names[3:]
    assert [(p.path.name, p.bytes) for p in dropped] == [
        (names[0], 10), (names[1], 10), (names[2], 100)]


def test_the_newest_run_is_kept_even_alone_over_the_byte_bound(tmp_path: Path) -> None:
    names = runs(tmp_path, [10, 500])
    prune_runs(tmp_path, keep_runs=20, keep_bytes=100)
    assert left(tmp_path) == names[1:]


def test_a_protected_run_is_never_dropped(tmp_path: Path) -> None:
    names = runs(tmp_path, [10, 10, 10, 10])
    prune_runs(tmp_path, keep_runs=1, keep_bytes=1 << 20, protected={names[0]})
    assert left(tmp_path) == [names[0], names[3]]


def test_within_bounds_nothing_is_dropped(tmp_path: Path) -> None:
    names = runs(tmp_path, [10, 10])
    assert prune_runs(tmp_path, keep_runs=2, keep_bytes=20) == []
    assert left(tmp_path) == names
    assert prune_runs(tmp_path / "missing") == []


def test_run_of_names_the_run_dir_of_a_saved_copy(tmp_path: Path) -> None:
    assert run_of(str(tmp_path / "run-1" / "a" / "b.txt"), tmp_path) == "run-1"
    assert run_of(str(tmp_path.parent / "elsewhere"), tmp_path) is None
    assert run_of(None, tmp_path) is None
