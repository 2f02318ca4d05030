"""The safety guards as pure functions: each refusal, its threshold and ``force``."""

from __future__ import annotations

import pytest

from filesync.core.guards import MASS_DELETE_MIN, check_deletions, check_roots
from filesync.core.reconcile import Action, Direction, Kind
from filesync.errors import SafetyRefusal


@pytest.mark.parametrize("direction", [Direction.PULL, Direction.SYNC])
def test_an_empty_remote_with_tracked_files_is_refused_for_pull_and_sync(
    direction: Direction,
) -> None:
    with pytest.raises(SafetyRefusal, match="remote root /r is missing or empty but 3 files"):
        check_roots(direction, 3, 5, 0, "/l", "/r")
    check_roots(direction, 3, 5, 0, "/l", "/r", force=True)
    check_roots(direction, 0, 5, 0, "/l", "/r")  # nothing was ever synced: a first run
    check_roots(Direction.PUSH, 3, 5, 0, "/l", "/r")  # push never reads the remote's absence


@pytest.mark.parametrize("direction", [Direction.PUSH, Direction.SYNC])
def test_an_empty_local_root_with_tracked_files_is_refused_for_push_and_sync(
    direction: Direction,
) -> None:
    with pytest.raises(SafetyRefusal, match=r"local root /l is missing or empty .*unmounted"):
        check_roots(direction, 3, 0, 5, "/l", "/r")
    check_roots(direction, 3, 0, 5, "/l", "/r", force=True)
    check_roots(Direction.PULL, 3, 0, 5, "/l", "/r")


def _deletes(n: int, kind: Kind = Kind.DELETE_REMOTE) -> list[Action]:
    return [Action(f"f{i}", kind) for i in range(n)]


def test_mass_deletion_needs_more_than_the_minimum_and_more_than_half() -> None:
    over = MASS_DELETE_MIN + 1
    with pytest.raises(SafetyRefusal, match=f"would delete {over} of {2 * over - 1} tracked"):
        check_deletions(_deletes(over), 2 * over - 1)
    check_deletions(_deletes(over), 2 * over)  # exactly half: allowed
    check_deletions(_deletes(MASS_DELETE_MIN), MASS_DELETE_MIN)  # not more than the minimum
    check_deletions(_deletes(over), over, force=True)


def test_every_kind_of_deletion_counts_conflict_outcomes_included() -> None:
    plan = (_deletes(10, Kind.DELETE_LOCAL) + _deletes(10, Kind.DELETE_REMOTE)
            + [Action("c", Kind.CONFLICT, Kind.DELETE_REMOTE), Action("u", Kind.UPLOAD)])
    with pytest.raises(SafetyRefusal, match="would delete 21 of 30"):
        check_deletions(plan, 30)


@pytest.mark.parametrize("direction,local,remote", [
    (Direction.PULL, 5, 0), (Direction.PUSH, 0, 5), (Direction.SYNC, 0, 5),
])
def test_a_side_emptied_by_the_exclusion_rule_is_named_as_such(
    direction: Direction, local: int, remote: int,
) -> None:
    with pytest.raises(SafetyRefusal) as err:
        check_roots(direction, 3, local, remote, "/l", "/r",
                    local_excluded=7, remote_excluded=7)
    assert "is excluded (7 pruned)" in str(err.value) and "missing" not in str(err.value)
    assert "--exclude" in str(err.value)
