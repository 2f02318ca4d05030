"""Self-sync: a remote root that is the local root, contains it or lies inside it is refused
by push, pull and sync, in one line, with nothing changed on either side."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sessionkit import Factory
from synctree import files_with_mtimes, project_in_data, snapshot, write

from filesync import Mapping, SafetyRefusal, SelfSync, Session
from filesync.core.reconcile import Kind
from filesync.session.selfsync import candidates


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return project_in_data(tmp_path)


_whole = files_with_mtimes


@pytest.mark.parametrize("remote", ["project", ".", "project/sub", "project/new/deeper"])
@pytest.mark.parametrize("call", ["push", "pull", "sync"])
def test_the_same_tree_over_the_local_transport_is_refused(
    tmp_path: Path, tree: Path, remote: str, call: str, factory: Factory
) -> None:
    # remote root: the local root itself, a directory containing it, one inside it that
    # exists, and one inside it that does not exist yet.
    before = _whole(tmp_path)
    with Session(tmp_path / "data", conduit=factory, state_dir=tmp_path / "state") as s, \
            pytest.raises(SelfSync) as err:
        getattr(s, call)(Mapping(tree, remote))
    assert isinstance(err.value, SafetyRefusal) and err.value.exit_code == 3
    assert "\n" not in str(err.value) and "same tree" in str(err.value)
    assert _whole(tmp_path) == before  # nothing changed, the nonce is gone


def test_a_single_file_mapping_onto_itself_is_refused(tmp_path: Path, tree: Path) -> None:
    before = _whole(tmp_path)
    with Session(tmp_path / "data", state_dir=tmp_path / "state") as s, \
            pytest.raises(SelfSync):
        s.sync(Mapping(tree / "a.md", "project/a.md"))
    assert _whole(tmp_path) == before


def test_neighbours_are_not_self_sync_and_status_is_not_refused(
    tmp_path: Path, tree: Path
) -> None:
    with Session(tmp_path / "mirror", state_dir=tmp_path / "state") as s:
        assert s.push(Mapping(tree, "project")).uploaded == 2
    with Session(tmp_path / "data", state_dir=tmp_path / "state") as s:
        # A sibling whose name extends the local root's is a different tree.
        assert s.push(Mapping(tree, "project-copy")).uploaded == 2
        before = _whole(tmp_path)
        # status over the very same tree: a plan (every file to record), no refusal
        plan = s.status(Mapping(tree, "project")).plan
        assert {a.kind for a in plan} == {Kind.RECORD}
        assert _whole(tmp_path) == before
    assert not [n for n in os.listdir(tree) if n.startswith(".filesync.")]


def test_the_check_starts_no_remote_process_of_its_own(
    tmp_path: Path, tree: Path, factory: Factory
) -> None:
    # It asks the remote helper (``Endpoint.any_exists``): one remote process per
    # connection, the helper, with the check refusing as before.
    with Session(tmp_path / "mirror", conduit=factory, state_dir=tmp_path / "state") as s:
        assert s.push(Mapping(tree, "project")).uploaded == 2
        with pytest.raises(SelfSync):
            s.push(Mapping(tree, str(tree)))
    [conduit] = factory.opened
    assert len(conduit.commands) == 1


def test_the_candidates_cover_equal_containing_and_inside() -> None:
    got = candidates(Path("/home/u/p"), "/srv/x/y", "N", True)
    assert got[:4] == ["/srv/x/y/N", "/srv/x/y/p/N", "/srv/x/y/u/p/N", "/srv/x/y/home/u/p/N"]
    assert {"/srv/x/N", "/srv/x/y/../N", "/srv/N", "/srv/x/y/../../N", "/N"} <= set(got)
    assert not [c for c in candidates(Path("/home/u/p"), "/srv/x", "N", False) if ".." in c]


@pytest.mark.sshd
@pytest.mark.parametrize("remote", ["selfsync/project", "selfsync", "selfsync/project/sub"])
def test_the_same_host_directory_over_ssh_is_refused(
    box: Any, tmp_path: Path, remote: str, request: Any
) -> None:
    home: Path = box.home
    root = home / "selfsync" / "project"
    write(root / "a.md", "a\n")
    write(root / "sub" / "b.md", "b\n")
    request.addfinalizer(_remover(home / "selfsync"))
    before = snapshot(home / "selfsync")
    with Session(box.alias, ssh_config=box.ssh_config, state_dir=tmp_path / "state") as s:
        for call in (s.push, s.pull, s.sync):
            with pytest.raises(SelfSync):
                call(Mapping(root, remote))
    assert snapshot(home / "selfsync") == before


def _remover(path: Path) -> Callable[[], None]:
    import shutil

    return lambda: shutil.rmtree(path, ignore_errors=True)


def test_a_local_tree_that_cannot_be_written_is_pushed_unchecked(
    tmp_path: Path, tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    import filesync.session.selfsync as guard

    real_open = os.open

    def read_only(path: Any, flags: int, mode: int = 0o777, **kw: Any) -> int:
        if os.path.basename(os.fspath(path)).startswith(".filesync.") and flags & os.O_CREAT:
            raise OSError(errno.EROFS, "Read-only file system")
        return real_open(path, flags, mode, **kw)

    monkeypatch.setattr(guard.os, "open", read_only)
    seen: list[str] = []
    with Session(tmp_path / "mirror", state_dir=tmp_path / "state", log=seen.append) as s:
        assert s.push(Mapping(tree, "project")).uploaded == 2
    assert any("self-sync check skipped" in line for line in seen)


def _dead_pid() -> int:
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_no_walk_takes_a_live_nonce_for_a_crashed_writers_temp_file(tmp_path: Path) -> None:
    # A walk removes temp files whose writer's pid is dead in its own PID namespace; the
    # remote helper walking this very tree from another namespace (a container, another
    # host's mount) sees every local pid as dead. The nonce's pid (1) is alive in all.
    from filesync.session.selfsync import NONCE_PREFIX
    from filesync.tree.ignore import Matcher
    from filesync.tree.walk import walk

    nonce = tmp_path / f"{NONCE_PREFIX}12345.tmp"
    crashed = tmp_path / f".filesync.{_dead_pid()}.7.tmp"
    for path in (nonce, crashed):
        path.write_bytes(b"")
    write(tmp_path / "kept.md", "x")
    entries, _skipped, _excluded = walk(str(tmp_path), Matcher([], []))
    assert [e[0] for e in entries] == ["kept.md"]  # neither is ever synced
    assert nonce.exists() and not crashed.exists()


def test_a_nonce_left_by_a_killed_check_goes_once_an_hour_old(
    tmp_path: Path, tree: Path
) -> None:
    from filesync.session.selfsync import NONCE_MAX_AGE, NONCE_PREFIX

    old, young = tree / f"{NONCE_PREFIX}1.tmp", tree / f"{NONCE_PREFIX}2.tmp"
    for path in (old, young):
        path.write_bytes(b"")
    past = os.stat(old).st_mtime - NONCE_MAX_AGE - 60
    os.utime(old, (past, past))
    with Session(tmp_path / "mirror", state_dir=tmp_path / "state") as s:
        assert s.push(Mapping(tree, "project")).uploaded == 2
    assert not old.exists() and young.exists()
    assert sorted(snapshot(tmp_path / "mirror" / "project")) == ["a.md", "sub/b.md"]
