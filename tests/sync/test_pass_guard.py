"""``run_pass(guard=...)``: the check a pass runs while both sides list (the CLI's self-sync
check). It is awaited before anything is recovered, fetched or applied: a guard that raises
leaves both trees, an interrupted apply's journal and the remote exactly as they were."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from synctree import snapshot, write

from filesync.core.exclude import ExcludeRule
from filesync.core.reconcile import Direction
from filesync.endpoint.contract import Endpoint
from filesync.errors import SelfSync
from filesync.host.apply import HostOp
from filesync.host.journal import Journal
from filesync.host.state import PairState
from filesync.sync.engine import Options, Report, run_pass
from filesync.transport.base import RemoteProcess
from filesync.transport.local import local_conduit

RULE = ExcludeRule.build(default_excludes=False)


def _pass(tmp: Path, direction: Direction, refuse: bool,
          seen: list[tuple[Path, str]]) -> Report:
    async def guard(_endpoint: Endpoint, local_root: Path, remote_root: str) -> None:
        seen.append((local_root, remote_root))
        await asyncio.sleep(0)  # a real guard waits on the remote
        if refuse:
            raise SelfSync("refused by the test guard")

    async def main() -> Report:
        conduit = local_conduit()
        try:
            opts = Options(direction, rule=RULE, state_dir=tmp / "state")
            return await run_pass(conduit, tmp / "local", str(tmp / "remote"), opts,
                                  guard=guard)
        finally:
            await conduit.close()

    return asyncio.run(main())


@pytest.mark.parametrize("direction", [Direction.PUSH, Direction.PULL, Direction.SYNC])
def test_a_guard_that_raises_changes_nothing(tmp_path: Path, direction: Direction) -> None:
    write(tmp_path / "local" / "host.txt", "host\n")
    write(tmp_path / "remote" / "remote.txt", "remote\n")
    before = snapshot(tmp_path / "local"), snapshot(tmp_path / "remote")
    seen: list[tuple[Path, str]] = []
    with pytest.raises(SelfSync):
        _pass(tmp_path, direction, True, seen)
    assert seen == [(tmp_path / "local", str(tmp_path / "remote"))]
    assert (snapshot(tmp_path / "local"), snapshot(tmp_path / "remote")) == before


def test_an_interrupted_apply_is_not_recovered_before_the_guard_passes(tmp_path: Path) -> None:
    write(tmp_path / "local" / "gone.txt", "g\n")
    (tmp_path / "remote").mkdir()
    # A journal as a crashed apply leaves it: the next pass replays it before listing.
    conduit_identity = local_conduit().identity
    state = PairState.open(tmp_path / "state", str(tmp_path / "local"), conduit_identity,
                           str(tmp_path / "remote"))
    st = (tmp_path / "local" / "gone.txt").stat()
    Journal("crashed", [HostOp("delete", "gone.txt", [st.st_size, st.st_mtime_ns])]
            ).save(state.journal_path)
    journal = state.journal_path
    state.close()
    with pytest.raises(SelfSync):
        _pass(tmp_path, Direction.PUSH, True, [])
    assert (tmp_path / "local" / "gone.txt").exists() and journal.exists()
    # Once the guard passes, the same pass replays it (and then pushes what is left).
    report = _pass(tmp_path, Direction.PUSH, False, [])
    assert not (tmp_path / "local" / "gone.txt").exists() and not journal.exists()
    assert report.uploaded == 0


def test_the_self_sync_check_rides_the_pass_helper_while_it_lists(tmp_path: Path) -> None:
    # The CLI's guard asks the pass's own helper, while its first listing is pending: the
    # listing still arrives whole, and no other remote process is started.
    from filesync.session.selfsync import refuse_self_sync

    write(tmp_path / "local" / "a.txt", "a\n")
    write(tmp_path / "remote" / "b.txt", "b\n")
    started: list[str] = []

    async def main(remote: Path) -> Report:
        conduit = local_conduit()
        start = conduit.start

        async def counted(command: str) -> RemoteProcess:
            started.append(command)
            return await start(command)

        conduit.start = counted  # type: ignore[method-assign]
        try:
            opts = Options(Direction.SYNC, rule=RULE, state_dir=tmp_path / "state")
            return await run_pass(conduit, tmp_path / "local", str(remote), opts,
                                  guard=refuse_self_sync)
        finally:
            await conduit.close()

    report = asyncio.run(main(tmp_path / "remote"))
    assert (report.uploaded, report.downloaded) == (1, 1) and len(started) == 1
    with pytest.raises(SelfSync):
        asyncio.run(main(tmp_path / "local"))
    assert len(started) == 2
