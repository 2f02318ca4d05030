"""Reconcile: a pure function of (ancestor, local, remote, direction) -> plan.

No I/O happens here. The rules (README has them as a table):
- a side that changed against the ancestor propagates when the other did not;
- both sides changed to the same content: no conflict, only the ancestor moves;
- both changed differently: conflict;
- no ancestor and the sides differ: conflict, never a deletion;
- a deletion propagates only when the other side is unchanged since the ancestor
  (delete against modify: the modification wins).
The direction decides what may move and who wins a conflict:
- ``push`` moves host -> remote only; the remote loses conflicts (its version is saved
  first); files that exist only on the remote and were never pushed are left alone;
- ``pull`` moves remote -> host only; the host wins conflicts (the remote version is
  saved);
- ``sync`` moves both ways and leaves conflicts in place on both sides.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass


class Direction(enum.Enum):
    PUSH = "push"
    PULL = "pull"
    SYNC = "sync"


class Kind(enum.StrEnum):
    """What a plan's step does; each member equals its JSON string (``"upload"``)."""

    UPLOAD = "upload"
    DOWNLOAD = "download"
    DELETE_LOCAL = "delete-local"
    DELETE_REMOTE = "delete-remote"
    CONFLICT = "conflict"
    RECORD = "record"  # both sides agree: the ancestor becomes their content
    FORGET = "forget"  # gone on both sides: drop the ancestor


@dataclass(frozen=True, slots=True)
class Version:
    """One side's content of a path: its digest and permission bits."""

    hash: str
    mode: int

    def same(self, other: Version | None) -> bool:
        return other is not None and self.hash == other.hash and self.mode == other.mode


@dataclass(frozen=True, slots=True)
class Action:
    """One step of a plan. ``then`` is what a conflict does after saving the loser."""

    path: str
    kind: Kind
    then: Kind | None = None


def _same(a: Version | None, b: Version | None) -> bool:
    return a.same(b) if a is not None else b is None


def decide(
    anc: Version | None, local: Version | None, remote: Version | None, direction: Direction
) -> Action | None:
    """The action for one path; ``None`` means nothing to do."""
    if _same(local, remote):
        if _same(anc, local):
            return None
        return _act(Kind.RECORD if local is not None else Kind.FORGET)
    if anc is None:
        return _new_on_one_side(local, remote, direction)
    local_changed = not _same(anc, local)
    remote_changed = not _same(anc, remote)
    if local_changed and not remote_changed:
        return _local_wins(local, direction)
    if remote_changed and not local_changed:
        return _remote_wins(local, remote, direction)
    # Both changed, differently. A deletion against a modification is no conflict.
    if local is None:
        return _remote_wins(local, remote, direction)
    if remote is None:
        return _local_wins(local, direction)
    return _conflict(direction)


def _act(kind: Kind | None, then: Kind | None = None) -> Action | None:
    return None if kind is None else Action("", kind, then)


def _new_on_one_side(
    local: Version | None, remote: Version | None, direction: Direction
) -> Action | None:
    if remote is None:
        return _act(Kind.UPLOAD if direction is not Direction.PULL else None)
    if local is None:
        return _act(Kind.DOWNLOAD if direction is not Direction.PUSH else None)
    return _conflict(direction)


def _local_wins(local: Version | None, direction: Direction) -> Action | None:
    if direction is Direction.PULL:
        return None
    if local is None:
        return _act(Kind.DELETE_REMOTE)
    return _act(Kind.UPLOAD)


def _remote_wins(
    local: Version | None, remote: Version | None, direction: Direction
) -> Action | None:
    if direction is Direction.PUSH:
        # The remote must end up as the host has it; a remote edit is saved first.
        restore = Kind.UPLOAD if local is not None else Kind.DELETE_REMOTE
        return _act(restore) if remote is None else _act(Kind.CONFLICT, restore)
    if remote is None:
        return _act(Kind.DELETE_LOCAL)
    return _act(Kind.DOWNLOAD)


def _conflict(direction: Direction) -> Action | None:
    # Only reached with both sides present, so a push conflict ends in an upload.
    if direction is Direction.PUSH:
        return _act(Kind.CONFLICT, Kind.UPLOAD)
    return _act(Kind.CONFLICT)


def reconcile(
    ancestor: Mapping[str, Version],
    local: Mapping[str, Version],
    remote: Mapping[str, Version],
    direction: Direction,
) -> list[Action]:
    """The plan for every path any of the three knows, sorted by path."""
    plan: list[Action] = []
    for path in sorted(ancestor.keys() | local.keys() | remote.keys()):
        action = decide(ancestor.get(path), local.get(path), remote.get(path), direction)
        if action is not None:
            plan.append(Action(path, action.kind, action.then))
    return plan
