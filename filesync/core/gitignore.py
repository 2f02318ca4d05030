"""gitignore lines compiled to the rules ``filesync.tree.ignore.Matcher`` applies.

Host only: pathspec (``GitIgnoreSpecPattern``) reads each line (comment, negation,
directory-only, anchoring, ``**`` segments) and builds its regular expression; the remote
gets the compiled rules with the listing request and applies them with ``re`` alone, so
both sides run one rule and the helper stays stdlib-only.

Guarantee: a rule set answers what git answers for the same lines in a root
``.gitignore`` (tests/tree/test_ignore_git_oracle.py checks it against git on random
trees and patterns). pathspec's expressions are read, not trusted blindly, where git
differs from them:

- Matching is on the UTF-8 bytes of a path, as git's is: the expressions are compiled as
  bytes, so ``?`` is one byte and ``ü`` (two bytes) takes ``??``.
- A bracket class is read by git's own rules (``filesync.core.gitclass``): ranges,
  ``!``/``^``, ``]`` first and ``-`` last literal, ``[:alpha:]`` and its siblings, never
  ``/``. pathspec hands the bracket text to ``re`` as it stands, which reads those
  otherwise.
- A rule matches a path itself, never as one of its descendants (the walk prunes an
  excluded directory, and nothing below it is looked at): pathspec's descendant tails are
  cut off, and ``a/**/`` keeps its "strictly below ``a``".
- An anchored pattern's first wildcard counts as at the start (git compares the literal
  part before it on its own), so ``x/a**/b`` matches ``x/ab`` and ``x/ay/z/b``.
- Trailing spaces are dropped unless escaped, and only spaces (a trailing tab is part of
  the pattern); a ``#`` after leading blanks also starts a comment here (git would take
  ``  #x`` as a pattern); write ``\\#`` for a literal ``#`` either way.

Refused, not followed (``InvalidPattern``): where git quietly reads a pattern as something
else or never matches it (a reversed range such as ``[z-a]``, an unclosed ``[``, an
unknown ``[:class:]``, a lone trailing ``\\``, and ``\\/``, which pathspec splits): a typo
must not silently sync what it was meant to exclude.
"""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING

from filesync.core.gitclass import glob_regex
from filesync.tree.ignore import Rule

if TYPE_CHECKING:
    from pathspec.patterns.gitignore.spec import GitIgnoreSpecPattern

#: pathspec's tails: "this path or anything below it", "a directory (anything below it)".
_EITHER = "(?:(?P<ps_d>/)|$)"
_BELOW_DIR = "(?P<ps_d>/)"
#: pathspec's head of a pattern that matches at any depth.
_ANY_DEPTH = "^(?:.+/)?"
_SPECIAL = frozenset("*?[\\")


class InvalidPattern(ValueError):
    """A pattern git would quietly misread or never match; ``index`` is its place in the
    list given to ``compile_lines`` (-1 from ``compile_line``)."""

    def __init__(self, line: str, reason: str, index: int = -1) -> None:
        super().__init__(f"{line!r}: {reason}")
        self.line, self.reason, self.index = line, reason, index


@functools.cache
def _reader() -> type[GitIgnoreSpecPattern]:
    """pathspec's gitignore reader with git's own segment globs (classes, bytes).

    Imported at the first pattern line, not with this module: most runs have none (the
    default rule is directory names only), and a command's start-up does not pay for it.
    """
    from pathspec.patterns.gitignore.spec import GitIgnoreSpecPattern

    class GitPattern(GitIgnoreSpecPattern):
        __slots__ = ()

        @staticmethod
        def _translate_segment_glob(pattern: str, range_error: object) -> str:
            return glob_regex(pattern)

    return GitPattern


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


def compile_lines(lines: list[str]) -> list[Rule]:
    """The rules of ``lines`` in order (blank and comment lines dropped);
    ``InvalidPattern`` carries the index of a refused line."""
    rules: list[Rule] = []
    for index, line in enumerate(lines):
        try:
            rule = compile_line(line)
        except InvalidPattern as exc:
            raise InvalidPattern(line, exc.reason, index) from None
        if rule is not None:
            rules.append(rule)
    return rules


def compile_line(line: str) -> Rule | None:
    """One line as a ``Rule``; None for a line that matches nothing (blank, comment,
    ``/``); ``InvalidPattern`` if git would quietly misread it."""
    if not is_pattern(line):
        return None
    text = _keep_trailing_blank(_trim(line))
    negative = text.startswith("!")
    body = text[1:] if negative else text
    dir_only = body.endswith("/")
    body = body[:-1] if dir_only else body
    if not body.strip("/"):
        return None  # "/", "!", "//": git matches nothing with them
    on_base = "/" not in body
    try:
        regex = _quirk(body) if not on_base else None
        if regex is None:
            regex = _regex(body, dir_only)
    except ValueError as exc:
        # pathspec wraps what ``glob_regex`` raised: the reason is the cause's.
        cause = exc.__cause__
        raise InvalidPattern(line, str(cause if isinstance(cause, ValueError) else exc)) from None
    if on_base:
        regex = regex.removeprefix(_ANY_DEPTH)
    regex = regex.removeprefix("^")  # fullmatch anchors it (and a "^" costs ~20 % a match)
    # Fail here, on the host, naming the line, rather than on the remote.
    re.compile(regex.encode("ascii"), re.DOTALL)
    return regex, negative, dir_only, on_base


def _keep_trailing_blank(text: str) -> str:
    """pathspec strips all trailing whitespace, git only spaces: a trailing tab (say) is
    kept by writing it as a one-member class."""
    if not text or text[-1] == " " or not text[-1].isspace():
        return text
    head, last = text[:-1], text[-1]
    escapes = len(head) - len(head.rstrip("\\"))
    return (head[:-1] if escapes % 2 else head) + f"[{last}]"


def _regex(body: str, dir_only: bool) -> str:
    """pathspec's expression of ``body`` (the line without ``!`` and a trailing ``/``),
    cut to match a path itself (``fullmatch``), never its descendants."""
    # pathspec would read a leading "#" (after a "!" taken off) as a comment.
    text = "\\" + body if body.startswith("#") else body
    found, _ = _reader().pattern_to_regex(text + "/" if dir_only else text)
    if not isinstance(found, str):
        raise ValueError("it matches nothing")
    regex = found
    segments = body.strip("/").split("/")
    everything = all(seg == "**" for seg in segments)
    below = segments[-1] == "**" and not everything  # "a/**": strictly below a
    if regex in (".", _BELOW_DIR):  # pathspec's whole-pattern shortcuts
        return ".+/.+" if below else ".+"
    if regex == "/":  # "**/*/**": anything not at the top
        return ".+/.+"
    if regex.endswith(_EITHER):
        return regex[: -len(_EITHER)]
    if regex.endswith(_BELOW_DIR):
        regex = regex[: -len(_BELOW_DIR)]
        return regex + "/.+" if below else regex
    if regex.endswith("/"):  # a trailing "**": anything below
        return regex + ".+"
    raise ValueError("pathspec gave an expression of an unknown shape")


def _quirk(body: str) -> str | None:
    """The expression of an anchored pattern whose first wildcard is a ``**`` right after
    a literal part of a name (``x/a**/b``), which git reads as at the start; None for any
    other pattern."""
    path = body.removeprefix("/")
    k = next((i for i, c in enumerate(path) if c in _SPECIAL), len(path))
    if k == len(path) or path[k] != "*" or k == 0 or path[k - 1] == "/":
        return None
    j = k
    while j < len(path) and path[j] == "*":
        j += 1
    if j - k < 2 or (j < len(path) and path[j] != "/"):
        return None
    head = "^" + glob_regex(path[:k])
    if j == len(path):
        return head + ".*"
    rest = _regex("/" + path[j + 1 :], False)
    return head + "(?:.*/)?" + rest.removeprefix("^")
