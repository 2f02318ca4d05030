"""Path parameters: ``str`` or ``os.PathLike``, ``~`` expanded; the default state dir is the
CLI's, never a literal ``~`` directory."""

from __future__ import annotations

import os
import shutil
from pathlib import Path, PurePath
from typing import Any

import pytest
from synctree import write

from filesync import Mapping, Session, default_state_dir


class Spot(os.PathLike[str]):
    """A PathLike that is not a pathlib path."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __fspath__(self) -> str:
        return self.path


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("FILESYNC_STATE_DIR", raising=False)
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    return home


def test_mapping_local_expands_tilde_from_str_and_pathlike(home: Path) -> None:
    assert Mapping("~/skills", "s").local == str(home / "skills")
    assert Mapping(Spot("~/a"), "s").local == str(home / "a")
    assert Mapping(PurePath("~") / "b", Spot("remote/b")).local == str(home / "b")
    assert Mapping("x", Spot("remote/b")).remote == "remote/b"


def test_tilde_paths_everywhere_and_the_default_state_dir(home: Path) -> None:
    write(home / "skills" / "a.md", "a\n")
    with Session("~/box") as s:
        assert s.state_dir == default_state_dir() == home / ".local" / "state" / "filesync"
        s.push(Mapping("~/skills", "skills"))
    assert (home / "box" / "skills" / "a.md").read_text() == "a\n"
    assert (home / ".local" / "state" / "filesync" / "pairs").is_dir()
    assert os.listdir(".") == []  # no literal "./~" left in the working directory


def test_state_dir_accepts_tilde_and_pathlike(home: Path) -> None:
    write(home / "d" / "f", "f\n")
    with Session(Spot("~/box"), state_dir=Spot("~/my-state")) as s:
        assert s.state_dir == home / "my-state"
        s.push(Mapping(home / "d", "d"))
    assert (home / "my-state" / "pairs").is_dir()
    assert os.listdir(".") == []


def test_the_default_follows_the_clis_environment(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(home / "xdg"))
    assert Session("~/box").state_dir == home / "xdg" / "filesync"
    monkeypatch.setenv("FILESYNC_STATE_DIR", "~/fs-state")
    assert Session("~/box").state_dir == home / "fs-state"


@pytest.mark.sshd
def test_ssh_config_and_identity_expand_tilde(box: Any, home: Path, tmp_path: Path) -> None:
    # The copied config names no key: the login works only with the identity given.
    lines = box.ssh_config.read_text().splitlines()
    (home / "cfg").write_text("\n".join(ln for ln in lines if "IdentityFile" not in ln) + "\n")
    shutil.copy2(box.client_key, home / "id")
    (home / "id").chmod(0o600)
    write(home / "d" / "f.md", "f\n")
    try:
        with Session(box.alias, ssh_config="~/cfg", identity=Spot("~/id"),
                     state_dir="~/state") as s:
            assert s.push(Mapping("~/d", "paths-test/d")).uploaded == 1
        assert (box.home / "paths-test" / "d" / "f.md").read_text() == "f\n"
        assert os.listdir(".") == []
    finally:
        shutil.rmtree(box.home / "paths-test", ignore_errors=True)
