"""Comments say why, not how fast: no ``#`` comment in ``filesync/`` carries a timing.

Figures that decided how code is shaped live in ``docs/benchmarks.md`` ("Why the code is
shaped this way"); a comment keeps only the reason. Read from the tokens of every module,
so a string that merely contains ``#`` is no comment.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "filesync"

#: A number with a unit of time or a speed ratio: "12 ms", "~0.3 s", "2x", 1.5 and the
#: multiplication sign, "4 times slower".
TIMING = re.compile(
    r"(?<![\w.])~?\d+(?:[.,_]\d+)*\s*(?:ms|µs|us|ns|s|sec|secs|seconds|min|minutes?)(?!\w)"
    r"|(?<![\w.])~?\d+(?:[.,]\d+)*\s*[x\u00d7](?!\w)"
    r"|\b(?:\d+|twice|three|four|five|ten)\s+(?:times\s+)?(?:as\s+)?(?:faster|slower)\b",
    re.IGNORECASE,
)

#: (path relative to filesync/, text of the comment) allowed to name a time: none yet.
ALLOWED: set[tuple[str, str]] = set()


def _timed_comments() -> list[str]:
    found = []
    for path in sorted(PKG.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type != tokenize.COMMENT or not TIMING.search(tok.string):
                continue
            rel = path.relative_to(PKG).as_posix()
            if (rel, tok.string.strip()) not in ALLOWED:
                found.append(f"{rel}:{tok.start[0]}: {tok.string.strip()}")
    return found


def test_no_comment_carries_a_timing() -> None:
    assert _timed_comments() == []


@pytest.mark.parametrize("text", [
    "# a Python loop took ~40 ms", "# about 0.4 s of rows", "# 300 µs a file",
    "# ~2x slower", "# 1.5\u00d7 the time", "# 4 times slower", "# twice as fast? no: 2 x faster",
    "# 12 seconds", "# 31-47 s one fsync at a time",
])
def test_the_pattern_finds_timings(text: str) -> None:
    assert TIMING.search(text)


@pytest.mark.parametrize("text", [
    "# the 2 sides agree", "# mode & 0o777", "# 100k-file trees", "# 0x1f marks the end",
    "# RACY_NS after the mtime", "# a 7 MB listing", "# the last 3 runs",
    "# OpenSSH 9.x servers",
])
def test_the_pattern_leaves_other_numbers_alone(text: str) -> None:
    assert not TIMING.search(text)
