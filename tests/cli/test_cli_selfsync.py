"""Self-sync through the command: push, pull, sync and resolve refuse a REMOTE that is
LOCAL, contains it or lies inside it, in one line with exit code 3 and nothing changed on
either side; status still plans. The check is ``filesync.session.selfsync``, the library's,
run by every pass the CLI starts (a directory pair, a single file, ``--config``, a
fan-out) over the local transport and over the real sshd."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from synctree import files_with_mtimes, project_in_data, snapshot, write


def cli(*argv: str) -> tuple[int, str, str]:
    proc = subprocess.run([sys.executable, "-m", "filesync.cli", *argv], capture_output=True,
                          text=True, timeout=300, stdin=subprocess.DEVNULL)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return project_in_data(tmp_path)


_whole = files_with_mtimes


def _refused(code: int, out: str, err: str) -> None:
    assert code == 3, (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "same tree" in lines[0], err
    assert "Traceback" not in err


@pytest.mark.parametrize("command", ["push", "pull", "sync", "resolve"])
@pytest.mark.parametrize("remote", ["data/project", "data", "data/project/sub",
                                    "data/project/new/deeper"])
def test_a_directory_pair_onto_itself_is_refused(
    tmp_path: Path, tree: Path, command: str, remote: str
) -> None:
    before = _whole(tmp_path)
    pair = [str(tree), str(tmp_path / remote)]
    argv = ["resolve", "--keep", "local", *pair, "a.md"] if command == "resolve" else \
        [command, *pair]
    _refused(*cli(*argv, "--state-dir", str(tmp_path / "state")))
    assert _whole(tmp_path) == before  # nothing changed, the nonce is gone


def test_a_fan_out_refuses_only_the_pair_that_is_one_tree(tmp_path: Path, tree: Path) -> None:
    code, out, err = cli("push", str(tree), str(tmp_path / "mirror"), str(tmp_path / "data"),
                         "--state-dir", str(tmp_path / "state"))
    assert code == 3, (code, out, err)
    assert "same tree" in err and "Traceback" not in err
    assert snapshot(tmp_path / "mirror") == snapshot(tree)
    assert not (tmp_path / "data" / "data").exists()


def test_a_single_file_and_a_config_mapping_onto_themselves_are_refused(
    tmp_path: Path, tree: Path
) -> None:
    before = _whole(tmp_path)
    _refused(*cli("sync", str(tree / "a.md"), str(tmp_path / "data/project/a.md"),
                  "--state-dir", str(tmp_path / "state")))
    config = tmp_path / "filesync.toml"
    config.write_text(f'remote = "{tmp_path / "data"}"\n'
                      '[[mapping]]\nlocal = "data/project"\nremote = "project"\n')
    _refused(*cli("push", "--config", str(config), "--state-dir", str(tmp_path / "state")))
    config.unlink()
    assert _whole(tmp_path) == before


def test_neighbours_are_synced_and_a_plan_is_not_refused(tmp_path: Path, tree: Path) -> None:
    state = ["--state-dir", str(tmp_path / "state")]
    # A sibling whose name extends the local root's is a different tree.
    assert cli("push", str(tree), str(tmp_path / "data" / "project-copy"), *state)[0] == 0
    assert snapshot(tmp_path / "data" / "project-copy") == snapshot(tree)
    before = _whole(tmp_path)
    # status and --dry-run over the very same tree: a plan, no refusal, nothing written
    for argv in (("status",), ("push", "-n"), ("sync", "--dry-run")):
        code, out, err = cli(*argv, str(tree), str(tmp_path / "data"), *state)
        assert code == 0, (argv, code, out, err)
        assert _whole(tmp_path) == before
    assert not [n for n in os.listdir(tree) if n.startswith(".filesync.")]


@pytest.mark.sshd
@pytest.mark.parametrize("client", ["openssh", "asyncssh"])
def test_the_same_host_directory_over_ssh_is_refused(
    sshd: Any, tmp_path: Path, client: str, request: Any
) -> None:
    import shutil

    home = Path(sshd.home)
    root = home / f"cli-selfsync-{client}" / "project"
    write(root / "a.md", "a\n")
    request.addfinalizer(lambda: shutil.rmtree(root.parent, ignore_errors=True))
    before = snapshot(root.parent)
    for command, remote in (("push", "project"), ("pull", ""), ("sync", "project/sub")):
        _refused(*cli(command, str(root), f"{sshd.alias}:{root.parent.name}/{remote}",
                      "-F", str(sshd.ssh_config), "--ssh-client", client,
                      "--state-dir", str(tmp_path / "state")))
    assert snapshot(root.parent) == before
