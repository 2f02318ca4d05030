"""The exclusion evaluator agrees with git: random trees and pattern lists, git as the oracle.

Each case writes the pattern lines to the tree's ``.gitignore``, asks
``git ls-files --others --exclude-standard`` which files git keeps, and compares that with
what filesync's walk lists under ``ExcludeRule.build(lines, default_excludes=False)`` and
with ``ExcludeRule.excluded`` for every file of the tree.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from gitoracle import GitOracle, make_tree, write_gitignore
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from filesync.core.exclude import ExcludeRule
from filesync.tree.walk import walk


@pytest.fixture(scope="module")
def oracle(tmp_path_factory: pytest.TempPathFactory) -> GitOracle:
    return GitOracle(tmp_path_factory.mktemp("git-oracle"))


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("trees")


def check(oracle: GitOracle, scratch: Path, lines: list[str],
          paths: list[tuple[str, ...]]) -> None:
    """filesync's walk and ``excluded`` keep exactly the files git keeps."""
    tree = Path(tempfile.mkdtemp(dir=scratch))
    try:
        files = make_tree(tree, paths)
        write_gitignore(tree, lines)
        git_kept = oracle.kept_files(tree)
        rule = ExcludeRule.build(lines, default_excludes=False)
        entries, skipped, _ = walk(str(tree), rule.matcher())
        walked = {row[0] for row in entries} - {".gitignore"}
        assert skipped == []
        assert walked == git_kept, (lines, sorted(files))
        assert {rel for rel in files if not rule.excluded(rel, False)} == git_kept, lines
    finally:
        shutil.rmtree(tree)


# -- the issue's examples and git's corner cases, checked one by one -----------------------

EXPLICIT = [
    # A negation re-including an ancestor directory never re-includes what other
    # patterns exclude below it (the reported bug: filesync pushed these).
    (["*.log.d", "!keep"], [("keep", "x.log.d", "f"), ("keep", "g")]),
    (["**/sub/", "!ü.md"], [("x.log", "ü.md", "sub", "b"), ("x.log", "ü.md", "c")]),
    (["b/", "!ü.md"], [("ü.md", "b", "a", "a"), ("ü.md", "c")]),
    # Nothing below an excluded directory is re-included.
    (["build/", "!build/keep.log"], [("build", "keep.log"), ("src", "build", "x")]),
    (["a/*", "!a/b", "a/b/*", "!a/b/c"], [("a", "b", "c"), ("a", "b", "d"), ("a", "e")]),
    # Bytes, not characters: '?' is one byte and 'ü' two.
    (["?.md"], [("ü.md",), ("a.md",)]),
    (["??.md"], [("ü.md",), ("a.md",)]),
    (["[ü][ü].md"], [("ü.md",), ("a.md",)]),
    # The first wildcard of an anchored pattern is "at the start" (git's literal prefix).
    (["x/a**/b"], [("x", "ab"), ("x", "a", "b"), ("x", "ay", "z", "b"), ("x", "ayb")]),
    (["x/a/**"], [("x", "a", "b"), ("x", "a", "c", "d"), ("x", "ab")]),
    (["**/a/**/b"], [("a", "b"), ("q", "a", "r", "s", "b"), ("ab",)]),
    (["a**b", "c/**d"], [("ab",), ("axb",), ("c", "d"), ("c", "xd"), ("c", "e", "d")]),
    # Trailing spaces, escapes, comments, negation marks taken literally.
    (["a ", "b\\ ", "\\#c", "\\!d", "#e", "e\\*"],
     [("a",), ("b ",), ("#c",), ("!d",), ("#e",), ("e*",), ("ex",)]),
    # Classes: ranges, negation, ']' first, '-' last, POSIX names, '[' without ':'.
    (["[a-c]x", "[!a]y", "[^b]z", "[]q]w", "[p-]v", "[[:digit:]]u", "[[:x]t"],
     [("bx",), ("dx",), ("ay",), ("by",), ("bz",), ("cz",), ("]w",), ("qw",),
      ("-v",), ("pv",), ("7u",), ("xu",), ("[t",), (":t",), ("xt",)]),
    # Directory-only patterns, anchored and not.
    (["d/", "/e/", "f/g/"], [("d",), ("x", "d", "1"), ("e", "1"), ("x", "e", "1"),
                             ("f", "g", "1"), ("x", "f", "g", "1")]),
    (["*", "!*/", "!*.md"], [("a.md",), ("b.txt",), ("s", "c.md"), ("s", "d.txt")]),
    # Where pathspec's own reading differs from git's (filesync.core.gitignore mends it):
    # a negated "#", a trailing tab, "a/**/" (only directories below a), "**/" alone.
    (["*", "!*/", "!#c"], [("#c",), ("d",), ("s", "#c"), ("s", "e")]),
    (["a\t", "b "], [("a\t",), ("a",), ("b",), ("b ",)]),
    (["a/**/"], [("a", "f"), ("a", "b", "f"), ("c", "a", "b", "f")]),
    (["**/", "!x"], [("f",), ("x", "f"), ("y", "f")]),
    (["[!a]b", "x/[[:upper:]]?"], [("a", "b"), ("cb",), ("ab",), ("x", "Ay"), ("x", "ay")]),
]


@pytest.mark.parametrize(("lines", "paths"), EXPLICIT)
def test_explicit_cases_agree_with_git(
    oracle: GitOracle, scratch: Path, lines: list[str], paths: list[tuple[str, ...]]
) -> None:
    check(oracle, scratch, lines, paths)


def test_the_issue_examples_are_excluded() -> None:
    """The three reported paths, each ignored by git (see EXPLICIT), are excluded."""
    for lines, rel in [
        (["*.log.d", "!keep"], "keep/x.log.d/f"),
        (["**/sub/", "!ü.md"], "x.log/ü.md/sub/b"),
        (["b/", "!ü.md"], "ü.md/b/a/a"),
    ]:
        assert ExcludeRule.build(lines, default_excludes=False).excluded(rel, False), lines


# -- property: random trees and pattern lists ----------------------------------------------

#: Names of the generated trees: a few common ones (repeated: drawn more often, so that
#: trees share names with each other and with the patterns), unicode, spaces, pattern
#: characters and lookalikes.
COMMON = ("a", "b", "keep", "sub", "x.log", "ü.md")
NAMES = COMMON * 4 + ("x.log.d", "a b", "#c", "!k", "[x]", "Ab", "aü", "b\\c", "e*", "d ")

#: Pieces of a path segment in a pattern.
PIECES = COMMON * 2 + (
    "x", "log", ".log", ".d", "ü", ".md", " ", "c", "k", "*", "*", "*", "?", "**", "[ab]",
    "[!a]", "[^ü]", "[a-c]", "[[:alpha:]]", "[]x]", "[ü]", "\\*", "\\!", "\\#", "\\[x]",
    "\\ ", "\\\\", ".",
)  # fmt: skip

segment_st = st.lists(st.sampled_from(PIECES), min_size=1, max_size=3).map("".join)


@st.composite
def pattern_st(draw: st.DrawFn) -> str:
    """One line without its negation mark."""
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return draw(st.sampled_from(["", "   ", "# a comment", "#!a", "/"]))
    if kind <= 5:  # a name of the tree or a broad glob: lines that hit
        core = draw(st.sampled_from((*NAMES, "*", "*.log", "*.md", "**", "*/*", "a*", "?")))
        return (draw(st.sampled_from(["", "", "/", "**/"])) + core
                + draw(st.sampled_from(["", "", "/", "/**", "/*"])))
    segments = draw(st.lists(segment_st, min_size=1, max_size=3))
    return (draw(st.sampled_from(["", "", "/"])) + "/".join(segments)
            + draw(st.sampled_from(["", "", "/"])) + draw(st.sampled_from(["", "", "  "])))


@st.composite
def lines_st(draw: st.DrawFn) -> list[str]:
    """A pattern list whose later lines are often negations of what came before."""
    lines = draw(st.lists(pattern_st(), min_size=1, max_size=6))
    marks = draw(st.lists(st.sampled_from(["", "", "!"]), min_size=len(lines),
                          max_size=len(lines)))
    return [lines[0]] + [m + line for m, line in zip(marks[1:], lines[1:], strict=True)]


paths_st = st.lists(st.lists(st.sampled_from(NAMES), min_size=1, max_size=4).map(tuple),
                    min_size=4, max_size=12)


@settings(max_examples=180, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(lines=lines_st(), paths=paths_st)
def test_walk_keeps_exactly_what_git_keeps(
    oracle: GitOracle, scratch: Path, lines: list[str], paths: list[tuple[str, ...]]
) -> None:
    check(oracle, scratch, lines, paths)

