"""The exclusion evaluator: pruned directory names plus compiled gitignore rules.

The rules are compiled on the host (``filesync.core.gitignore``: pathspec reads each
pattern line, git's semantics are kept) and travel with the listing request; this module
only applies them, with ``re``, so the remote helper stays stdlib-only and both sides run
one rule.

Guarantee: ``Matcher.excluded`` answers what git answers for the lines the rules were
compiled from (tests/tree/test_ignore_git_oracle.py checks it against git on random trees
and patterns):

- matching is on the UTF-8 bytes of a path, as git's is (the expressions are compiled as
  bytes; names that are not UTF-8 keep their bytes through ``surrogateescape``);
- a rule matches a path itself, never as one of its descendants. A path is excluded iff
  one of its parent directories is (nothing below an excluded directory is re-included,
  whatever negation follows) or the last rule matching the path itself is not a
  negation. A directory whose name is in ``names`` is excluded at any depth.
"""

from __future__ import annotations

#: ``typing`` is for the type checker only: the remote helper starts without importing it.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any

#: One compiled line as it travels: (expression, negation, directories only, on the last
#: component). The expression is ASCII text, compiled as bytes, matched with fullmatch.
Rule = tuple[str, bool, bool, bool]


def valid_rule(row: Any) -> bool:
    """``row`` has a ``Rule``'s layout (what a listing request may carry)."""
    return (isinstance(row, list | tuple) and len(row) == 4 and isinstance(row[0], str)
            and all(isinstance(flag, bool) for flag in row[1:]))


class Matcher:
    """The exclusion rule: directory names pruned at any depth plus compiled rules.

    ``patterns`` holds the compiled rules, so that a walk can skip the per-file call when
    it is empty. Raises ``ValueError`` for a row that is not a ``Rule``.
    """

    def __init__(self, names: Iterable[str], rules: Iterable[Rule]) -> None:
        self.names = frozenset(names)
        self.patterns: list[tuple[bool, bool, bool, Callable[[bytes], object]]] = []
        rules = list(rules)
        if rules:  # only patterns need re: a rule of names alone never loads it
            import re
        for row in rules:
            if not valid_rule(row):
                raise ValueError("malformed exclusion rule")
            regex, negative, dir_only, on_base = row
            fullmatch = re.compile(regex.encode("ascii"), re.DOTALL).fullmatch
            self.patterns.append((negative, dir_only, on_base, fullmatch))
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
