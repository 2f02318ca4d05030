"""``keep_going``: a failed pass is kept in ``report.failed`` and the next passes run;
without it the first failure is raised and the passes after it do not run."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from synctree import snapshot, write

from filesync import FilesyncError, Mapping, Session


def _emptied_first(tmp_path: Path) -> tuple[Path, list[Mapping]]:
    box = tmp_path / "box"
    write(tmp_path / "one" / "a.txt", "a\n")
    write(tmp_path / "two" / "b.txt", "b\n")
    mappings = [Mapping(tmp_path / "one", "one"), Mapping(tmp_path / "two", "two")]
    with Session(box, state_dir=tmp_path / "state") as s:
        s.push(mappings)
    shutil.rmtree(box / "one")  # the guard refuses to pull an emptied root
    write(box / "two" / "b.txt", "edited\n")
    return box, mappings


def test_keep_going_pulls_the_others_and_names_the_failed_mapping(tmp_path: Path) -> None:
    box, mappings = _emptied_first(tmp_path)
    with Session(box, state_dir=tmp_path / "state") as s:
        report = s.pull(mappings, keep_going=True)
    assert [m for m, _exc in report.failed] == [mappings[0]]
    assert "empty" in str(report.failed[0][1])
    assert [m for m, _r in report.passes] == [mappings[1]] and report.downloaded == 1
    assert snapshot(tmp_path / "two") == {"b.txt": b"edited\n"}
    assert snapshot(tmp_path / "one") == {"a.txt": b"a\n"}


def test_without_keep_going_the_first_failure_stops_the_call(tmp_path: Path) -> None:
    box, mappings = _emptied_first(tmp_path)
    with Session(box, state_dir=tmp_path / "state") as s, pytest.raises(FilesyncError,
                                                                        match="empty"):
        s.pull(mappings)
    assert snapshot(tmp_path / "two") == {"b.txt": b"b\n"}
