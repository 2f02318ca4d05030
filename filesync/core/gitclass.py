"""git's segment globs as regular expressions over UTF-8 bytes (host only).

``glob_regex`` translates one ``/``-free piece of a gitignore pattern the way git's
wildmatch reads it: ``*`` any run of bytes but ``/``, ``?`` one byte but ``/``, ``\\x`` a
literal ``x``, and ``[...]`` one byte of a class (ranges, ``!``/``^`` negation, ``]`` first
and ``-`` first or last literal, ``[`` without ``:`` literal, ``[:alpha:]`` and its
siblings, ASCII only, never ``/``). The expression is ASCII text (every other byte is a
``\\xNN`` escape), compiled as bytes by ``filesync.tree.ignore``.

A piece git would quietly misread or never match raises ``ValueError`` with the reason:
a reversed range (git matches only its first end), an unclosed ``[``, an unknown
``[:class:]``, a lone trailing ``\\``.
"""

from __future__ import annotations

import re

_STAR, _QUESTION, _OPEN, _CLOSE, _BACKSLASH, _SLASH = b"*?[]\\/"
_BANG, _CARET, _DASH, _COLON = b"!^-:"


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


def glob_regex(piece: str) -> str:
    """The expression of one ``/``-free glob (see the module docstring)."""
    pat = piece.encode("utf-8", "surrogateescape")
    out: list[str] = []
    i, n = 0, len(pat)
    while i < n:
        c = pat[i]
        if c == _BACKSLASH:
            if i + 1 == n:
                raise ValueError("it ends in a lone '\\' (write '\\\\' for a backslash)")
            out.append(_literal(pat[i + 1]))
            i += 2
        elif c == _QUESTION:
            out.append("[^/]")
            i += 1
        elif c == _OPEN:
            members, i = _class(pat, i + 1)
            out.append(_class_regex(members))
        elif c == _STAR:
            while i < n and pat[i] == _STAR:
                i += 1
            out.append("[^/]*")
        else:
            out.append(_literal(c))
            i += 1
    return "".join(out)


def _literal(c: int) -> str:
    return re.escape(chr(c)) if c < 128 else f"\\x{c:02x}"


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


def _class_regex(members: frozenset[int]) -> str:
    if not members:
        return "(?!)"
    parts: list[str] = []
    run: list[int] = []
    for c in sorted(members):
        if run and c == run[-1] + 1:
            run.append(c)
            continue
        if run:
            parts.append(_run(run))
        run = [c]
    parts.append(_run(run))
    return "[" + "".join(parts) + "]"


def _run(run: list[int]) -> str:
    lo, hi = run[0], run[-1]
    return f"\\x{lo:02x}" if lo == hi else f"\\x{lo:02x}-\\x{hi:02x}"
