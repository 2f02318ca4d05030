"""The exclusion rule: one object used by every walk, every listing and every apply.

Guarantee: the patterns are read with git's semantics: pathspec compiles each line on the
host (``filesync.core.gitignore``) and ``filesync.tree.ignore.Matcher`` applies the
compiled rules (agrees with git, checked by tests/tree/test_ignore_git_oracle.py). The
wire carries the compiled rules and the remote runs that same ``Matcher``, so the host
walk, the remote listing and the pull-time path check cannot disagree.

An invalid pattern from any source raises ``PatternError`` (exit 2) naming the pattern and
its source. Git itself takes e.g. ``[z-a]`` without a word (and matches only ``z`` with
it); filesync refuses it, since a typo must not silently sync what it was meant to exclude.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filesync.core.gitignore import InvalidPattern, compile_lines, is_pattern, split_lines
from filesync.errors import PatternError, UsageError
from filesync.tree.ignore import Matcher, Rule

#: Bookkeeping and dependency trees that are never skill content.
DEFAULT_EXCLUDED_DIRS: tuple[str, ...] = (
    ".git", ".github", ".hub", ".archive", ".curator_backups", ".locks",
    ".venv", "venv", "node_modules", "site-packages", "__pycache__",
    ".tox", ".nox", ".pytest_cache", ".mypy_cache", ".ruff_cache",
)  # fmt: skip

IGNORE_FILE = ".filesyncignore"


@dataclass(frozen=True)
class ExcludeRule:
    """Directory names pruned at any depth, plus gitignore pattern lines.

    A path is excluded if a parent directory is excluded or the last pattern matching the
    path itself is not a negation. Directories are matched with an explicit is-directory
    flag, never by guessing from the name.
    """

    dir_names: tuple[str, ...] = DEFAULT_EXCLUDED_DIRS
    patterns: tuple[str, ...] = ()

    @classmethod
    def build(
        cls,
        patterns: Iterable[str] = (),
        *,
        default_excludes: bool = True,
        root: Path | None = None,
        source: str = "--exclude",
        more: Iterable[tuple[str, Iterable[str]]] = (),
    ) -> ExcludeRule:
        """Build the rule from ``patterns`` (labelled ``source`` in errors), then each
        ``(label, patterns)`` of ``more``, then ``ROOT/.filesyncignore``, in that order (a
        later line overrides an earlier one). Raises ``PatternError`` for an invalid one."""
        labelled = [(source, line) for line in patterns]
        for label, lines in more:
            labelled += [(label, line) for line in lines]
        path = root / IGNORE_FILE if root is not None else None
        if path is not None and path.is_file():
            try:
                text = path.read_text(encoding="utf-8")
            except UnicodeDecodeError as exc:
                raise UsageError(f"{path} is not UTF-8 ({exc.reason} at byte {exc.start}); "
                                 "save it as UTF-8") from None
            labelled += [(f"{path}:{n}", line) for n, line in enumerate(split_lines(text), 1)]
        kept = [(label, line) for label, line in labelled if is_pattern(line)]
        names = DEFAULT_EXCLUDED_DIRS if default_excludes else ()
        try:
            return cls(names, tuple(line for _, line in kept))
        except InvalidPattern as exc:
            label = kept[exc.index][0]
            # Quoted as typed (a repr would double every backslash) unless unprintable.
            shown = f"'{exc.line}'" if exc.line.isprintable() else repr(exc.line)
            raise PatternError(f"exclude pattern {shown} from {label} is invalid: "
                               f"{exc.reason}; fix the pattern") from None

    def __post_init__(self) -> None:
        # Frozen: the rules and the matcher are built once and shared by every caller.
        rules = compile_lines(list(self.patterns))
        object.__setattr__(self, "_rules", rules)
        object.__setattr__(self, "_matcher", Matcher(self.dir_names, rules))

    def matcher(self) -> Matcher:
        """The compiled matcher (the same code the remote helper runs)."""
        return self._matcher  # type: ignore[no-any-return,attr-defined]

    def excluded(self, rel: str, is_dir: bool) -> bool:
        """True if ``rel`` (POSIX, relative to the root) or a parent is excluded."""
        return self.matcher().excluded(rel, is_dir)

    def rules(self) -> list[Rule]:
        """The compiled pattern lines, as the remote's ``Matcher`` takes them."""
        return self._rules  # type: ignore[no-any-return,attr-defined]

    def wire(self) -> dict[str, Any]:
        """The rule as the remote helper takes it: the names and the compiled rules."""
        return {"names": list(self.dir_names), "rules": [list(r) for r in self.rules()]}
