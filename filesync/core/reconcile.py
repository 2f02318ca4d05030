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

Type conflicts. Directories are not tracked: a side holds a directory at ``p`` when it
holds files under ``p/``. When the per-path plan would leave a file at ``p`` on a side
that also keeps files under ``p/`` (a file on one side against a directory on the other,
both changed since the ancestor, or never synced), the whole name is one conflict: every
step at or under ``p`` is replaced by one ``CONFLICT`` on ``p`` carrying its ``Clash``
(each side's files there). ``sync`` and ``pull`` keep both sides; ``push`` saves the
remote side, then makes it the host's (member steps name ``p`` in ``of``). ``settle``
gives the steps of ``resolve --keep local|remote`` for any conflict.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Iterable, Mapping
from typing import NamedTuple


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


class Version(NamedTuple):
    """One side's content of a path: its digest and permission bits.

    ``Version``, ``Clash`` and ``Action`` are named tuples, not dataclasses: every run
    imports this module, and creating a dataclass compiles its methods from source
    (~1 ms of CPU each); a plan makes one per path, and a named tuple is also the
    cheapest immutable record to build."""

    hash: str
    mode: int

    def same(self, other: Version | None) -> bool:
        return other is not None and self.hash == other.hash and self.mode == other.mode


class Clash(NamedTuple):
    """A type conflict at an action's path: a file on one side, a directory on the other.

    ``local``/``remote``: each side's files at or under the path, sorted (the file side
    holds the path itself); ``local_hash``/``remote_hash``: a digest of each side's
    versions there (a lone file's own hash), so that a saved copy is known to be current.
    """

    local: tuple[str, ...]
    remote: tuple[str, ...]
    local_hash: str
    remote_hash: str
    #: the remote holds the directory, the host the file (else the other way round)
    remote_dir: bool


class Action(NamedTuple):
    """One step of a plan. ``then`` is what a conflict does after saving the loser.

    ``clash``: set on a type conflict's ``CONFLICT``; ``of``: on the steps that carry it
    out (a push's, a resolve's), the path of that conflict: they happen only if its
    losing side was saved."""

    path: str
    kind: Kind
    then: Kind | None = None
    clash: Clash | None = None
    of: str | None = None


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
    roots = _clash_roots(local, remote, plan)
    return _with_clashes(plan, roots, local, remote, direction) if roots else plan


_TO_LOCAL, _OFF_LOCAL = frozenset({Kind.DOWNLOAD}), frozenset({Kind.DELETE_LOCAL})
_TO_REMOTE, _OFF_REMOTE = frozenset({Kind.UPLOAD}), frozenset({Kind.DELETE_REMOTE})


def _clash_roots(
    local: Mapping[str, Version], remote: Mapping[str, Version], plan: list[Action]
) -> list[str]:
    """The names where ``plan`` would leave a file on a side that keeps files under it.

    A side's paths are all of one real tree, so a clash needs a path the plan adds to a
    side from the other one: only those are looked up (nothing, when nothing is added or
    the side held nothing), never every path against every other."""
    if not local or not remote:
        return []  # a clash takes a file on one side and a file under it on the other
    roots: set[str] = set()
    for side, to_side, off_side in ((local, _TO_LOCAL, _OFF_LOCAL),
                                    (remote, _TO_REMOTE, _OFF_REMOTE)):
        added = [a.path for a in plan if a.kind in to_side or a.then in to_side]
        if not added:
            continue
        kept = side.keys() - {a.path for a in plan if a.kind in off_side or a.then in off_side}
        dirs = dirs_of(kept)
        for path in added:
            if path in dirs:
                roots.add(path)  # a file put where the side keeps a directory
            parent = path.rpartition("/")[0]
            while parent:
                if parent in kept:
                    roots.add(parent)  # a file of the side where a directory goes
                parent = parent.rpartition("/")[0]
    # The outermost name of nested clashes stands for them all.
    return [r for r in sorted(roots) if not any(
        r.startswith(o + "/") for o in roots if len(o) < len(r))]


def dirs_of(paths: Iterable[str]) -> set[str]:
    """Every directory that ``paths`` (files) imply, each found once."""
    dirs: set[str] = set()
    for path in paths:
        parent = path.rpartition("/")[0]
        while parent and parent not in dirs:
            dirs.add(parent)
            parent = parent.rpartition("/")[0]
    return dirs


def _under(keys: Iterable[str], root: str) -> tuple[str, ...]:
    prefix = root + "/"
    return tuple(sorted(k for k in keys if k == root or k.startswith(prefix)))


def side_digest(side: Mapping[str, Version], paths: tuple[str, ...], root: str) -> str:
    """One side's versions at or under ``root``: a lone file's hash, else a digest of the
    relative names, hashes and permission bits."""
    if paths == (root,):
        return side[root].hash
    h = hashlib.blake2b(digest_size=16)
    for p in paths:
        h.update(f"{p[len(root):]}\0{side[p].hash}\0{side[p].mode:o}\n".encode())
    return "dir:" + h.hexdigest()


def _with_clashes(
    plan: list[Action], roots: list[str], local: Mapping[str, Version],
    remote: Mapping[str, Version], direction: Direction,
) -> list[Action]:
    """``plan`` with every step at or under a clash's root replaced by its conflict (the
    ancestor rows of names gone from both sides are still dropped)."""
    out = [a for a in plan if a.kind is Kind.FORGET or _root_of(a.path, roots) is None]
    for root in roots:
        lsub, rsub = _under(local, root), _under(remote, root)
        clash = Clash(lsub, rsub, side_digest(local, lsub, root),
                      side_digest(remote, rsub, root), remote_dir=lsub == (root,))
        if direction is Direction.PUSH:
            out += settle(Action(root, Kind.CONFLICT, clash=clash), keep_local=True)
        else:
            out.append(Action(root, Kind.CONFLICT, clash=clash))
    out.sort(key=_by_path)
    return out


def _root_of(path: str, roots: list[str]) -> str | None:
    for root in roots:
        if path == root or path.startswith(root + "/"):
            return root
    return None


def _by_path(action: Action) -> str:
    return action.path


def settle(conflict: Action, keep_local: bool) -> list[Action]:
    """The steps that settle ``conflict`` (a ``CONFLICT``) with one side's version.

    A file conflict: the kept side's file is copied over. A type conflict: the kept
    side's file or directory replaces the other one; what the remote loses is saved
    first (the returned ``CONFLICT`` goes on with its ``then``), what the host loses is
    kept in ``undo/`` by its deletes, and every other step names the conflict in ``of``.
    """
    path, clash = conflict.path, conflict.clash
    if clash is None:
        return [Action(path, Kind.UPLOAD if keep_local else Kind.DOWNLOAD)]
    if keep_local:
        if clash.remote_dir:
            return [Action(path, Kind.CONFLICT, Kind.UPLOAD, clash),
                    *(Action(p, Kind.DELETE_REMOTE, of=path) for p in clash.remote)]
        return [Action(path, Kind.CONFLICT, Kind.DELETE_REMOTE, clash),
                *(Action(p, Kind.UPLOAD, of=path) for p in clash.local)]
    return [*(Action(p, Kind.DELETE_LOCAL, of=path) for p in clash.local),
            *(Action(p, Kind.DOWNLOAD, of=path) for p in clash.remote)]
