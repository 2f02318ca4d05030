"""The exclusion rule: one object used by every walk, every listing and every apply.

The patterns are compiled by pathspec's ``GitIgnoreSpec``; matching itself is
``filesync.helper.Matcher``, the same code the remote helper runs, so that the host
walk, the remote listing and the pull-time path check cannot disagree.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from filesync.tree.ignore import Matcher

#: Bookkeeping and dependency trees that are never skill content.
DEFAULT_EXCLUDED_DIRS: tuple[str, ...] = (
    ".git", ".github", ".hub", ".archive", ".curator_backups", ".locks",
    ".venv", "venv", "node_modules", "site-packages", "__pycache__",
    ".tox", ".nox", ".pytest_cache", ".mypy_cache", ".ruff_cache",
)  # fmt: skip

IGNORE_FILE = ".filesyncignore"


def _compile(patterns: Sequence[str]) -> list[tuple[str, bool]]:
    import pathspec  # only needed when there are patterns

    spec = pathspec.GitIgnoreSpec.from_lines(patterns)
    out: list[tuple[str, bool]] = []
    for pattern in spec.patterns:
        regex = getattr(pattern, "regex", None)
        if regex is not None and pattern.include is not None:
            out.append((regex.pattern, bool(pattern.include)))
    return out


@dataclass(frozen=True)
class ExcludeRule:
    """Directory names pruned at any depth, plus gitignore-syntax patterns.

    A path is excluded if it or any parent directory is excluded. Directories are
    matched with an explicit is-directory flag, never by guessing from the name.
    """

    dir_names: tuple[str, ...] = DEFAULT_EXCLUDED_DIRS
    patterns: tuple[str, ...] = ()
    _compiled: list[tuple[str, bool]] = field(default_factory=list, compare=False, repr=False)

    @classmethod
    def build(
        cls,
        patterns: Iterable[str] = (),
        *,
        default_excludes: bool = True,
        root: Path | None = None,
    ) -> ExcludeRule:
        """Build the rule from ``--exclude`` patterns and ``ROOT/.filesyncignore``."""
        lines = list(patterns)
        if root is not None and (root / IGNORE_FILE).is_file():
            lines += (root / IGNORE_FILE).read_text(encoding="utf-8").splitlines()
        lines = [ln for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
        names = DEFAULT_EXCLUDED_DIRS if default_excludes else ()
        return cls(names, tuple(lines), _compile(lines) if lines else [])

    def __post_init__(self) -> None:
        # Frozen: the matcher is built once and shared by every caller of this rule.
        object.__setattr__(self, "_matcher", Matcher(list(self.dir_names), self._compiled))

    def matcher(self) -> Matcher:
        """The compiled matcher (the same code the remote helper runs)."""
        return self._matcher  # type: ignore[no-any-return,attr-defined]

    def excluded(self, rel: str, is_dir: bool) -> bool:
        """True if ``rel`` (POSIX, relative to the root) or a parent is excluded."""
        return self.matcher().excluded(rel, is_dir)

    def wire(self) -> dict[str, Any]:
        """The rule as the remote helper takes it."""
        return {"names": list(self.dir_names), "patterns": [[r, i] for r, i in self._compiled]}
