"""The exclusion rule (``ExcludeRule`` / ``tree.ignore.Matcher``) and the walk that applies it."""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from gitoracle import GitOracle
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from filesync.core.exclude import DEFAULT_EXCLUDED_DIRS, IGNORE_FILE, ExcludeRule
from filesync.errors import PatternError, UsageError
from filesync.tree.ignore import Matcher
from filesync.tree.walk import walk
from filesync.tree.wire import describe, parse_reason

#: The default set, spelled out here so that dropping or renaming one is caught.
EXPECTED_DEFAULTS = (
    ".git", ".github", ".hub", ".archive", ".curator_backups", ".locks",
    ".venv", "venv", "node_modules", "site-packages", "__pycache__",
    ".tox", ".nox", ".pytest_cache", ".mypy_cache", ".ruff_cache",
)  # fmt: skip

#: Skill content directories that must never be caught by the defaults.
CONTENT_DIRS = ("scripts", "references", "templates", "assets")


def dead_pid() -> int:
    """A pid no process can have: one above the kernel's maximum."""
    return int(Path("/proc/sys/kernel/pid_max").read_text()) + 1


# -- default directory names ---------------------------------------------------------


def test_default_set_is_exactly_the_sixteen_names() -> None:
    assert len(EXPECTED_DEFAULTS) == 16
    assert set(DEFAULT_EXCLUDED_DIRS) == set(EXPECTED_DEFAULTS)
    assert ExcludeRule.build().dir_names == DEFAULT_EXCLUDED_DIRS


@pytest.mark.parametrize("name", EXPECTED_DEFAULTS)
@pytest.mark.parametrize("parent", ["", "skill/", "a/b/c/"])
def test_default_dir_is_pruned_at_any_depth(name: str, parent: str) -> None:
    rule = ExcludeRule.build()
    assert rule.excluded(parent + name, True)
    # and everything beneath it, files and dirs alike
    assert rule.excluded(f"{parent}{name}/x.py", False)
    assert rule.excluded(f"{parent}{name}/deep/er/x.py", False)
    assert rule.excluded(f"{parent}{name}/deep", True)


@pytest.mark.parametrize("name", EXPECTED_DEFAULTS)
@pytest.mark.parametrize("parent", ["", "skill/"])
def test_default_name_as_a_file_is_not_excluded(name: str, parent: str) -> None:
    rule = ExcludeRule.build()
    assert not rule.excluded(parent + name, False)
    assert not rule.matcher().matches(parent + name, False)


@pytest.mark.parametrize("name", CONTENT_DIRS)
def test_content_dirs_are_not_excluded(name: str) -> None:
    rule = ExcludeRule.build()
    assert not rule.excluded(name, True)
    assert not rule.excluded(f"skill/{name}", True)
    assert not rule.excluded(f"skill/{name}/run.sh", False)


@pytest.mark.parametrize("name", ["node_modules_old", "my.git", "venv2", "x__pycache__"])
def test_default_names_match_whole_components_only(name: str) -> None:
    rule = ExcludeRule.build()
    assert not rule.excluded(name, True)
    assert not rule.excluded(f"a/{name}/f", False)


def test_no_default_excludes_drops_the_default_set() -> None:
    rule = ExcludeRule.build(default_excludes=False)
    assert rule.dir_names == ()
    for name in EXPECTED_DEFAULTS:
        assert not rule.excluded(name, True)
        assert not rule.excluded(f"a/{name}/x", False)


def test_no_default_excludes_keeps_user_patterns() -> None:
    rule = ExcludeRule.build(["*.log"], default_excludes=False)
    assert rule.excluded("x.log", False)
    assert not rule.excluded("node_modules", True)


# -- gitignore patterns --------------------------------------------------------------


def rule_of(*patterns: str) -> ExcludeRule:
    return ExcludeRule.build(patterns, default_excludes=False)


def test_glob_pattern_matches_at_any_depth() -> None:
    rule = rule_of("*.log")
    assert rule.excluded("x.log", False)
    assert rule.excluded("a/b/x.log", False)
    assert not rule.excluded("x.log.txt", False)
    assert not rule.excluded("xlog", False)


def test_negation_reincludes_a_file() -> None:
    rule = rule_of("*.log", "!keep.log")
    assert rule.excluded("x.log", False)
    assert not rule.excluded("keep.log", False)
    assert not rule.excluded("a/keep.log", False)


def test_negation_order_matters() -> None:
    # a later pattern overrides an earlier one
    rule = rule_of("!keep.log", "*.log")
    assert rule.excluded("keep.log", False)


def test_negation_cannot_reinclude_under_an_excluded_dir() -> None:
    rule = rule_of("build/", "!build/keep.log")
    assert rule.excluded("build/keep.log", False)


def test_dir_only_pattern_matches_dirs_not_files() -> None:
    rule = rule_of("build/")
    assert rule.excluded("build", True)
    assert rule.excluded("src/build", True)
    assert not rule.excluded("build", False)
    assert not rule.excluded("src/build", False)
    assert rule.excluded("build/out.o", False)
    assert rule.excluded("src/build/deep/out.o", False)


def test_anchored_pattern_matches_only_at_the_root() -> None:
    rule = rule_of("/top")
    assert rule.excluded("top", False)
    assert rule.excluded("top", True)
    assert rule.excluded("top/inner.txt", False)
    assert not rule.excluded("a/top", False)
    assert not rule.excluded("a/top", True)
    assert not rule.excluded("topper", False)


def test_double_star_in_the_middle() -> None:
    rule = rule_of("a/**/b")
    assert rule.excluded("a/b", False)
    assert rule.excluded("a/x/b", False)
    assert rule.excluded("a/x/y/b", True)
    assert rule.excluded("a/x/b/inside", False)  # via the parent dir a/x/b
    assert not rule.excluded("c/a/b", False)
    assert not rule.excluded("a/bb", False)
    assert not rule.excluded("a", True)


def test_matches_is_flat_and_excluded_adds_parents() -> None:
    rule = ExcludeRule.build(["/gen/"])
    m = rule.matcher()
    # default names: the flat check looks at the last component only
    assert not m.matches("node_modules/x.js", False)
    assert rule.excluded("node_modules/x.js", False)
    assert not m.matches("a/.git/b/c", True)
    assert rule.excluded("a/.git/b/c", True)
    # an anchored dir pattern excludes everything beneath it, but only at the root
    assert rule.excluded("gen/a/b/c.txt", False)
    assert not rule.excluded("x/gen/c.txt", False)


def test_ignore_file_at_root_is_read(tmp_path: Path) -> None:
    (tmp_path / IGNORE_FILE).write_text(
        "# a comment\n\n*.log\n   \n!keep.log\n  # indented comment\ncache/\n", encoding="utf-8"
    )
    rule = ExcludeRule.build(["*.bak"], root=tmp_path)
    assert rule.patterns == ("*.bak", "*.log", "!keep.log", "cache/")
    assert rule.excluded("x.log", False)
    assert rule.excluded("x.bak", False)
    assert not rule.excluded("keep.log", False)
    assert rule.excluded("a/cache", True)
    assert not rule.excluded("# a comment", False)
    assert not rule.excluded("x.txt", False)
    # defaults still apply alongside the file
    assert rule.excluded("node_modules", True)


def test_ignore_file_is_not_read_without_root(tmp_path: Path) -> None:
    (tmp_path / IGNORE_FILE).write_text("*.log\n", encoding="utf-8")
    assert not ExcludeRule.build().excluded("x.log", False)


def test_ignore_file_absent_is_fine(tmp_path: Path) -> None:
    rule = ExcludeRule.build(root=tmp_path)
    assert rule.patterns == ()
    assert not rule.excluded("x.log", False)


def test_comment_only_patterns_compile_to_nothing() -> None:
    rule = ExcludeRule.build(["# nothing", "   ", ""], default_excludes=False)
    assert rule.patterns == ()
    assert rule.wire() == {"names": [], "rules": []}


def test_wire_round_trip_gives_the_same_matcher() -> None:
    rule = ExcludeRule.build(["*.log", "!keep.log", "build/", "/top", "a/**/b"])
    wire = rule.wire()
    assert len(wire["rules"]) == len(rule.patterns)  # one compiled rule per line travels
    remote = Matcher(wire["names"], json.loads(json.dumps(wire["rules"])))
    for rel, is_dir in [
        ("x.log", False), ("keep.log", False), ("build", True), ("build", False),
        ("top", False), ("a/top", False), ("a/q/b", False), ("node_modules", True),
        ("s/.git/config", False), ("plain.txt", False),
    ]:  # fmt: skip
        assert remote.excluded(rel, is_dir) == rule.excluded(rel, is_dir), rel


# -- reading pattern lines and refusing invalid ones -------------------------------------


def test_ignore_file_is_split_as_git_splits_it(tmp_path: Path) -> None:
    # A BOM, CRLF line ends, a last line without one; "\t" is a pattern, as in git.
    (tmp_path / IGNORE_FILE).write_bytes("\ufeff*.log\r\n\r\n#c\r\n\t\nü.md".encode())
    rule = ExcludeRule.build(root=tmp_path, default_excludes=False)
    assert rule.patterns == ("*.log", "\t", "ü.md")
    assert rule.excluded("x.log", False) and rule.excluded("a/ü.md", False)
    assert rule.excluded("\t", False)


def test_ignore_file_that_is_not_utf8_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / IGNORE_FILE).write_bytes(b"ok\n\xff\n")
    with pytest.raises(UsageError, match=r"\.filesyncignore is not UTF-8.*save it as UTF-8"):
        ExcludeRule.build(root=tmp_path)


@pytest.mark.parametrize(("line", "why"), [
    ("[z-a]", "range z-a is reversed"),
    ("x/*.[9-0]", "range 9-0 is reversed"),
    ("[ü-a]", "reversed"),
    ("[abc", "never closed"),
    ("a[[:alpha:]", "never closed"),
    ("[[:letter:]]", r"\[:letter:\] is not a class"),
    ("a\\", "lone"),
    ("!a\\/", "lone"),
])  # fmt: skip
def test_invalid_pattern_is_refused_naming_it(line: str, why: str) -> None:
    with pytest.raises(PatternError, match=why) as caught:
        ExcludeRule.build(["ok", line])
    assert caught.value.exit_code == 2 and isinstance(caught.value, UsageError)
    assert f"'{line}' from --exclude is invalid" in caught.value.message
    assert "\n" not in caught.value.message


@pytest.mark.parametrize("line", ["\\[z-a]", "[a-z]", "[]]", "[!]]", "[a-]", "[[:x]", "\\\\",
                                  "a\\ ", "[\\]]"])
def test_lookalikes_of_invalid_patterns_are_taken(line: str) -> None:
    assert ExcludeRule.build([line]).patterns == (line,)


def test_invalid_pattern_names_its_source(tmp_path: Path) -> None:
    with pytest.raises(PatternError, match=r"from cfg \(mapping 2\) is invalid"):
        ExcludeRule.build(["a"], more=[("cfg (mapping 1)", ["b"]), ("cfg (mapping 2)", ["[b"])])
    (tmp_path / IGNORE_FILE).write_text("# one\n\n*.log\n[b-a]\n", encoding="utf-8")
    with pytest.raises(PatternError, match=rf"from {tmp_path / IGNORE_FILE}:4 is invalid"):
        ExcludeRule.build(["a"], root=tmp_path)
    with pytest.raises(PatternError, match="from SSHTerminal is invalid"):
        ExcludeRule.build(["[b-a]"], source="SSHTerminal")


def test_sources_are_read_in_order_last_line_wins(tmp_path: Path) -> None:
    (tmp_path / IGNORE_FILE).write_text("!c.log\n", encoding="utf-8")
    rule = ExcludeRule.build(["*.log", "!b.log"], more=[("cfg", ["b.log", "!a.log"])],
                             root=tmp_path, default_excludes=False)
    assert rule.patterns == ("*.log", "!b.log", "b.log", "!a.log", "!c.log")
    assert [rule.excluded(f"{n}.log", False) for n in "abcd"] == [False, True, False, True]


# -- property: the Matcher agrees with git ----------------------------------------------

PATTERN_POOL = (
    "*.log", "!keep.log", "!*.log", "build/", "!build/", "/top", "a/**/b", "a", "!a",
    "a/", "!a/", "b/", "!b", "*.tmp", "a/b", "/a/b", "**/b", "**/a/", "a/*", "!a/*",
    "a/**", "!a/**", "b*", "!b*", "c", "/c/", "!c/", "c/*.log", "**/keep.log", "top/",
)  # fmt: skip
NAMES = ("a", "b", "c", "build", "top", "keep.log", "x.log", "a.tmp", "node_modules")

patterns_st = st.lists(st.sampled_from(PATTERN_POOL), min_size=1, max_size=5)
rel_st = st.lists(st.sampled_from(NAMES), min_size=1, max_size=4).map("/".join)


@pytest.fixture(scope="module")
def git(tmp_path_factory: pytest.TempPathFactory) -> GitOracle:
    return GitOracle(tmp_path_factory.mktemp("git-oracle"))


def git_ignores(git: GitOracle, patterns: list[str], rel: str, is_dir: bool) -> list[bool]:
    """git's answer (``check-ignore``, parents counted) for each prefix of ``rel``, the
    prefixes as directories and ``rel`` itself as a directory or a file."""
    tree = Path(tempfile.mkdtemp(prefix="fs-git-"))
    try:
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        if is_dir:
            (tree / rel).mkdir()
        else:
            (tree / rel).write_bytes(b"x")
        (tree / ".gitignore").write_text("".join(p + "\n" for p in patterns), encoding="utf-8")
        parts = rel.split("/")
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        ignored = git.ignored(tree, prefixes)
        return [p in ignored for p in prefixes]
    finally:
        shutil.rmtree(tree)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(patterns=patterns_st, rel=rel_st, is_dir=st.booleans())
def test_matches_agrees_with_git(
    git: GitOracle, patterns: list[str], rel: str, is_dir: bool
) -> None:
    rule = ExcludeRule.build(patterns, default_excludes=False)
    *parents, itself = git_ignores(git, patterns, rel, is_dir)
    assert rule.excluded(rel, is_dir) == itself
    if not any(parents):  # then git's answer is the path's own
        assert rule.matcher().matches(rel, is_dir) == itself


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(patterns=patterns_st, rel=rel_st, is_dir=st.booleans(), defaults=st.booleans())
def test_excluded_is_any_prefix_dir_or_the_path(
    git: GitOracle, patterns: list[str], rel: str, is_dir: bool, defaults: bool
) -> None:
    rule = ExcludeRule.build(patterns, default_excludes=defaults)
    names = set(EXPECTED_DEFAULTS) if defaults else set()
    parts = rel.split("/")
    dirs = parts if is_dir else parts[:-1]
    expected = any(name in names for name in dirs) or git_ignores(git, patterns, rel, is_dir)[-1]
    assert rule.excluded(rel, is_dir) == expected


# Cases checked against `git check-ignore` (git 2.x) where pathspec 1.x's default
# reverse evaluation (the evaluator filesync once used) answers differently.
GIT_VERIFIED = [
    (["!x/**", "x/"], "x", True, True),
    (["!x/**", "x/"], "x/f", False, True),
    (["!*.log", "b/"], "b/x.log", False, True),
    (["!a/**", "**/a/"], "a", True, True),
    (["!a/**", "**/a/"], "a/x.log", False, True),
    (["*.log", "!keep.log"], "d/keep.log", False, False),
]


@pytest.mark.parametrize(("patterns", "rel", "is_dir", "git_says"), GIT_VERIFIED)
def test_agrees_with_git_where_pathspec_reverse_does_not(
    patterns: list[str], rel: str, is_dir: bool, git_says: bool
) -> None:
    assert rule_of(*patterns).excluded(rel, is_dir) is git_says


# -- the walk -------------------------------------------------------------------------


def make_files(root: Path, *rels: str) -> None:
    for rel in rels:
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(rel, encoding="utf-8")


def listed(root: Path, rule: ExcludeRule) -> tuple[set[str], dict[str, str], int]:
    entries, skipped, excluded = walk(str(root), rule.matcher())
    # The walk gives codes; the texts asserted below are derived from them.
    return ({e[0] for e in entries}, {p: describe(parse_reason(c), d) for p, c, d in skipped},
            excluded)


@pytest.fixture
def scandir_log(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every directory the walk opens."""
    seen: list[str] = []
    real: Callable[..., Any] = os.scandir

    def recording(path: Any = ".") -> Any:
        # The walk lists directories it opened itself: name them by their descriptor.
        seen.append(os.readlink(f"/proc/self/fd/{path}") if isinstance(path, int)
                    else os.fspath(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", recording)
    yield seen


def test_walk_never_descends_into_excluded_dirs(tmp_path: Path, scandir_log: list[str]) -> None:
    make_files(
        tmp_path,
        "skill/SKILL.md",
        "skill/scripts/run.sh",
        "skill/node_modules/pkg/index.js",
        "node_modules/top.js",
        ".git/config",
        "skill/build/out.o",
        "skill/assets/logo.svg",
    )
    # A stale temp file inside a pruned dir: a walk that descended would delete it.
    stale = tmp_path / "node_modules" / f".filesync.{dead_pid()}.1.tmp"
    stale.write_bytes(b"x")
    rule = ExcludeRule.build(["build/"])
    files, skipped, excluded = listed(tmp_path, rule)
    assert files == {"skill/SKILL.md", "skill/scripts/run.sh", "skill/assets/logo.svg"}
    assert skipped == {}
    assert excluded == 4  # skill/node_modules, node_modules, .git, skill/build
    assert stale.exists()
    opened = {os.path.relpath(p, tmp_path) for p in scandir_log}
    assert opened == {".", "skill", "skill/scripts", "skill/assets"}


def test_walk_counts_excluded_files(tmp_path: Path) -> None:
    make_files(tmp_path, "a.log", "b.txt", "d/c.log", "d/keep.log")
    files, _, excluded = listed(tmp_path, rule_of("*.log", "!keep.log"))
    assert files == {"b.txt", "d/keep.log"}
    assert excluded == 2


def test_walk_lists_a_file_named_like_a_default_dir(tmp_path: Path) -> None:
    make_files(tmp_path, "node_modules", "sub/.git")
    files, _, excluded = listed(tmp_path, ExcludeRule.build())
    assert files == {"node_modules", "sub/.git"}
    assert excluded == 0


def test_walk_entry_fields(tmp_path: Path) -> None:
    make_files(tmp_path, "x.sh")
    p = tmp_path / "x.sh"
    p.chmod(0o751)
    os.utime(p, ns=(1_000_000_123, 1_600_000_000_123_456_789))
    entries, _, _ = walk(str(tmp_path), rule_of().matcher())
    st_ = p.stat()
    assert entries == [["x.sh", "f", st_.st_size, 1_600_000_000_123_456_789, 0o751, st_.st_ino, 1]]


def test_walk_reports_symlinks_and_specials_and_never_follows(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    make_files(outside, "secret.txt", "sub/deep.txt")
    root = tmp_path / "root"
    make_files(root, "real.txt")
    (root / "dirlink").symlink_to(outside, target_is_directory=True)
    (root / "filelink").symlink_to(outside / "secret.txt")
    (root / "dangling").symlink_to(tmp_path / "nowhere")
    os.mkfifo(root / "fifo")
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(root / "sock"))
        files, skipped, excluded = listed(root, rule_of())
    finally:
        sock.close()
    assert files == {"real.txt"}
    assert skipped == {
        "dirlink": "symlink (not followed)",
        "filelink": "symlink (not followed)",
        "dangling": "symlink (not followed)",
        "fifo": "special file (fifo, socket or device)",
        "sock": "special file (fifo, socket or device)",
    }
    assert excluded == 0


def test_walk_does_not_follow_a_symlink_named_like_a_default_dir(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    make_files(outside, "x.js")
    root = tmp_path / "root"
    root.mkdir()
    (root / "node_modules").symlink_to(outside, target_is_directory=True)
    files, skipped, _ = listed(root, ExcludeRule.build())
    assert files == set()
    assert skipped == {"node_modules": "symlink (not followed)"}


def test_walk_removes_stale_temp_files_and_keeps_live_ones(tmp_path: Path) -> None:
    make_files(tmp_path, "keep.txt", "d/keep2.txt")
    dead = dead_pid()
    stale_top = tmp_path / f".filesync.{dead}.1.tmp"
    stale_nested = tmp_path / "d" / f".filesync.{dead}.27.tmp"
    live = tmp_path / f".filesync.{os.getpid()}.3.tmp"
    not_temp = tmp_path / f".filesync.{dead}.tmp"  # no counter: an ordinary name
    for p in (stale_top, stale_nested, live, not_temp):
        p.write_bytes(b"partial")
    files, skipped, _ = listed(tmp_path, rule_of())
    assert not stale_top.exists()
    assert not stale_nested.exists()
    assert live.exists()
    # temp files are never listed, live or not
    assert files == {"keep.txt", "d/keep2.txt", not_temp.name}
    assert skipped == {}


# -- property: the walk lists exactly the non-excluded files ---------------------------

tree_st = st.lists(st.lists(st.sampled_from(NAMES), min_size=1, max_size=3), max_size=10)


@settings(
    max_examples=60, deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    tree=tree_st,
    patterns=st.lists(st.sampled_from(PATTERN_POOL), max_size=4),
    defaults=st.booleans(),
)
def test_walk_lists_exactly_the_files_not_excluded(
    tree: list[list[str]], patterns: list[str], defaults: bool
) -> None:
    rule = ExcludeRule.build(patterns, default_excludes=defaults)
    root = Path(tempfile.mkdtemp(prefix="fs-walk-"))
    try:
        for parts in tree:
            p = root.joinpath(*parts)
            try:
                p.parent.mkdir(parents=True, exist_ok=True)
                if not p.exists():
                    p.write_bytes(b"x")
            except (FileExistsError, NotADirectoryError):
                continue  # a file is already where a dir was wanted
        all_files: set[str] = set()
        pruned = 0
        for dirpath, dirnames, filenames in os.walk(root):
            rel_dir = os.path.relpath(dirpath, root)
            prefix = "" if rel_dir == "." else rel_dir + "/"
            for name in list(dirnames):
                if rule.excluded(prefix + name, True):
                    pruned += 1
                    dirnames.remove(name)
            for name in filenames:
                if rule.excluded(prefix + name, False):
                    pruned += 1
                else:
                    all_files.add(prefix + name)
        files, skipped, excluded = listed(root, rule)
        assert files == all_files
        assert skipped == {}
        assert excluded == pruned
    finally:
        shutil.rmtree(root)
