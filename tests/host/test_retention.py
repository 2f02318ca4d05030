"""Retention of conflicts/ and undo/: bounded by runs and bytes, newest and open kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from synctree import write

from filesync.host import retention
from filesync.host.retention import KEEP_BYTES, KEEP_RUNS, SIZES, prune_runs, run_of


def runs(directory: Path, sizes: list[int]) -> list[str]:
    names = [f"{1000 + i:020d}-1" for i in range(len(sizes))]
    for name, size in zip(names, sizes, strict=True):
        write(directory / name / "files" / "d" / "f.bin", b"x" * size)
    return names


def left(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name != SIZES)


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


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    walked: list[str] = []
    real = retention._size

    def size(path: Path) -> int:
        walked.append(path.name)
        return real(path)

    monkeypatch.setattr(retention, "_size", size)
    return walked


def test_a_run_is_measured_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    walked = _counting(monkeypatch)
    names = runs(tmp_path, [10, 20, 30])
    prune_runs(tmp_path, keep_runs=20, keep_bytes=1 << 20)
    assert sorted(walked) == names
    walked.clear()
    newer = f"{2000:020d}-1"
    write(tmp_path / newer / "files" / "f.bin", b"x" * 40)
    prune_runs(tmp_path, keep_runs=20, keep_bytes=1 << 20)
    assert walked == [newer]  # the older runs' sizes came from .sizes
    assert json.loads((tmp_path / SIZES).read_text()) == {
        names[0]: 10, names[1]: 20, names[2]: 30, newer: 40}


def test_the_kept_sizes_decide_as_a_fresh_measurement_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = runs(tmp_path, [10, 10, 100, 10])
    assert prune_runs(tmp_path, keep_runs=20, keep_bytes=1 << 20) == []
    walked = _counting(monkeypatch)
    newer = f"{2000:020d}-1"
    write(tmp_path / newer / "files" / "f.bin", b"x" * 10)
    dropped = prune_runs(tmp_path, keep_runs=20, keep_bytes=50)
    assert walked == [newer]
    assert [(p.path.name, p.bytes) for p in dropped] == [
        (names[0], 10), (names[1], 10), (names[2], 100)]
    assert left(tmp_path) == [names[3], newer]
    # what was dropped leaves the sizes too
    assert json.loads((tmp_path / SIZES).read_text()) == {names[3]: 10, newer: 10}


@pytest.mark.parametrize("content", ["not json", "[1, 2]", '{"x": "big"}', ""])
def test_an_unreadable_sizes_file_is_measured_afresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: str
) -> None:
    names = runs(tmp_path, [10, 20])
    (tmp_path / SIZES).write_text(content)
    walked = _counting(monkeypatch)
    prune_runs(tmp_path, keep_runs=20, keep_bytes=1 << 20)
    assert sorted(walked) == names
    assert json.loads((tmp_path / SIZES).read_text()) == {names[0]: 10, names[1]: 20}
