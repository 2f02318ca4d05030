"""The pure reconcile rules: ``decide`` per path and ``reconcile`` over whole trees.

The table's expectations are derived from the module docstring and the CLI's
description of the directions, not from running the code:
- push: "make the remote match the host (remote conflicts are saved first)";
  remote-only files never pushed are left alone;
- pull: "bring back what changed on the remote (host wins conflicts)";
- sync: both ways; conflicts stay on both sides.
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filesync.core.reconcile import Action, Direction, Kind, Version, decide, reconcile

A = Version("hash-a", 0o644)
B = Version("hash-b", 0o644)
C = Version("hash-c", 0o644)
A_X = Version("hash-a", 0o755)  # A with only the exec bit changed

PUSH, PULL, SYNC = Direction.PUSH, Direction.PULL, Direction.SYNC
UP, DOWN = Kind.UPLOAD, Kind.DOWNLOAD
DEL_L, DEL_R = Kind.DELETE_LOCAL, Kind.DELETE_REMOTE
CONFLICT, RECORD, FORGET = Kind.CONFLICT, Kind.RECORD, Kind.FORGET

V = Version | None
Expect = tuple[Kind, Kind | None] | Kind | None

# (case, ancestor, local, remote) -> expected action for (push, pull, sync)
TABLE: list[tuple[str, V, V, V, Expect, Expect, Expect]] = [
    # -- no ancestor ---------------------------------------------------------------
    ("nothing anywhere", None, None, None, None, None, None),
    ("new on host", None, A, None, UP, None, UP),
    ("new on remote", None, None, A, None, DOWN, DOWN),
    ("new on both, same", None, A, A, RECORD, RECORD, RECORD),
    ("new on both, differ", None, A, B, (CONFLICT, UP), CONFLICT, CONFLICT),
    ("new on both, mode differs", None, A, A_X, (CONFLICT, UP), CONFLICT, CONFLICT),
    # -- ancestor, nothing changed -------------------------------------------------------
    ("unchanged", A, A, A, None, None, None),
    # -- both sides agree, ancestor moves ------------------------------------------------
    ("gone on both", A, None, None, FORGET, FORGET, FORGET),
    ("same edit on both", A, B, B, RECORD, RECORD, RECORD),
    ("same chmod on both", A, A_X, A_X, RECORD, RECORD, RECORD),
    # -- one side changed ---------------------------------------------------------------
    ("host edited", A, B, A, UP, None, UP),
    ("host chmod", A, A_X, A, UP, None, UP),
    ("host deleted", A, None, A, DEL_R, None, DEL_R),
    ("remote edited", A, A, B, (CONFLICT, UP), DOWN, DOWN),
    ("remote chmod", A, A, A_X, (CONFLICT, UP), DOWN, DOWN),
    ("remote deleted", A, A, None, UP, DEL_L, DEL_L),
    # -- both changed ----------------------------------------------------------------------
    ("both edited differently", A, B, C, (CONFLICT, UP), CONFLICT, CONFLICT),
    ("host edit vs remote chmod", A, B, A_X, (CONFLICT, UP), CONFLICT, CONFLICT),
    ("host deleted, remote edited", A, None, B, (CONFLICT, DEL_R), DOWN, DOWN),
    ("host edited, remote deleted", A, B, None, UP, None, UP),
]


def as_action(expect: Expect) -> Action | None:
    if expect is None:
        return None
    if isinstance(expect, tuple):
        return Action("", expect[0], expect[1])
    return Action("", expect)


@pytest.mark.parametrize(
    ("case", "anc", "local", "remote", "push", "pull", "sync"), TABLE, ids=[t[0] for t in TABLE]
)
def test_decision_table(
    case: str, anc: V, local: V, remote: V, push: Expect, pull: Expect, sync: Expect
) -> None:
    for direction, expect in ((PUSH, push), (PULL, pull), (SYNC, sync)):
        got = decide(anc, local, remote, direction)
        assert got == as_action(expect), (case, direction)


def test_reconcile_runs_every_known_path_sorted_and_tagged() -> None:
    ancestor = {"b/gone": A, "c": A, "same": A}
    local = {"c": B, "new": A, "same": A}
    remote = {"c": A, "a-remote": C, "same": A}
    plan = reconcile(ancestor, local, remote, SYNC)
    assert plan == [
        Action("a-remote", DOWN),
        Action("b/gone", FORGET),
        Action("c", UP),
        Action("new", UP),
    ]


def test_reconcile_of_nothing_is_empty() -> None:
    assert reconcile({}, {}, {}, SYNC) == []


# -- properties ---------------------------------------------------------------------

version_st = st.sampled_from([A, B, C, A_X])
maybe_st = st.none() | version_st
direction_st = st.sampled_from(list(Direction))
PATHS = ["a", "b", "c/d", "c/e", "f g"]
tree_st = st.dictionaries(st.sampled_from(PATHS), version_st, max_size=len(PATHS))


def same(a: V, b: V) -> bool:
    return a == b


@settings(max_examples=200)
@given(local=maybe_st, remote=maybe_st, direction=direction_st)
def test_no_deletion_without_ancestor(local: V, remote: V, direction: Direction) -> None:
    action = decide(None, local, remote, direction)
    if action is not None:
        assert action.kind not in (DEL_L, DEL_R, FORGET)
        assert action.then not in (DEL_L, DEL_R)


@settings(max_examples=200)
@given(anc=maybe_st, side=maybe_st, direction=direction_st)
def test_equal_sides_move_nothing(anc: V, side: V, direction: Direction) -> None:
    action = decide(anc, side, side, direction)
    if same(anc, side):
        assert action is None
    else:
        assert action is not None
        assert action.kind is (RECORD if side is not None else FORGET)
        assert action.then is None


@settings(max_examples=200)
@given(anc=maybe_st, local=maybe_st, remote=maybe_st, direction=direction_st)
def test_deletions_only_of_unchanged_versions(
    anc: V, local: V, remote: V, direction: Direction
) -> None:
    action = decide(anc, local, remote, direction)
    if action is None:
        return
    if action.kind is DEL_L:
        # the host copy is deleted only if it is what was last synced
        assert anc is not None and same(local, anc) and remote is None
    if action.kind is DEL_R:
        assert anc is not None and same(remote, anc) and local is None
    if action.kind is CONFLICT and action.then is DEL_R:
        # only push may delete a changed remote, and only after saving it
        assert direction is PUSH and anc is not None and local is None and remote is not None
    if action.then is DEL_L:
        pytest.fail(f"a conflict never ends in a host deletion: {action}")


@settings(max_examples=200)
@given(anc=maybe_st, local=maybe_st, remote=maybe_st)
def test_directions_only_move_their_way(anc: V, local: V, remote: V) -> None:
    pull = decide(anc, local, remote, PULL)
    if pull is not None:
        assert pull.kind not in (UP, DEL_R)
        assert pull.then is None  # host wins: nothing is written to the remote
    push = decide(anc, local, remote, PUSH)
    if push is not None:
        assert push.kind not in (DOWN, DEL_L)
        assert push.then in (None, UP, DEL_R)


@settings(max_examples=200)
@given(remote=version_st)
def test_push_leaves_remote_only_files_alone(remote: Version) -> None:
    assert decide(None, None, remote, PUSH) is None


def apply(
    plan: list[Action], local: Mapping[str, Version], remote: Mapping[str, Version]
) -> tuple[dict[str, Version], dict[str, Version]]:
    """Play a plan on an in-memory model of both sides."""
    loc, rem = dict(local), dict(remote)
    for action in plan:
        steps = [action.then] if action.kind is CONFLICT else [action.kind]
        for kind in steps:
            if kind is UP:
                rem[action.path] = loc[action.path]
            elif kind is DOWN:
                loc[action.path] = rem[action.path]
            elif kind is DEL_L:
                del loc[action.path]
            elif kind is DEL_R:
                del rem[action.path]
    return loc, rem


@settings(max_examples=200)
@given(anc=maybe_st, new=maybe_st, local_changed=st.booleans())
def test_sync_propagates_a_one_sided_change(anc: V, new: V, local_changed: bool) -> None:
    if same(anc, new):
        return
    local, remote = (new, anc) if local_changed else (anc, new)
    loc = {"p": local} if local is not None else {}
    rem = {"p": remote} if remote is not None else {}
    base = {"p": anc} if anc is not None else {}
    plan = reconcile(base, loc, rem, SYNC)
    assert all(a.kind is not CONFLICT for a in plan)
    loc2, rem2 = apply(plan, loc, rem)
    assert loc2 == rem2
    assert loc2.get("p") == new


@settings(max_examples=200)
@given(anc=maybe_st, local=maybe_st, remote=maybe_st)
def test_sync_conflicts_only_when_both_changed_differently(anc: V, local: V, remote: V) -> None:
    action = decide(anc, local, remote, SYNC)
    is_conflict = action is not None and action.kind is CONFLICT
    both_present_and_differ = local is not None and remote is not None and local != remote
    both_changed = not same(anc, local) and not same(anc, remote)
    assert is_conflict == (both_present_and_differ and both_changed)
    if is_conflict:
        assert action is not None and action.then is None


def common_ancestor(
    before: Mapping[str, Version],
    local: Mapping[str, Version],
    remote: Mapping[str, Version],
    conflicts: set[str],
) -> dict[str, Version]:
    """The ancestor after a run: the agreed content, or the old row for conflicts."""
    out: dict[str, Version] = {}
    for path in before.keys() | local.keys() | remote.keys():
        if path in conflicts:
            if path in before:
                out[path] = before[path]
        elif local.get(path) == remote.get(path) and path in local:
            out[path] = local[path]
    return out


@settings(max_examples=200)
@given(anc=tree_st, local=tree_st, remote=tree_st)
def test_sync_converges(
    anc: dict[str, Version], local: dict[str, Version], remote: dict[str, Version]
) -> None:
    plan = reconcile(anc, local, remote, SYNC)
    assert [a.path for a in plan] == sorted({a.path for a in plan})
    conflicts = {a.path for a in plan if a.kind is CONFLICT}
    loc2, rem2 = apply(plan, local, remote)
    for path in loc2.keys() | rem2.keys():
        if path not in conflicts:
            assert loc2.get(path) == rem2.get(path), path
    anc2 = common_ancestor(anc, loc2, rem2, conflicts)
    again = reconcile(anc2, loc2, rem2, SYNC)
    assert {a.path for a in again} == conflicts
    assert all(a.kind is CONFLICT for a in again)


@settings(max_examples=200)
@given(anc=tree_st, local=tree_st, remote=tree_st)
def test_push_makes_the_remote_match_the_host(
    anc: dict[str, Version], local: dict[str, Version], remote: dict[str, Version]
) -> None:
    loc2, rem2 = apply(reconcile(anc, local, remote, PUSH), local, remote)
    assert loc2 == local  # push never touches the host
    for path in loc2.keys() | rem2.keys():
        if path not in anc and path not in local:
            assert rem2.get(path) == remote.get(path), path  # never pushed: left alone
        else:
            assert rem2.get(path) == loc2.get(path), path


@settings(max_examples=200)
@given(anc=tree_st, local=tree_st, remote=tree_st)
def test_pull_brings_back_remote_changes_and_keeps_host_edits(
    anc: dict[str, Version], local: dict[str, Version], remote: dict[str, Version]
) -> None:
    loc2, rem2 = apply(reconcile(anc, local, remote, PULL), local, remote)
    assert rem2 == remote  # pull never touches the remote
    for path in anc.keys() | local.keys() | remote.keys():
        a, lo, r = anc.get(path), local.get(path), remote.get(path)
        if not same(a, lo) and lo is not None:
            assert loc2.get(path) == lo, path  # a host edit always survives a pull
        elif same(a, lo) and not same(a, r):
            assert loc2.get(path) == r, path  # an untouched host copy follows the remote


@settings(max_examples=200)
@given(anc=tree_st, local=tree_st, remote=tree_st, direction=direction_st)
def test_reconcile_is_decide_per_path(
    anc: dict[str, Version],
    local: dict[str, Version],
    remote: dict[str, Version],
    direction: Direction,
) -> None:
    plan = {a.path: a for a in reconcile(anc, local, remote, direction)}
    for path in anc.keys() | local.keys() | remote.keys():
        d = decide(anc.get(path), local.get(path), remote.get(path), direction)
        expected = None if d is None else Action(path, d.kind, d.then)
        assert plan.get(path) == expected


# -- type conflicts: a file meeting a directory -------------------------------------------

from filesync.core.reconcile import Clash, settle, side_digest  # noqa: E402

# (case, ancestor, host, remote) as trees -> the plan for push, pull and sync. "p" is the
# name; a directory is the files under "p/". Every row is README's type-conflict rows.
TypeRow = tuple[str, dict[str, Version], dict[str, Version], dict[str, Version],
                list[tuple[str, Kind, Kind | None, str | None]],
                list[tuple[str, Kind, Kind | None, str | None]],
                list[tuple[str, Kind, Kind | None, str | None]]]
P_FILE, P_DIR = {"p": A}, {"p/x": B, "p/y/z": C}
TYPE_TABLE: list[TypeRow] = [
    ("no A, host file, remote dir", {}, P_FILE, P_DIR,
     [("p", CONFLICT, UP, None), ("p/x", DEL_R, None, "p"), ("p/y/z", DEL_R, None, "p")],
     [("p", CONFLICT, None, None)], [("p", CONFLICT, None, None)]),
    ("no A, host dir, remote file", {}, P_DIR, P_FILE,
     [("p", CONFLICT, DEL_R, None), ("p/x", UP, None, "p"), ("p/y/z", UP, None, "p")],
     [("p", CONFLICT, None, None)], [("p", CONFLICT, None, None)]),
    ("A file, host unchanged, remote turned dir", {"p": A}, {"p": A}, P_DIR,
     [("p", CONFLICT, UP, None), ("p/x", DEL_R, None, "p"), ("p/y/z", DEL_R, None, "p")],
     [("p", DEL_L, None, None), ("p/x", DOWN, None, None), ("p/y/z", DOWN, None, None)],
     [("p", DEL_L, None, None), ("p/x", DOWN, None, None), ("p/y/z", DOWN, None, None)]),
    ("A file, host edited, remote turned dir", {"p": A}, {"p": C}, P_DIR,
     [("p", CONFLICT, UP, None), ("p/x", DEL_R, None, "p"), ("p/y/z", DEL_R, None, "p")],
     [("p", CONFLICT, None, None)], [("p", CONFLICT, None, None)]),
    # (push: the file rule alone already saves the edit and replaces it)
    ("A file, host turned dir, remote edited", {"p": A}, P_DIR, {"p": C},
     [("p", CONFLICT, DEL_R, None), ("p/x", UP, None, None), ("p/y/z", UP, None, None)],
     [("p", CONFLICT, None, None)], [("p", CONFLICT, None, None)]),
    ("A file, host turned dir, remote unchanged", {"p": A}, P_DIR, {"p": A},
     [("p", DEL_R, None, None), ("p/x", UP, None, None), ("p/y/z", UP, None, None)],
     [], [("p", DEL_R, None, None), ("p/x", UP, None, None), ("p/y/z", UP, None, None)]),
    ("A dir, host unchanged, remote turned file", P_DIR, P_DIR, {"p": A},
     [("p", CONFLICT, DEL_R, None), ("p/x", UP, None, "p"), ("p/y/z", UP, None, "p")],
     [("p", DOWN, None, None), ("p/x", DEL_L, None, None), ("p/y/z", DEL_L, None, None)],
     [("p", DOWN, None, None), ("p/x", DEL_L, None, None), ("p/y/z", DEL_L, None, None)]),
    ("A dir, host added a file in it, remote turned file", P_DIR, P_DIR | {"p/new": A},
     {"p": A},
     [("p", CONFLICT, DEL_R, None), ("p/new", UP, None, "p"), ("p/x", UP, None, "p"),
      ("p/y/z", UP, None, "p")],
     [("p", CONFLICT, None, None)], [("p", CONFLICT, None, None)]),
]


@pytest.mark.parametrize(("case", "anc", "local", "remote", "push", "pull", "sync"),
                         TYPE_TABLE, ids=[t[0] for t in TYPE_TABLE])
def test_type_conflict_table(
    case: str, anc: dict[str, Version], local: dict[str, Version],
    remote: dict[str, Version], push: list[tuple[str, Kind, Kind | None, str | None]],
    pull: list[tuple[str, Kind, Kind | None, str | None]],
    sync: list[tuple[str, Kind, Kind | None, str | None]],
) -> None:
    for direction, expect in ((PUSH, push), (PULL, pull), (SYNC, sync)):
        plan = reconcile(anc, local, remote, direction)
        assert [(a.path, a.kind, a.then, a.of) for a in plan] == expect, (case, direction)
        for a in plan:
            if a.kind is CONFLICT and direction is not PUSH:
                assert a.clash is not None  # every conflict on the name carries its sides
                assert a.clash.local == tuple(sorted(local))
                assert a.clash.remote == tuple(sorted(remote))
                assert a.clash.remote_dir == ("p" in local)


def test_a_clash_digest_follows_every_file_of_the_directory() -> None:
    base = side_digest(P_DIR, ("p/x", "p/y/z"), "p")
    assert base.startswith("dir:") and side_digest(P_FILE, ("p",), "p") == A.hash
    assert side_digest({"p/x": C, "p/y/z": C}, ("p/x", "p/y/z"), "p") != base
    assert side_digest({"p/x": B, "p/y/w": C}, ("p/x", "p/y/w"), "p") != base
    assert side_digest({"p/x": B, "p/y/z": A_X}, ("p/x", "p/y/z"), "p") != base


TYPE_PATHS = ["c", "c/d", "c/e/f", "c/e", "g"]


def valid_tree(tree: dict[str, Version]) -> dict[str, Version]:
    """A side of one real tree: no name is a file and a directory at once."""
    return {p: v for p, v in tree.items()
            if not any(q.startswith(p + "/") for q in tree)}


type_tree_st = st.dictionaries(st.sampled_from(TYPE_PATHS), version_st,
                               max_size=len(TYPE_PATHS)).map(valid_tree)


def clashes(tree: Mapping[str, Version]) -> list[str]:
    return [p for p in tree if any(q.startswith(p + "/") for q in tree)]


def inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root + "/")


@settings(max_examples=400)
@given(anc=type_tree_st, local=type_tree_st, remote=type_tree_st, direction=direction_st)
def test_a_plan_never_leaves_a_file_and_a_directory_at_one_name(
    anc: dict[str, Version], local: dict[str, Version], remote: dict[str, Version],
    direction: Direction,
) -> None:
    plan = reconcile(anc, local, remote, direction)
    loc2, rem2 = apply(plan, local, remote)
    assert clashes(loc2) == [] and clashes(rem2) == []
    roots = [a.path for a in plan if a.clash is not None]
    for a in plan:
        # Outside a type conflict, every path is decided as a file alone.
        if not any(inside(a.path, r) for r in roots):
            d = decide(anc.get(a.path), local.get(a.path), remote.get(a.path), direction)
            assert d is not None and (a.kind, a.then) == (d.kind, d.then)
        # A step of a type conflict happens only under its saved conflict.
        if a.of is not None:
            assert a.of in roots and inside(a.path, a.of) and direction is PUSH
        # No deletion without an ancestor, but of a push's saved remote side.
        if a.kind is DEL_R and a.path not in anc:
            assert a.of is not None
        assert a.kind is not DEL_L or a.path in anc


@settings(max_examples=400)
@given(anc=type_tree_st, local=type_tree_st, remote=type_tree_st)
def test_type_conflicts_move_nothing_in_sync_and_pull_and_converge_in_push(
    anc: dict[str, Version], local: dict[str, Version], remote: dict[str, Version]
) -> None:
    for direction in (SYNC, PULL):
        plan = reconcile(anc, local, remote, direction)
        roots = [a.path for a in plan if a.clash is not None]
        loc2, rem2 = apply(plan, local, remote)
        for root in roots:  # both sides kept as they were at and under the name
            assert {p: v for p, v in loc2.items() if inside(p, root)} == {
                p: v for p, v in local.items() if inside(p, root)}
            assert {p: v for p, v in rem2.items() if inside(p, root)} == {
                p: v for p, v in remote.items() if inside(p, root)}
    push = reconcile(anc, local, remote, PUSH)
    loc2, rem2 = apply(push, local, remote)
    for root in (a.path for a in push if a.clash is not None):
        assert {p: v for p, v in rem2.items() if inside(p, root)} == {
            p: v for p, v in local.items() if inside(p, root)}


@settings(max_examples=400)
@given(anc=type_tree_st, local=type_tree_st, remote=type_tree_st, keep_local=st.booleans())
def test_settle_makes_both_sides_hold_the_kept_side(
    anc: dict[str, Version], local: dict[str, Version], remote: dict[str, Version],
    keep_local: bool,
) -> None:
    for conflict in reconcile(anc, local, remote, SYNC):
        if conflict.kind is not CONFLICT:
            continue
        steps = settle(conflict, keep_local)
        loc2, rem2 = apply(steps, local, remote)
        kept = local if keep_local else remote
        for side in (loc2, rem2):
            assert {p: v for p, v in side.items() if inside(p, conflict.path)} == {
                p: v for p, v in kept.items() if inside(p, conflict.path)}
        # The remote loses its side only after saving it (a conflict that goes on).
        if any(s.kind is DEL_R or s.then is DEL_R for s in steps) or (
                keep_local and conflict.clash is not None):
            assert steps[0].kind is CONFLICT and steps[0].then is not None


def test_clash_is_a_plain_value() -> None:
    c = Clash(("p",), ("p/x",), "h", "dir:r", remote_dir=True)
    assert Action("p", CONFLICT, clash=c) == Action("p", CONFLICT, clash=c)
