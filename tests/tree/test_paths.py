"""Path-safety: ``unsafe_reason`` refuses what could leave the root or break the other side."""

from __future__ import annotations

import os
import re
import unicodedata
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filesync.tree.paths import STRUCTURE, plain_name, split_rel, unsafe_reason

ROOT = Path("/srv/sync/root")


def host_path(root: Path, rel: str) -> Path:
    """How every host and remote operation maps a relative path: through ``split_rel``."""
    return root.joinpath(*split_rel(rel))

ESCAPING = ["..", "../x", "a/../../x", "a/..", "./a", "a/./b", ".", "/etc/passwd", "/", "//x"]
EMPTY_COMPONENTS = ["", "a//b", "a/", "/a", "a/b/"]
CONTROL = [
    "a\nb", "a\rb", "a\tb", "\x1b[31mred", "a\x7fb", "a\x01", "\x1f", "dir/na\nme",
    # C1 controls (Unicode category Cc): U+0085 is NEXT LINE, U+009B is the 8-bit CSI
    "a\x85b", "a\x9b2J",
]  # fmt: skip
INVALID_UTF8 = [os.fsdecode(b"\xff"), os.fsdecode(b"ok/\xc3"), "a/" + os.fsdecode(b"\xed\xa0\x80")]
SAFE = [
    "a", "a/b/c.txt", "with space.txt", " leading and trailing ", "dir with spaces/f",
    "unicodé/ñame.md", "日本語/ファイル.txt", "emoji-🙂", "...", "..a", "a..", ".hidden",
    "a/.b/..c", "-dash", "~tilde", "back\\slash", "quote\"'", "$HOME", "*?[]",
]  # fmt: skip


@pytest.mark.parametrize("rel", ESCAPING + EMPTY_COMPONENTS)
def test_escaping_and_empty_components_are_refused(rel: str) -> None:
    reason = unsafe_reason(rel)
    assert reason is not None and reason.strip()
    with pytest.raises(ValueError, match="unsafe"):
        host_path(ROOT, rel)


@pytest.mark.parametrize("rel", ["a\0b", "\0", "dir/\0"])
def test_nul_is_refused(rel: str) -> None:
    assert unsafe_reason(rel) is not None
    with pytest.raises(ValueError):
        host_path(ROOT, rel)


@pytest.mark.parametrize("rel", CONTROL)
def test_control_characters_are_refused(rel: str) -> None:
    assert unsafe_reason(rel) == "control character in name"
    with pytest.raises(ValueError, match="control character"):
        host_path(ROOT, rel)


@pytest.mark.parametrize("rel", INVALID_UTF8)
def test_invalid_utf8_is_refused(rel: str) -> None:
    assert unsafe_reason(rel) == "name is not valid UTF-8"
    with pytest.raises(ValueError, match="UTF-8"):
        host_path(ROOT, rel)


@pytest.mark.parametrize("rel", SAFE)
def test_normal_names_pass(rel: str) -> None:
    assert unsafe_reason(rel) is None
    assert host_path(ROOT, rel) == ROOT.joinpath(*rel.split("/"))


def test_every_ascii_control_character_is_refused() -> None:
    for code in [*range(1, 32), 0x7F]:
        assert unsafe_reason(f"a{chr(code)}b") is not None, hex(code)


def test_every_unicode_control_character_is_refused() -> None:
    controls = [chr(c) for c in range(0x110000) if unicodedata.category(chr(c)) == "Cc"]
    assert len(controls) == 65  # C0, DEL and C1
    accepted = [hex(ord(c)) for c in controls if unsafe_reason(f"a{c}b") is None]
    assert accepted == []


# -- property: whatever is accepted maps under the root --------------------------------

rel_st = st.text(
    alphabet=st.sampled_from(["a", "b", ".", "/", " ", "\0", "\n", "é", "\udcff", "~", "\\"]),
    max_size=12,
)


@settings(max_examples=200)
@given(rel=rel_st)
def test_accepted_paths_stay_under_the_root(rel: str) -> None:
    reason = unsafe_reason(rel)
    if reason is not None:
        with pytest.raises(ValueError):
            host_path(ROOT, rel)
        return
    result = host_path(ROOT, rel)
    assert result.is_relative_to(ROOT)
    assert result != ROOT
    assert os.path.normpath(result) == str(result)  # no '..' or '.' left to resolve
    assert result.relative_to(ROOT).as_posix() == rel


@settings(max_examples=200)
@given(parts=st.lists(st.sampled_from(["a", "..", ".", "", "b c", "ü"]), min_size=1, max_size=5))
def test_a_path_is_refused_iff_a_component_is_dangerous(parts: list[str]) -> None:
    rel = "/".join(parts)
    dangerous = any(p in ("", ".", "..") for p in parts)
    assert (unsafe_reason(rel) is not None) == dangerous


# -- the regex-free fast path is the rule, not a second one ----------------------------


@settings(max_examples=500)
@given(rel=st.text(alphabet=st.sampled_from(["a", ".", "/", " ", "\n", "\x00", "\x7f", "\x85",
                                             "é", "~"]), max_size=10))
def test_plain_name_is_the_rule_for_printable_ascii_and_false_for_the_rest(rel: str) -> None:
    # What ``unsafe_reason`` returns at once must be what the expressions would find.
    if rel.isascii() and rel.isprintable():
        assert plain_name(rel) == (re.search(STRUCTURE, rel) is None)
    else:
        assert not plain_name(rel)


@pytest.mark.parametrize("rel", [*ESCAPING, *EMPTY_COMPONENTS, ".", "..", "./", "a/.", "a/.."])
def test_plain_name_refuses_every_unsafe_shape(rel: str) -> None:
    assert not plain_name(rel)


@pytest.mark.parametrize("rel", [r for r in SAFE if r.isascii()])
def test_plain_name_passes_the_safe_ascii_names(rel: str) -> None:
    assert plain_name(rel)
