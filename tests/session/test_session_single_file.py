"""Single-file mappings: push, pull, sync and status both ways, nothing else of either parent
directory touched, state kept apart from a directory mapping of the same parent."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from synctree import snapshot, write

from filesync import BadMapping, Mapping, SafetyRefusal, Session
from filesync.core.reconcile import Kind
from filesync.host.state import PairState


@pytest.fixture
def sides(tmp_path: Path) -> tuple[Path, Path]:
    """A local parent and a remote parent, each with files the file mapping must not touch."""
    local, remote = tmp_path / "home" / "cfg", tmp_path / "box" / "cfg"
    write(local / "token.json", "local-token\n", 0o600)
    write(local / "sibling.txt", "local sibling\n")
    write(local / "sub" / "deep.txt", "local deep\n")
    write(remote / "remote-only.txt", "remote sibling\n")
    write(remote / "sub" / "other.txt", "remote deep\n")
    return local, remote


def _others(root: Path) -> dict[str, bytes]:
    return {k: v for k, v in snapshot(root).items() if k != "token.json"}


def test_push_then_pull_touch_only_the_file(sides: tuple[Path, Path], state: Path) -> None:
    local, remote = sides
    before_local, before_remote = _others(local), _others(remote)
    m = Mapping(local / "token.json", "cfg/token.json")
    with Session(remote.parent, state_dir=state) as s:
        assert s.push(m).uploaded == 1
        assert (remote / "token.json").read_text() == "local-token\n"
        assert stat.S_IMODE((remote / "token.json").stat().st_mode) == 0o600
        write(remote / "token.json", "remote edit\n", 0o600)
        assert s.pull(m).downloaded == 1
        assert (local / "token.json").read_text() == "remote edit\n"
        # The one file gone from a side looks like a reset side: the engine's root guard
        # refuses, as for an emptied directory...
        (remote / "token.json").unlink()
        write(local / "keep", "x")
        with pytest.raises(SafetyRefusal):
            s.pull(m)
        assert (local / "token.json").exists()
    # ...and force lets the deletion through, still only of that file.
    with Session(remote.parent, state_dir=state, force=True) as s:
        assert s.pull(m).deleted_local == 1
    assert not (local / "token.json").exists()
    assert _others(local) == {**before_local, "keep": b"x"}
    assert _others(remote) == before_remote


def test_sync_and_status_both_directions(sides: tuple[Path, Path], state: Path) -> None:
    local, remote = sides
    before_local, before_remote = _others(local), _others(remote)
    m = Mapping(local / "token.json", "cfg/token.json")
    with Session(remote.parent, state_dir=state) as s:
        plan = s.status(m).plan
        assert [(a.path, a.kind) for a in plan] == [("token.json", Kind.UPLOAD)]
        assert not (remote / "token.json").exists()  # status changed nothing
        assert s.sync(m).uploaded == 1
        write(remote / "token.json", "changed remotely\n")
        assert [(a.path, a.kind) for a in s.status(m).plan] == [("token.json", Kind.DOWNLOAD)]
        assert s.sync(m).downloaded == 1
        assert (local / "token.json").read_text() == "changed remotely\n"
        write(local / "token.json", "changed locally\n")
        assert s.sync(m).uploaded == 1
        assert (remote / "token.json").read_text() == "changed locally\n"
        assert s.status(m).plan == []
    assert _others(local) == before_local
    assert _others(remote) == before_remote


def test_a_missing_local_file_is_fetched_when_the_remote_has_it(
    sides: tuple[Path, Path], state: Path
) -> None:
    local, remote = sides
    write(remote / "settings.toml", "x = 1\n")
    with Session(remote.parent, state_dir=state) as s:
        report = s.pull(Mapping(local / "settings.toml", "cfg/settings.toml"))
    assert report.downloaded == 1
    assert (local / "settings.toml").read_text() == "x = 1\n"
    assert not (local / "remote-only.txt").exists()


def test_a_file_goes_under_another_remote_name_and_comes_back_under_its_own(
    sides: tuple[Path, Path], state: Path
) -> None:
    local, remote = sides
    write(remote / "token.json", "a remote file of the host's name\n")
    before_local, before_remote = _others(local), snapshot(remote)
    m = Mapping(local / "token.json", "cfg/gh_token.json")
    with Session(remote.parent, state_dir=state) as s:
        report = s.push(m)
        assert report.uploaded == 1 and [c.path for c in report.changes] == ["token.json"]
        assert (remote / "gh_token.json").read_text() == "local-token\n"
        assert stat.S_IMODE((remote / "gh_token.json").stat().st_mode) == 0o600
        assert s.status(m).plan == []
        write(remote / "gh_token.json", "rotated remotely\n", 0o600)
        assert s.pull(m).downloaded == 1
        assert (local / "token.json").read_text() == "rotated remotely\n"
        assert s.sync(m).plan == []
    # The remote file of the host's name and every other file stayed as they were.
    assert {k: v for k, v in snapshot(remote).items() if k != "gh_token.json"} == before_remote
    assert _others(local) == before_local
    assert sorted(p.name for p in local.iterdir() if p.name.startswith(".")) == []


def test_a_remote_path_ending_in_a_slash_takes_the_file_inside_under_its_name(
    sides: tuple[Path, Path], state: Path
) -> None:
    local, remote = sides
    with Session(remote.parent, state_dir=state) as s:
        assert s.push(Mapping(local / "token.json", "cfg/sub/")).uploaded == 1
    assert (remote / "sub" / "token.json").read_text() == "local-token\n"
    assert (remote / "sub" / "other.txt").read_text() == "remote deep\n"


def test_a_remote_directory_of_that_name_is_refused_before_anything_changes(
    sides: tuple[Path, Path], state: Path
) -> None:
    local, remote = sides
    before = snapshot(remote)
    m = Mapping(local / "token.json", "cfg/sub")
    with Session(remote.parent, state_dir=state) as s, pytest.raises(BadMapping) as err:
        s.push(m)
    assert "is a directory" in str(err.value) and "sub/token.json" in str(err.value)
    assert str(err.value).startswith(f"mapping {local / 'token.json'} -> cfg/sub: ")
    assert err.value.exit_code == 2 and "\n" not in str(err.value)
    assert snapshot(remote) == before


def test_state_is_apart_from_a_directory_mapping_of_the_parent(
    sides: tuple[Path, Path], state: Path
) -> None:
    local, remote = sides
    # The directory mapping of the same parent holds its pair's lock (another run)...
    held = PairState.open(state, str(local), "local", str(remote))
    try:
        with Session(remote.parent, state_dir=state) as s:
            # ...yet the file mapping runs: it shares no lock, ancestor or journal with it.
            assert s.push(Mapping(local / "token.json", "cfg/token.json")).uploaded == 1
            assert (remote / "token.json").exists()
    finally:
        held.close()
    with Session(remote.parent, state_dir=state) as s:
        # The directory pair never recorded the file: its first sync sees it as new on
        # both sides with equal content (no conflict), and syncs the rest.
        report = s.sync(Mapping(local, "cfg"))
    assert report.conflicts == []
    assert (local / "remote-only.txt").exists() and (remote / "sibling.txt").exists()


def test_a_symlinked_file_sends_its_targets_bytes_under_the_links_name(
    sides: tuple[Path, Path], state: Path
) -> None:
    local, remote = sides
    store = local.parent / "store"
    write(store / "github-token-v2.json", "v2\n", 0o600)
    write(store / "github-token-v3.json", "v3\n", 0o600)
    link = local / "gh.json"
    link.symlink_to(store / "github-token-v2.json")
    m = Mapping(link, "cfg/gh_token.json", "upload-only")
    with Session(remote.parent, state_dir=state) as s:
        assert s.push(m).uploaded == 1
        assert (remote / "gh_token.json").read_text() == "v2\n"
        assert stat.S_IMODE((remote / "gh_token.json").stat().st_mode) == 0o600
        write(remote / "gh_token.json", "changed remotely\n")
        assert s.pull(m).passes == []  # upload-only: never written back
        # The link pointed at the next credential: the next push sends its bytes.
        link.unlink()
        link.symlink_to(store / "github-token-v3.json")
        s.push(m)
        assert (remote / "gh_token.json").read_text() == "v3\n"
    assert link.is_symlink() and snapshot(store) == {"github-token-v2.json": b"v2\n",
                                                     "github-token-v3.json": b"v3\n"}
    assert not (remote / "gh.json").exists() and not (remote / "github-token-v3.json").exists()


def test_a_two_way_symlinked_file_pulls_into_its_target_and_keeps_the_link(
    sides: tuple[Path, Path], state: Path
) -> None:
    local, remote = sides
    link = local / "token-link.json"
    link.symlink_to("token.json")
    m = Mapping(link, "cfg/token-link.json")
    with Session(remote.parent, state_dir=state) as s:
        assert s.push(m).uploaded == 1
        write(remote / "token-link.json", "from the remote\n")
        assert s.pull(m).downloaded == 1
    assert link.is_symlink() and os.readlink(link) == "token.json"
    assert (local / "token.json").read_text() == "from the remote\n"


def test_a_mapping_that_cannot_run_names_itself_and_keep_going_runs_the_others(
    sides: tuple[Path, Path], state: Path
) -> None:
    local, remote = sides
    dangling = local / "dangling.json"
    dangling.symlink_to(local / "missing.json")
    bad = Mapping(dangling, "cfg/d.json", "upload-only")
    good = Mapping(local / "token.json", "cfg/t.json", "upload-only")
    before = snapshot(remote)
    with Session(remote.parent, state_dir=state) as s:
        with pytest.raises(BadMapping) as err:
            s.push([bad, good])
        assert str(dangling) in str(err.value) and "cfg/d.json" in str(err.value)
        assert snapshot(remote) == before  # refused before any pass
        report = s.push([bad, good], keep_going=True)
    assert [(m, type(e)) for m, e in report.failed] == [(bad, BadMapping)]
    assert str(dangling) in str(report.failed[0][1])
    assert [m for m, _ in report.passes] == [good]
    assert (remote / "t.json").read_text() == "local-token\n"
