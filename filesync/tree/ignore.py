"""The exclusion evaluator: pruned directory names plus gitignore-syntax patterns."""

from __future__ import annotations

import re


class Matcher:
    """The exclusion rule: directory names pruned at any depth plus gitignore regexes.

    ``patterns`` are ``(regex, include)`` pairs compiled by pathspec's GitIgnoreSpec;
    ``matches`` applies pathspec's GitIgnoreSpec priority rule in forward order (the
    order pathspec 0.12 used; pathspec 1.x's default reverse order disagrees with git
    where a dir pattern meets a negation, see tests/test_exclude.py).
    """

    def __init__(self, names: list[str], patterns: list[tuple[str, bool]]) -> None:
        self.names = frozenset(names)
        self.patterns = [(re.compile(rx), include) for rx, include in patterns]

    def matches(self, rel: str, is_dir: bool) -> bool:
        """True if ``rel`` itself (not its parents) is excluded."""
        if is_dir and rel.rsplit("/", 1)[-1] in self.names:
            return True
        if not self.patterns:
            return False
        target = rel + "/" if is_dir else rel
        result = False
        priority = 0
        for regex, include in self.patterns:
            match = regex.match(target)
            if match is None:
                continue
            dir_mark = any(v for k, v in match.groupdict().items() if k.startswith("ps_d"))
            this = 1 if dir_mark else 2
            if (include and dir_mark) or this >= priority:
                result, priority = include, this
        return result

    def excluded(self, rel: str, is_dir: bool) -> bool:
        """True if ``rel`` or any of its parent directories is excluded."""
        parts = rel.split("/")
        for i in range(1, len(parts)):
            if self.matches("/".join(parts[:i]), True):
                return True
        return self.matches(rel, is_dir)

