"""The safety guards: refuse a whole run before anything changes (exit code 3).

Pure functions of counts and the direction; ``--force`` turns them off. They exist for
the two ways a tree looks deleted without anyone meaning it: a side that is empty (an
unmounted disk, a wrong path, a wiped remote) while the ancestor says it held files, and
a plan that would delete most of what was synced.
"""

from __future__ import annotations

from collections.abc import Iterable

from filesync.core.reconcile import Action, Direction, Kind
from filesync.errors import SafetyRefusal

#: A plan deleting more than this many files, and more than half the tracked ones, is refused.
MASS_DELETE_MIN = 20


def check_roots(
    direction: Direction, tracked: int, local_files: int, remote_files: int,
    local_root: str, remote_root: str, force: bool = False, *,
    local_excluded: int = 0, remote_excluded: int = 0,
) -> None:
    """Refuse when a side the run reads from holds no file while ``tracked`` were synced.

    ``*_excluded``: how many paths the exclusion rule pruned on that side; a side that is
    empty only because the rule excludes everything is named as such, not as "missing".
    """
    if not tracked or force:
        return
    if direction is not Direction.PUSH and not remote_files:
        raise SafetyRefusal(_empty("remote", remote_root, tracked, remote_excluded,
                                   "if it was emptied on purpose"))
    if direction is not Direction.PULL and not local_files:
        raise SafetyRefusal(_empty("local", local_root, tracked, local_excluded,
                                   "(unmounted disk?); if it was emptied on purpose"))


def _empty(side: str, root: str, tracked: int, excluded: int, hint: str) -> str:
    if excluded:
        return (f"every path under the {side} root {root} is excluded ({excluded} pruned) but "
                f"{tracked} files were synced before; check --exclude, .filesyncignore and "
                "the config's exclude list, or rerun with --force")
    return (f"{side} root {root} is missing or empty but {tracked} files were synced "
            f"before {hint}, rerun with --force")


def deletions(plan: Iterable[Action]) -> int:
    """How many actions of ``plan`` delete a file on either side."""
    return sum(
        1 for a in plan
        if Kind.DELETE_LOCAL in (a.kind, a.then) or Kind.DELETE_REMOTE in (a.kind, a.then)
    )


def check_deletions(plan: Iterable[Action], tracked: int, force: bool = False) -> None:
    """Refuse a plan deleting more than ``MASS_DELETE_MIN`` files and over half of ``tracked``."""
    deletes = deletions(plan)
    if deletes > MASS_DELETE_MIN and deletes * 2 > tracked and not force:
        raise SafetyRefusal(
            f"this run would delete {deletes} of {tracked} tracked files; "
            "check both roots, then rerun with --force if that is intended"
        )
