"""Mapping rules: mode, exclude, nested mappings (the innermost owns a path), upload-only."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from synctree import snapshot, write

from filesync import Mapping, Session
from filesync.cli.config import Config, MappingSpec
from filesync.core.exclude import ExcludeRule
from filesync.mapping import literal_pattern, nested_excludes


def test_mode_is_validated_and_exclude_kept() -> None:
    with pytest.raises(ValueError, match="upload-only"):
        Mapping("a", "b", mode="one-way")
    m = Mapping("a", "b", "upload-only", exclude=["*.bak"])
    assert (m.mode, m.exclude) == ("upload-only", ("*.bak",))
    assert Mapping("a", "b") == Mapping("a", "b", "two-way")
    with pytest.raises(ValueError, match="list of patterns"):
        Mapping("a", "b", exclude="*.bak")


def test_inner_mappings_are_excluded_from_the_outer_on_either_side(tmp_path: Path) -> None:
    outer = Mapping(tmp_path / "agent", "box/agent")
    inner_dir = Mapping(tmp_path / "agent" / "skills", "elsewhere/skills")  # local side
    inner_file = Mapping(tmp_path / "creds" / "token", "box/agent/token")  # remote side
    unrelated = Mapping(tmp_path / "agent-two", "box/agent-two")  # a prefix, not inside
    got = nested_excludes(outer, [outer, inner_dir, inner_file, unrelated])
    assert got == ["/skills", "/token"]
    rule = ExcludeRule.build(got)
    assert rule.excluded("skills", True) and rule.excluded("skills/a.md", False)
    assert rule.excluded("token", False) and not rule.excluded("tokens", False)
    assert nested_excludes(inner_dir, [outer, inner_dir]) == []


def test_the_rule_is_the_clis_for_the_clis_case() -> None:
    """The CLI's config rule (remote roots nested) excludes exactly what this one does."""
    specs = [MappingSpec(Mapping(f"/l/{i}", remote)) for i, remote in
             enumerate([".hermes", ".hermes/skills", ".hermes/skills/x", "other"])]
    config = Config(["host:"], specs)
    paths = [("skills", True), ("skills/y", False), ("skillsx", True), ("x", True),
             ("skills/x", True), ("x/skills", True)]
    for spec in specs:
        cli = ExcludeRule.build(config.nested_excludes(spec))
        mine = ExcludeRule.build(nested_excludes(spec.mapping, [s.mapping for s in specs]))
        assert [cli.excluded(p, d) for p, d in paths] == [mine.excluded(p, d) for p, d in paths]


def test_literal_pattern_matches_only_that_name() -> None:
    near = {"a*b": "axb", "[x]": "x", "!bang": "bang", "#hash": "hash", "sp ace ": "sp ace",
            "back\\slash": "backslash", "q?": "qa", "d/e": "d"}
    for name, other in near.items():
        rule = ExcludeRule.build([literal_pattern(name)])
        assert rule.excluded(name, False) and not rule.excluded(other, False), name


def test_nested_mappings_sync_each_path_once(tmp_path: Path) -> None:
    home, box = tmp_path / "home", tmp_path / "box"
    write(home / "agent" / "notes.md", "notes\n")
    write(home / "agent" / "skills" / "pdf.md", "pdf\n")
    write(home / "agent" / "token", "secret\n", 0o600)
    mappings = [
        Mapping(home / "agent", "agent"),
        Mapping(home / "agent" / "skills", "skills"),  # inner on the local side only
        Mapping(home / "agent" / "token", "agent/token", mode="upload-only"),  # both sides
    ]
    with Session(box, state_dir=tmp_path / "state") as s:
        s.push(mappings)
        assert snapshot(box) == {"agent/notes.md": b"notes\n", "agent/token": b"secret\n",
                                 "skills/pdf.md": b"pdf\n"}
        assert stat.S_IMODE((box / "agent" / "token").stat().st_mode) == 0o600
        # Remote edits: the inner upload-only file is never brought back, not even by
        # the outer two-way mapping whose remote tree holds it.
        write(box / "agent" / "token", "tampered\n")
        write(box / "skills" / "new.md", "new\n")
        write(box / "agent" / "skills" / "stray.md", "stray\n")  # the outer's remote side
        report = s.pull(mappings)
    assert [m.local for m, _ in report.passes] == [str(home / "agent"),
                                                   str(home / "agent" / "skills")]
    # Each pass's confirmed files, joined in mapping order, relative to each pass's root.
    assert [(c.path, c.action.value, c.bytes) for c in report.changes] == [
        ("new.md", "download", 4)]
    assert report.changes == [c for _, r in report.passes for c in r.changes]
    assert (home / "agent" / "token").read_text() == "secret\n"
    assert (home / "agent" / "skills" / "new.md").read_text() == "new\n"
    assert not (home / "agent" / "skills" / "stray.md").exists()


def test_upload_only_is_pushed_by_sync_and_never_pulled(tmp_path: Path) -> None:
    home, box = tmp_path / "home", tmp_path / "box"
    write(home / "creds" / "key", "v1\n", 0o600)
    m = Mapping(home / "creds", "creds", mode="upload-only")
    with Session(box, state_dir=tmp_path / "state") as s:
        s.push(m)
        write(box / "creds" / "key", "remote\n")
        write(box / "creds" / "remote-new", "x\n")
        assert s.pull(m).passes == []
        assert snapshot(home / "creds") == {"key": b"v1\n"}
        write(home / "creds" / "key", "v2\n", 0o600)
        s.sync(m)
        assert snapshot(home / "creds") == {"key": b"v2\n"}
        assert (box / "creds" / "key").read_text() == "v2\n"


def test_a_mapping_exclude_applies_to_its_pass(tmp_path: Path) -> None:
    home, box = tmp_path / "home", tmp_path / "box"
    write(home / "d" / "keep.md", "k\n")
    write(home / "d" / "drop.bak", "b\n")
    with Session(box, state_dir=tmp_path / "state", exclude=["*.tmp"]) as s:
        write(home / "d" / "t.tmp", "t\n")
        s.push(Mapping(home / "d", "d", exclude=["*.bak"]))
    assert snapshot(box) == {"d/keep.md": b"k\n"}
