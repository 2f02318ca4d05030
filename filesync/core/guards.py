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
    local_root: str, remote_root: str, force: bool = False,
) -> None:
    """Refuse when a side the run reads from holds no file while ``tracked`` were synced."""
    if not tracked or force:
        return
    if direction is not Direction.PUSH and not remote_files:
        raise SafetyRefusal(
            f"remote root {remote_root} is missing or empty but {tracked} files were "
            "synced before; if it was emptied on purpose, rerun with --force"
        )
    if direction is not Direction.PULL and not local_files:
        raise SafetyRefusal(
            f"local root {local_root} is missing or empty but {tracked} files were "
            "synced before (unmounted disk?); if it was emptied on purpose, rerun with --force"
        )


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
