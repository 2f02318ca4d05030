"""The exclusion evaluator: pruned directory names plus gitignore patterns, read as git reads them.

Guarantee: for pattern lines as they would stand in a root ``.gitignore``,
``Matcher.excluded`` answers what git answers (``git ls-files --others --exclude-standard``
lists exactly the files it does not exclude); tests/tree/test_ignore_git_oracle.py checks
this against git itself on random trees and patterns. The rules, after git's dir.c and
wildmatch.c:

- ``split_lines`` splits a file at ``\\n`` (one trailing ``\\r`` dropped, a leading BOM
  skipped). A line that is empty once its unescaped trailing spaces are dropped is blank;
  a line starting with ``#`` is a comment. One deliberate difference: a ``#`` after
  leading blanks also starts a comment here (git would take ``  #x`` as a pattern for a
  name starting with two spaces); write ``\\#`` for a literal ``#`` either way.
- ``!`` negates; a trailing ``/`` restricts the pattern to directories. A pattern with no
  other ``/`` matches the last component at any depth; with one (a leading ``/`` just
  anchors) it matches the whole path from the root.
- ``*`` is any run of bytes but ``/``, ``?`` one byte but ``/``, ``[...]`` one byte of a
  class (ranges, ``!``/``^`` negation, ``[:alpha:]`` and its siblings, ASCII only),
  ``\\x`` a literal ``x``. A run of stars at the start or after ``/`` that ends the pattern
  or precedes ``/`` is ``**``: ``**/`` is any number of directories (none included), a
  trailing ``**`` everything below. Like git, an anchored pattern's first wildcard counts
  as at the start (git compares the literal part before it on its own), so ``x/a**/b``
  matches ``x/ab`` and ``x/ay/z/b``. Elsewhere a run of stars is one ``*``.
- Matching is on the UTF-8 bytes of a path, as git's is: ``?`` is one byte, so ``ü``
  (two bytes) takes ``??``.
- A pattern matches a path itself, never as one of its descendants. A path is excluded iff
  one of its parent directories is (nothing below an excluded directory is re-included,
  whatever negation follows) or the last pattern matching the path itself is not a
  negation. A directory whose name is in ``names`` is excluded at any depth.

Refused, not followed: where git quietly reads a pattern as something else or never
matches it (a reversed range such as ``[z-a]``, of which git matches only the ``z``;
an unclosed ``[``, an unknown ``[:class:]`` or a lone trailing ``\\``, with which the
pattern never matches), ``compile_pattern`` raises ``InvalidPattern``: a typo must not
silently sync what it was meant to exclude.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

#: One compiled line: (negation, directories only, on the last component, fullmatch).
Rule = tuple[bool, bool, bool, Callable[[bytes], object]]

_STAR, _QUESTION, _OPEN, _CLOSE, _BACKSLASH, _SLASH = b"*?[]\\/"
_BANG, _CARET, _DASH, _COLON = b"!^-:"
_SPECIAL = frozenset(b"*?[\\")


def _bytes(*ranges: tuple[int, int]) -> frozenset[int]:
    return frozenset(c for lo, hi in ranges for c in range(lo, hi + 1))


_DIGIT, _UPPER, _LOWER = _bytes((48, 57)), _bytes((65, 90)), _bytes((97, 122))
#: git's own ASCII classes (its ctype table: "space" is \t \n \r and blank, not \v \f).
_CLASSES: dict[bytes, frozenset[int]] = {
    b"alnum": _DIGIT | _UPPER | _LOWER,
    b"alpha": _UPPER | _LOWER,
    b"blank": frozenset(b" \t"),
    b"cntrl": _bytes((0, 31), (127, 127)),
    b"digit": _DIGIT,
    b"graph": _bytes((33, 126)),
    b"lower": _LOWER,
    b"print": _bytes((32, 126)),
    b"punct": _bytes((33, 47), (58, 64), (91, 96), (123, 126)),
    b"space": frozenset(b"\t\n\r "),
    b"upper": _UPPER,
    b"xdigit": _DIGIT | _bytes((65, 70), (97, 102)),
}


class InvalidPattern(ValueError):
    """A pattern git would quietly misread or never match; ``index`` is its place in the
    list given to ``Matcher`` (-1 from ``compile_pattern``)."""

    def __init__(self, line: str, reason: str, index: int = -1) -> None:
        super().__init__(f"{line!r}: {reason}")
        self.line, self.reason, self.index = line, reason, index


def split_lines(text: str) -> list[str]:
    """The lines of an ignore file, split as git splits them."""
    text = text.removeprefix("\ufeff")
    return [line.removesuffix("\r") for line in text.split("\n")]


def _trim(line: str) -> str:
    """``line`` without its trailing spaces, unless a backslash escapes them (git's rule)."""
    last_space = -1
    i, n = 0, len(line)
    while i < n:
        c = line[i]
        if c == " ":
            if last_space < 0:
                last_space = i
        else:
            if c == "\\":
                i += 1
                if i == n:
                    return line
            last_space = -1
        i += 1
    return line if last_space < 0 else line[:last_space]


def is_pattern(line: str) -> bool:
    """False for a blank or comment line."""
    return bool(_trim(line)) and not line.lstrip(" \t").startswith("#")


def compile_pattern(line: str) -> Rule | None:
    """One line as a ``Rule``; None for a blank or comment line; ``InvalidPattern`` if
    git would quietly misread it (see the module docstring)."""
    if not is_pattern(line):
        return None
    pat = _trim(line).encode("utf-8", "surrogateescape")
    negative = pat[:1] == b"!"
    if negative:
        pat = pat[1:]
    dir_only = pat[-1:] == b"/"
    if dir_only:
        pat = pat[:-1]
    on_base = b"/" not in pat
    try:
        if on_base:
            body = _wild(pat, pathname=False)
        else:
            pat = pat.removeprefix(b"/")
            # git compares the literal part up to the first wildcard on its own and starts
            # the wildcard match after it: that start counts as "at the start" for **.
            k = next((i for i, c in enumerate(pat) if c in _SPECIAL), len(pat))
            body = re.escape(pat[:k]) + _wild(pat[k:], pathname=True)
    except ValueError as exc:
        raise InvalidPattern(line, str(exc)) from None
    return negative, dir_only, on_base, re.compile(body, re.DOTALL).fullmatch


def _wild(pat: bytes, pathname: bool) -> bytes:
    """The regex of a wildmatch pattern (``pathname``: with git's WM_PATHNAME)."""
    out: list[bytes] = []
    i, n = 0, len(pat)
    while i < n:
        c = pat[i]
        if c == _BACKSLASH:
            if i + 1 == n:
                raise ValueError("it ends in a lone '\\' (write '\\\\' for a backslash)")
            out.append(re.escape(pat[i + 1 : i + 2]))
            i += 2
        elif c == _QUESTION:
            out.append(b"[^/]")
            i += 1
        elif c == _OPEN:
            members, i = _class(pat, i + 1)
            out.append(_class_regex(members))
        elif c == _STAR:
            j = i
            while j < n and pat[j] == _STAR:
                j += 1
            if pathname and j - i > 1 and (i == 0 or pat[i - 1] == _SLASH):
                if j == n:
                    out.append(b".*")
                    i = j
                    continue
                if pat[j] == _SLASH:
                    out.append(b"(?:.*/)?")
                    i = j + 1
                    continue
                if pat[j : j + 2] == b"\\/":
                    out.append(b".*")
                    i = j
                    continue
            out.append(b"[^/]*")
            i = j
        else:
            out.append(re.escape(pat[i : i + 1]))
            i += 1
    return b"".join(out)


def _class(pat: bytes, i: int) -> tuple[frozenset[int], int]:
    """The bytes the class opening just before ``pat[i]`` matches, and the index after it.

    A port of wildmatch's class loop, so that its corner cases (``]`` first is literal,
    ``-`` first or last is literal, ``[`` without ``:`` is literal) are git's.
    """
    n = len(pat)

    def at(k: int) -> int:
        return pat[k] if k < n else 0

    unclosed = "its '[' is never closed (write '\\[' for a literal '[')"
    ch = at(i)
    negated = ch in (_BANG, _CARET)
    if negated:
        i += 1
        ch = at(i)
    members: set[int] = set()
    prev = 0
    while True:
        if not ch:
            raise ValueError(unclosed)
        if ch == _BACKSLASH:
            i += 1
            ch = at(i)
            if not ch:
                raise ValueError(unclosed)
            members.add(ch)
        elif ch == _DASH and prev and at(i + 1) and at(i + 1) != _CLOSE:
            i += 1
            ch = at(i)
            if ch == _BACKSLASH:
                i += 1
                ch = at(i)
                if not ch:
                    raise ValueError(unclosed)
            if ch < prev:
                raise ValueError(
                    f"its range {chr(prev)}-{chr(ch)} is reversed (write the low end first)"
                    if prev < 128 and ch < 128 else "a range in it is reversed")
            members.update(range(prev, ch + 1))
            ch = 0
        elif ch == _OPEN and at(i + 1) == _COLON:
            start = j = i + 2
            while at(j) and at(j) != _CLOSE:
                j += 1
            if not at(j):
                raise ValueError(unclosed)
            if j - start - 1 < 0 or pat[j - 1] != _COLON:
                members.add(ch)  # no ":]": a literal '[' and the rest read on
            else:
                name = pat[start : j - 1]
                if name not in _CLASSES:
                    raise ValueError(f"[:{name.decode('utf-8', 'replace')}:] is not a class")
                members |= _CLASSES[name]
                i, ch = j, 0
        else:
            members.add(ch)
        prev = ch
        i += 1
        ch = at(i)
        if ch == _CLOSE:
            break
    chosen = frozenset(range(256)) - members if negated else frozenset(members)
    return chosen - {_SLASH, 0}, i + 1


def _class_regex(members: frozenset[int]) -> bytes:
    if not members:
        return b"(?!)"
    parts: list[bytes] = []
    run: list[int] = []
    for c in sorted(members):
        if run and c == run[-1] + 1:
            run.append(c)
            continue
        if run:
            parts.append(_run(run))
        run = [c]
    parts.append(_run(run))
    return b"[" + b"".join(parts) + b"]"


def _run(run: list[int]) -> bytes:
    lo, hi = run[0], run[-1]
    return b"\\x%02x" % lo if lo == hi else b"\\x%02x-\\x%02x" % (lo, hi)


class Matcher:
    """The exclusion rule: directory names pruned at any depth plus gitignore lines.

    ``patterns`` holds the compiled lines (blank and comment lines dropped), so that a walk
    can skip the per-file call when it is empty. ``InvalidPattern`` carries the index of
    the refused line.
    """

    def __init__(self, names: Iterable[str], lines: Iterable[str]) -> None:
        self.names = frozenset(names)
        self.patterns: list[Rule] = []
        for index, line in enumerate(lines):
            try:
                rule = compile_pattern(line)
            except InvalidPattern as exc:
                raise InvalidPattern(line, exc.reason, index) from None
            if rule is not None:
                self.patterns.append(rule)
        # The last matching line decides: walk them last to first, stop at the first match.
        self._backwards = self.patterns[::-1]

    def matches(self, rel: str, is_dir: bool) -> bool:
        """True if ``rel`` itself is excluded, its parents not considered."""
        if is_dir and rel.rsplit("/", 1)[-1] in self.names:
            return True
        if not self._backwards:
            return False
        path = rel.encode("utf-8", "surrogateescape")
        base = path[path.rfind(b"/") + 1 :]
        for negative, dir_only, on_base, fullmatch in self._backwards:
            if dir_only and not is_dir:
                continue
            if fullmatch(base if on_base else path) is not None:
                return not negative
        return False

    def excluded(self, rel: str, is_dir: bool) -> bool:
        """True if ``rel`` or any of its parent directories is excluded."""
        parts = rel.split("/")
        for i in range(1, len(parts)):
            if self.matches("/".join(parts[:i]), True):
                return True
        return self.matches(rel, is_dir)
