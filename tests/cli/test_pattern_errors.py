"""An invalid exclude pattern, from any source, is one line naming it and its source, exit 2.

The CLI runs as a subprocess (``python -m filesync.cli``): what is checked is what a user
sees, traceback or not.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from synctree import skills_tree, write

BAD = "[z-a]"


def filesync(*argv: str) -> tuple[int, str, str]:
    done = subprocess.run([sys.executable, "-m", "filesync.cli", *argv], capture_output=True,
                          text=True, timeout=120, check=False)
    return done.returncode, done.stdout, done.stderr


@pytest.fixture
def local(tmp_path: Path) -> Path:
    root = tmp_path / "skills"
    skills_tree(root)
    return root


def assert_refused(code: int, err: str, remote: Path, source: str) -> None:
    assert code == 2, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("filesync: error: exclude pattern '[z-a]' from ")
    assert source in lines[0] and "reversed" in lines[0]
    assert not remote.exists()  # refused before anything was synced


def test_bad_exclude_option(local: Path, tmp_path: Path) -> None:
    remote = tmp_path / "remote"
    code, _, err = filesync("push", str(local), str(remote), "--exclude", "*.bak",
                            "--exclude", BAD, "--state-dir", str(tmp_path / "state"))
    assert_refused(code, err, remote, "from --exclude is invalid")


def test_bad_line_in_filesyncignore(local: Path, tmp_path: Path) -> None:
    write(local / ".filesyncignore", f"# first\n*.log\n\n{BAD}\n")
    remote = tmp_path / "remote"
    code, _, err = filesync("push", str(local), str(remote), "--state-dir", str(tmp_path / "s"))
    assert_refused(code, err, remote, f"from {local / '.filesyncignore'}:4 is invalid")


def test_bad_exclude_in_config(local: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    cfg = write(tmp_path / "filesync.toml", f"""
remotes = ["file://{home}"]
[[mapping]]
local = "{local}"
remote = "skills"
exclude = ["*.bak", "{BAD}"]
""")
    code, _, err = filesync("push", "--config", str(cfg), "--state-dir", str(tmp_path / "s"))
    assert_refused(code, err, home, f"from {cfg} (mapping 1) is invalid")


def test_bad_exclude_in_config_is_refused_when_no_remote_answers(
    local: Path, tmp_path: Path
) -> None:
    cfg = write(tmp_path / "filesync.toml", f"""
remotes = ["ssh://127.0.0.1:1/"]
[[mapping]]
local = "{local}"
remote = "skills"
exclude = ["{BAD}"]
""")
    code, _, err = filesync("push", "--config", str(cfg), "--state-dir", str(tmp_path / "s"))
    assert_refused(code, err, tmp_path / "nothing", f"from {cfg} (mapping 1) is invalid")


def test_bad_pattern_with_json_is_one_object(local: Path, tmp_path: Path) -> None:
    code, out, err = filesync("push", str(local), str(tmp_path / "r"), "--exclude", "a\\",
                              "--json", "--state-dir", str(tmp_path / "s"))
    assert code == 2 and "Traceback" not in err
    report = json.loads(out)
    assert report["exit_code"] == 2 and "'a\\' from --exclude" in report["error"]
