"""A pass bounds conflicts/ and undo/, never drops an open conflict, and says what it dropped."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from synctree import write

from filesync.core.exclude import ExcludeRule
from filesync.core.reconcile import Direction
from filesync.host.state import PairState
from filesync.host.undo import undo_in
from filesync.sync.engine import Options, Report, run_pass
from filesync.transport.local import local_conduit

RULE = ExcludeRule.build(default_excludes=False)


def passes(tmp: Path, steps: list[tuple[Direction, dict[str, str], dict[str, str]]],
           keep_runs: int) -> tuple[list[Report], list[str]]:
    """Each step: edits on the host and the remote, then one pass in its direction."""
    local, remote, state = tmp / "local", tmp / "remote", tmp / "state"
    logged: list[str] = []

    async def main() -> list[Report]:
        conduit = local_conduit()
        reports = []
        try:
            for i, (direction, host, far) in enumerate(steps):
                for rel, data in host.items():
                    os.utime(write(local / rel, data), ns=(10**18 + i, 10**18 + i))
                for rel, data in far.items():
                    os.utime(write(remote / rel, data), ns=(10**18 + i, 10**18 + i))
                opts = Options(direction, rule=RULE, state_dir=state, keep_runs=keep_runs,
                               log=logged.append)
                reports.append(await run_pass(conduit, local, str(remote), opts))
        finally:
            await conduit.close()
        return reports

    return asyncio.run(main()), logged


def pair_dir(tmp: Path) -> Path:
    [d] = (tmp / "state" / "pairs").iterdir()
    return d


def test_old_conflict_runs_go_but_an_open_conflict_stays(tmp_path: Path) -> None:
    steps = [(Direction.PUSH, {"c.txt": "base\n", "p0": "base\n", "p1": "base\n",
                               "p2": "base\n"}, {})]
    # c.txt: conflict left open by a sync (run 1).
    steps.append((Direction.SYNC, {"c.txt": "host\n"}, {"c.txt": "remote\n"}))
    # p0..p2: one conflict per pull, settled by the next step (both sides made equal).
    for i in range(3):
        settle = {f"p{i - 1}": f"remote {i - 1}\n"} if i else {}
        steps.append((Direction.PULL, {f"p{i}": f"host {i}\n", **settle},
                      {f"p{i}": f"remote {i}\n"}))
    reports, logged = passes(tmp_path, steps, keep_runs=1)
    open_copy = Path(next(c.saved_to for c in reports[-1].open_conflicts if c.path == "c.txt")
                     or "")
    assert open_copy.read_text() == "remote\n"  # run 1, far older than the bound
    conflicts = pair_dir(tmp_path) / "conflicts"
    kept = sorted(p.name for p in conflicts.iterdir() if p.is_dir())  # runs, not .sizes
    assert len(kept) == 2 and open_copy.relative_to(conflicts.resolve()).parts[0] in kept
    dropped = [p.path for r in reports for p in r.pruned if p.path.parent == conflicts]
    assert len(dropped) == 2 and not any(p.exists() for p in dropped)
    assert any("retention: dropped" in line for line in logged)
    assert sorted(c.path for c in reports[-1].open_conflicts) == ["c.txt", "p2"]


def test_undo_keeps_the_last_runs_and_still_undoes_the_last_pull(tmp_path: Path) -> None:
    steps = [(Direction.PUSH, {"a.txt": "v0\n"}, {})]
    steps += [(Direction.PULL, {}, {"a.txt": f"v{i}\n"}) for i in range(1, 5)]
    reports, _ = passes(tmp_path, steps, keep_runs=2)
    undo = pair_dir(tmp_path) / "undo"
    assert len([p for p in undo.iterdir() if p.is_dir()]) == 2  # runs, not .sizes
    assert sum(len(r.pruned) for r in reports) == 2
    meta = json.loads((pair_dir(tmp_path) / "pair.json").read_text())
    state = PairState.open(tmp_path / "state", meta["local"], meta["remote"], meta["remote_root"])
    try:
        assert undo_in(state, tmp_path / "local") == ["a.txt"]
    finally:
        state.close()
    assert (tmp_path / "local" / "a.txt").read_text() == "v3\n"
