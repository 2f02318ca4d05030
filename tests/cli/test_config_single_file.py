"""Single-file mappings in ``--config``: every verb, as in the library (one planner).

The CLI runs as a subprocess (``python -m filesync.cli``); the remote is a local path
(``remotes = ["/abs/path"]``), and once a real sshd. A file mapping touches no other file
of either parent, an upload-only file is never pulled, its state is apart from a directory
mapping of the same parent, and a differing remote basename is one line, exit 2.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sshd import SshdContainer
from synctree import snapshot, write

from filesync.host.state import PairState

FILES = ("token.json", "settings.toml")


def cli(*argv: str, env: dict[str, str] | None = None) -> tuple[int, Any, str]:
    done = subprocess.run([sys.executable, "-m", "filesync.cli", *argv], capture_output=True,
                          text=True, timeout=300, check=False, env=env)
    out = done.stdout.strip()
    return done.returncode, json.loads(out) if out else None, done.stderr


def config(path: Path, remote: str, host: Path, cfg_remote: str = "cfg") -> Path:
    return write(path, f"""
remotes = ["{remote}"]
[[mapping]]
local = "{host / 'skills'}"
remote = "skills"
[[mapping]]
local = "{host / 'cfg' / 'token.json'}"
remote = "{cfg_remote}/token.json"
mode = "upload-only"
[[mapping]]
local = "{host / 'cfg' / 'settings.toml'}"
remote = "{cfg_remote}/settings.toml"
""")


def others(root: Path) -> dict[str, bytes]:
    return {k: v for k, v in snapshot(root).items() if k not in FILES}


@pytest.fixture
def sides(tmp_path: Path) -> tuple[Path, Path, Path]:
    """The host tree, the remote tree, and a filesync.toml mapping both."""
    host, box = tmp_path / "host", tmp_path / "box"
    write(host / "skills" / "web" / "SKILL.md", "skill\n")
    write(host / "cfg" / "token.json", "local-token\n", 0o600)
    write(host / "cfg" / "settings.toml", "x = 1\n")
    write(host / "cfg" / "sibling.txt", "local sibling\n")
    write(host / "cfg" / "sub" / "deep.txt", "local deep\n")
    write(box / "cfg" / "remote-only.txt", "remote sibling\n")
    write(box / "cfg" / "sub" / "other.txt", "remote deep\n")
    return host, box, config(tmp_path / "filesync.toml", str(box), host)


def test_every_verb_touches_only_the_mapped_files(
    sides: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    host, box, cfg = sides
    before_host, before_box = others(host / "cfg"), others(box / "cfg")

    def run(verb: str) -> Any:
        code, doc, err = cli(verb, "--config", str(cfg), "--json",
                             "--state-dir", str(tmp_path / "state"))
        assert code == 0, err
        return doc

    doc = run("status")
    assert sorted(a["path"] for a in doc["plan"]) == ["settings.toml", "token.json",
                                                       "web/SKILL.md"]
    assert [p["label"] for p in doc["pairs"]] == [
        f"{box}/skills", f"{box}/cfg/token.json", f"{box}/cfg/settings.toml"]
    assert doc["pairs"][1]["local"] == str(host / "cfg" / "token.json")
    assert not (box / "cfg" / "token.json").exists()  # status changed nothing

    doc = run("push")
    assert doc["uploaded"] == 3
    assert stat.S_IMODE((box / "cfg" / "token.json").stat().st_mode) == 0o600
    assert (box / "cfg" / "settings.toml").read_text() == "x = 1\n"

    write(box / "cfg" / "token.json", "remote token\n", 0o600)
    write(box / "cfg" / "settings.toml", "x = 2\n")
    doc = run("pull")
    assert doc["downloaded"] == 1 and len(doc["pairs"]) == 2  # upload-only left out
    assert (host / "cfg" / "settings.toml").read_text() == "x = 2\n"
    assert (host / "cfg" / "token.json").read_text() == "local-token\n"

    # sync pushes the upload-only file back over the remote edit, never the other way.
    write(host / "cfg" / "settings.toml", "x = 3\n")
    doc = run("sync")
    assert (box / "cfg" / "token.json").read_text() == "local-token\n"
    assert (host / "cfg" / "token.json").read_text() == "local-token\n"
    assert (box / "cfg" / "settings.toml").read_text() == "x = 3\n"
    assert doc["downloaded"] == 0 and doc["uploaded"] == 2
    assert run("status")["plan"] == []

    assert others(host / "cfg") == before_host
    assert others(box / "cfg") == before_box


def test_file_state_is_apart_from_a_directory_mapping_of_the_parent(
    sides: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    host, box, cfg = sides
    state = tmp_path / "state"
    # Another run holds the lock of the directory pair cfg <-> cfg...
    held = PairState.open(state, str(host / "cfg"), "local", str(box / "cfg"))
    try:
        # ...yet the file mappings run: they share no lock, ancestor or journal with it.
        code, doc, err = cli("push", "--config", str(cfg), "--json", "--state-dir", str(state))
        assert code == 0 and doc["uploaded"] == 3, err
    finally:
        held.close()
    whole = write(tmp_path / "whole.toml", f"""
remote = "{box}"
[[mapping]]
local = "{host / 'cfg'}"
remote = "cfg"
""")
    code, doc, err = cli("sync", "--config", str(whole), "--json", "--state-dir", str(state))
    # The directory pair never recorded the files: equal on both sides, no conflict.
    assert code == 0 and doc["conflicts"] == [], err
    assert (host / "cfg" / "remote-only.txt").exists() and (box / "cfg" / "sibling.txt").exists()


def test_a_differing_remote_name_renames_and_a_bad_mapping_is_one_line_exit_2(
    sides: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    host, box, _ = sides
    (host / "cfg" / "gh.json").symlink_to(host / "cfg" / "token.json")
    mappings = f"""
remotes = ["{box}"]
[[mapping]]
local = "{host / 'skills'}"
remote = "skills"
[[mapping]]
local = "{host / 'cfg' / 'gh.json'}"
remote = ".agent/gh_token.json"
mode = "upload-only"
"""
    cfg = write(tmp_path / "ok.toml", mappings)
    code, doc, err = cli("push", "--config", str(cfg), "--json",
                         "--state-dir", str(tmp_path / "s"))
    assert code == 0 and doc["uploaded"] == 2, err
    assert (box / ".agent" / "gh_token.json").read_text() == "local-token\n"
    assert stat.S_IMODE((box / ".agent" / "gh_token.json").stat().st_mode) == 0o600
    (host / "cfg" / "dangling.json").symlink_to(host / "cfg" / "gone.json")
    bad = write(tmp_path / "bad.toml", mappings + f"""
[[mapping]]
local = "{host / 'cfg' / 'dangling.json'}"
remote = "cfg/d.json"
""")
    write(host / "skills" / "new.md", "new\n")
    before = snapshot(box)
    code, _, err = cli("push", "--config", str(bad), "--state-dir", str(tmp_path / "s"))
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"filesync: error: mapping {host / 'cfg' / 'dangling.json'} -> "
                          "cfg/d.json: ") and "does not exist" in err
    assert snapshot(box) == before  # refused before any pass, the directory's included


def test_a_missing_local_file_is_pulled_when_the_remote_has_it(
    sides: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    host, box, cfg = sides
    (host / "cfg" / "settings.toml").unlink()
    write(box / "cfg" / "settings.toml", "y = 1\n")
    write(box / "skills" / "web" / "SKILL.md", "skill\n")
    code, doc, err = cli("pull", "--config", str(cfg), "--json",
                         "--state-dir", str(tmp_path / "s"))
    assert code == 0, err
    assert doc["pairs"][1]["label"] == f"{box}/cfg/settings.toml"
    assert doc["pairs"][1]["downloaded"] == 1
    assert (host / "cfg" / "settings.toml").read_text() == "y = 1\n"
    assert not (host / "cfg" / "remote-only.txt").exists()


@pytest.mark.sshd
def test_single_file_mappings_through_a_real_sshd(sshd: SshdContainer, tmp_path: Path) -> None:
    userhome = tmp_path / "userhome"  # the machine's own ~/.ssh never decides the outcome
    userhome.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"} | {"HOME": str(userhome)}
    host, rel = tmp_path / "host", f"single-{tmp_path.name}"
    write(host / "skills" / "a.md", "a\n")
    write(host / "cfg" / "token.json", "local-token\n", 0o600)
    write(host / "cfg" / "settings.toml", "x = 1\n")
    write(host / "cfg" / "sibling.txt", "local sibling\n")
    box = sshd.home / rel
    write(box / "cfg" / "remote-only.txt", "remote sibling\n")
    cfg = config(tmp_path / "filesync.toml", f"{sshd.alias}:{rel}", host)

    def run(verb: str) -> Any:
        code, doc, err = cli(verb, "--config", str(cfg), "--json", "-F", str(sshd.ssh_config),
                             "--state-dir", str(tmp_path / "state"), env=env)
        assert code == 0, err
        return doc

    try:
        assert run("push")["uploaded"] == 3
        assert stat.S_IMODE((box / "cfg" / "token.json").stat().st_mode) == 0o600
        write(box / "cfg" / "token.json", "remote token\n", 0o600)
        write(box / "cfg" / "settings.toml", "x = 2\n")
        assert run("pull")["downloaded"] == 1
        assert (host / "cfg" / "settings.toml").read_text() == "x = 2\n"
        assert (host / "cfg" / "token.json").read_text() == "local-token\n"
        run("sync")
        assert (box / "cfg" / "token.json").read_text() == "local-token\n"
        assert run("status")["plan"] == []
        assert not (host / "cfg" / "remote-only.txt").exists()
        assert not (box / "cfg" / "sibling.txt").exists()
    finally:
        subprocess.run(["rm", "-rf", str(box.parent / rel)], check=False)


@pytest.mark.sshd
def test_a_symlinked_credential_goes_under_another_name_through_a_real_sshd(
    sshd: SshdContainer, tmp_path: Path
) -> None:
    userhome = tmp_path / "userhome"
    userhome.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"} | {"HOME": str(userhome)}
    secrets, rel = tmp_path / "secrets", f"cred-{tmp_path.name}"
    write(secrets / "github-token-v2.json", "v2\n", 0o600)
    link = tmp_path / "gh.json"
    link.symlink_to(secrets / "github-token-v2.json")
    box = sshd.home / rel
    write(box / ".hermes" / "other.json", "stays\n")
    common = ("--json", "-F", str(sshd.ssh_config), "--state-dir", str(tmp_path / "state"))
    try:
        code, doc, err = cli("push", str(link), f"{sshd.alias}:{rel}/.hermes/gh_token.json",
                             *common, env=env)
        assert code == 0 and doc["uploaded"] == 1, err
        assert (box / ".hermes" / "gh_token.json").read_text() == "v2\n"
        assert stat.S_IMODE((box / ".hermes" / "gh_token.json").stat().st_mode) == 0o600
        code, doc, err = cli("push", str(link), f"{sshd.alias}:{rel}/", *common, env=env)
        assert code == 0 and doc["uploaded"] == 1, err
        assert snapshot(box) == {".hermes/gh_token.json": b"v2\n", "gh.json": b"v2\n",
                                 ".hermes/other.json": b"stays\n"}
        assert link.is_symlink() and snapshot(secrets) == {"github-token-v2.json": b"v2\n"}
    finally:
        subprocess.run(["rm", "-rf", str(box)], check=False)


def test_positional_file_local_is_the_same_single_file_mapping(
    sides: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    host, box, _ = sides
    before_host, before_box = others(host / "cfg"), others(box / "cfg")
    token, remote = host / "cfg" / "token.json", str(box / "cfg" / "token.json")
    state = ("--state-dir", str(tmp_path / "state"))
    code, doc, err = cli("status", str(token), remote, "--json", *state)
    assert code == 0 and [a["path"] for a in doc["plan"]] == ["token.json"], err
    code, doc, err = cli("push", str(token), remote, "--json", *state)
    assert code == 0 and doc["uploaded"] == 1, err
    assert doc["pairs"][0]["local"] == str(token) and doc["pairs"][0]["remote"] == remote
    assert stat.S_IMODE((box / "cfg" / "token.json").stat().st_mode) == 0o600
    write(box / "cfg" / "token.json", "remote token\n", 0o600)
    code, doc, err = cli("sync", str(token), remote, "--json", *state)
    assert code == 0 and doc["downloaded"] == 1, err
    assert token.read_text() == "remote token\n"
    fresh = host / "cfg" / "new.toml"  # not there yet: the remote side says it is a file
    write(box / "cfg" / "new.toml", "n = 1\n")
    code, doc, err = cli("pull", str(fresh), str(box / "cfg" / "new.toml"), "--json", *state)
    assert code == 0 and doc["downloaded"] == 1 and fresh.read_text() == "n = 1\n", err
    assert {k: v for k, v in others(host / "cfg").items() if k != "new.toml"} == before_host
    assert {k: v for k, v in others(box / "cfg").items() if k != "new.toml"} == before_box


def test_positional_file_goes_under_another_name_or_into_a_dir_ending_in_a_slash(
    sides: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    host, box, _ = sides
    token = str(host / "cfg" / "token.json")
    state = ("--state-dir", str(tmp_path / "s"))
    before = snapshot(box)
    code, doc, err = cli("push", token, str(box / "cfg" / "credentials.json"), "--json", *state)
    assert code == 0 and doc["uploaded"] == 1, err
    code, doc, err = cli("push", token, str(box / "cfg" / "sub") + "/", "--json", *state)
    assert code == 0 and doc["uploaded"] == 1, err
    assert snapshot(box) == {**before, "cfg/credentials.json": b"local-token\n",
                             "cfg/sub/token.json": b"local-token\n"}
    write(box / "cfg" / "credentials.json", "remote\n")
    code, doc, err = cli("pull", token, str(box / "cfg" / "credentials.json"), "--json", *state)
    assert code == 0 and doc["downloaded"] == 1, err
    assert Path(token).read_text() == "remote\n"


def test_positional_file_onto_a_remote_dir_or_resolve_is_one_line_exit_2(
    sides: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    host, box, _ = sides
    token = str(host / "cfg" / "token.json")
    before = snapshot(box)
    code, _, err = cli("push", token, str(box / "cfg"), "--state-dir", str(tmp_path / "s"))
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "is a directory" in err and "cfg/token.json" in err and "end the remote" in err
    code, _, err = cli("resolve", token, str(box / "cfg"), "x", "--keep", "local")
    assert code == 2 and len(err.splitlines()) == 1 and "is not a directory" in err, err
    assert snapshot(box) == before
