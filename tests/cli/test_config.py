"""filesync.toml mappings, upload-only trees, nested roots and fan-out push."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
from synctree import skills_tree, snapshot, write

from filesync.cli.config import load_config
from filesync.cli.main import main
from filesync.core.exclude import ExcludeRule
from filesync.errors import UsageError


def run(*argv: str) -> tuple[int, Any, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    text = out.getvalue().strip()
    return code, json.loads(text) if text else None, err.getvalue()


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, Path, Path]:
    skills, creds = tmp_path / "host" / "skills", tmp_path / "host" / "creds"
    skills_tree(skills)
    write(creds / "api.key", "k1\n", 0o600)
    remote_home = tmp_path / "remote-home"
    cfg = write(tmp_path / "filesync.toml", f"""
remotes = ["file://{remote_home}"]
[[mapping]]
local = "{skills}"
remote = ".hermes/skills"
[[mapping]]
local = "{creds}"
remote = ".hermes/creds"
mode = "upload-only"
""")
    return cfg, remote_home, tmp_path


def test_config_pushes_all_mappings_and_never_pulls_upload_only(
    setup: tuple[Path, Path, Path],
) -> None:
    cfg, home, tmp = setup
    state = str(tmp / "state")
    code, report, _ = run("push", "--config", str(cfg), "--json", "--state-dir", state)
    assert code == 0 and report["uploaded"] == len(snapshot(tmp / "host")) - 1  # .hub pruned
    assert (home / ".hermes" / "creds" / "api.key").stat().st_mode & 0o777 == 0o600
    write(home / ".hermes" / "creds" / "api.key", "changed remotely\n")
    write(home / ".hermes" / "skills" / "web" / "SKILL.md", "remote edit\n")
    code, report, _ = run("pull", "--config", str(cfg), "--json", "--state-dir", state)
    assert code == 0 and report["downloaded"] == 1
    assert (tmp / "host" / "creds" / "api.key").read_text() == "k1\n"
    assert (tmp / "host" / "skills" / "web" / "SKILL.md").read_text() == "remote edit\n"


def test_nested_remote_roots_belong_to_the_longest_mapping(tmp_path: Path) -> None:
    outer, inner = tmp_path / "hermes", tmp_path / "skills"
    write(outer / "config.yaml", "x: 1\n")
    skills_tree(inner)
    home = tmp_path / "home"
    cfg = write(tmp_path / "f.toml", f"""
remotes = ["file://{home}"]
[[mapping]]
local = "{outer}"
remote = ".hermes"
[[mapping]]
local = "{inner}"
remote = ".hermes/skills"
""")
    state = str(tmp_path / "state")
    assert run("push", "--config", str(cfg), "--state-dir", state, "--json")[0] == 0
    write(home / ".hermes" / "skills" / "pdf" / "SKILL.md", "remote\n")
    assert run("pull", "--config", str(cfg), "--state-dir", state, "--json")[0] == 0
    assert not (outer / "skills").exists()
    assert (inner / "pdf" / "SKILL.md").read_text() == "remote\n"


def test_fan_out_push_to_several_remotes(tmp_path: Path) -> None:
    local = tmp_path / "skills"
    skills_tree(local)
    remotes = [str(tmp_path / f"r{i}") for i in range(3)]
    code, report, _ = run("push", str(local), *remotes, "--json",
                          "--state-dir", str(tmp_path / "s"))
    assert code == 0 and len(report["remotes"]) == 3
    assert report["uploaded"] == 3 * report["remotes"][0]["uploaded"] > 0
    for r in remotes:
        assert snapshot(Path(r)) == {k: v for k, v in snapshot(local).items()
                                     if not k.startswith(".hub/")}


def test_fan_out_reports_a_failing_remote_and_still_pushes_the_rest(tmp_path: Path) -> None:
    local = tmp_path / "skills"
    skills_tree(local)
    bad = write(tmp_path / "not-a-dir", "x")
    code, report, err = run("push", str(local), str(tmp_path / "ok"), str(bad), "--json",
                            "--state-dir", str(tmp_path / "s"))
    assert code == 1 and "not a directory" in err
    assert [r.get("error") is None for r in report["remotes"]] == [True, False]
    assert (tmp_path / "ok" / "web" / "SKILL.md").exists()


def test_only_push_fans_out(tmp_path: Path) -> None:
    code, _, err = run("pull", str(tmp_path), "a:x", "b:y")
    assert code == 2 and "unrecognized arguments: b:y" in err


@pytest.mark.parametrize("text,needle", [
    ("remotes = [", "not valid TOML"),
    ('remotes = []\n', "remotes"),
    ('remotes = ["x:"]\n', "no [[mapping]]"),
    ('remotes = ["x:"]\n[[mapping]]\nlocal = "/a"\n', "lacks 'remote'"),
    ('remotes = ["x:"]\n[[mapping]]\nlocal = "/a"\nremote = "b"\nmode = "both"\n', "mode"),
])
def test_config_errors_are_one_line_usage_errors(tmp_path: Path, text: str, needle: str) -> None:
    cfg = write(tmp_path / "f.toml", text)
    code, _, err = run("push", "--config", str(cfg))
    assert code == 2 and needle in err and err.count("\n") == 1


def test_missing_config_file(tmp_path: Path) -> None:
    code, _, err = run("sync", "--config", str(tmp_path / "nope.toml"))
    assert code == 2 and "does not exist" in err


def test_nested_roots_are_excluded_literally_not_as_globs(tmp_path: Path) -> None:
    cfg = write(tmp_path / "f.toml", """
remotes = ["host:"]
[[mapping]]
local = "/h/a"
remote = ".hermes"
[[mapping]]
local = "/h/b"
remote = ".hermes/sk[i]lls*"
""")
    config = load_config(cfg)
    nested = config.nested_excludes(config.mappings[0])
    assert nested == ["/sk\\[i\\]lls\\*"]
    rule = ExcludeRule.build(nested, default_excludes=False)
    assert rule.excluded("sk[i]lls*", True)
    assert not rule.excluded("skills", True) and not rule.excluded("sk[i]lls-old", True)


def test_exclude_must_be_a_list_of_strings(tmp_path: Path) -> None:
    cfg = write(tmp_path / "f.toml", """
remotes = ["host:"]
[[mapping]]
local = "/h/a"
remote = "a"
exclude = "*.bak"
""")
    with pytest.raises(UsageError, match=r"mapping 1: exclude must be a list of pattern strings"):
        load_config(cfg)
