"""Each session owns its warm state (``filesync.sync.warm.WarmState``): two sessions of one
process share none of it, and closing one ends what it holds and nothing of the other's.
Over the local transport (the remote is a directory, its helper a local process)."""

from __future__ import annotations

from pathlib import Path

from synctree import snapshot, write

from filesync import AsyncSession, Mapping


async def test_two_sessions_of_one_process_share_no_warm_state(tmp_path: Path) -> None:
    local, remote, state = tmp_path / "local", tmp_path / "remote", tmp_path / "state"
    write(local / "a.txt", "a\n")
    remote.mkdir()
    mapping = Mapping(local, "skills")
    one = AsyncSession(remote, state_dir=state, watch=True)
    two = AsyncSession(remote, state_dir=state, watch=True)
    try:
        assert (await one.push(mapping)).uploaded == 1
        assert (await two.push(mapping)).uploaded == 0
        held = [s._warm for s in (one, two)]
        assert held[0] is not held[1]
        for warm in held:
            # Each holds its own endpoint, state database, watched tree and pair memo.
            assert warm.states is not None and warm.trees is not None
            assert (len(warm.endpoints), len(warm.states), len(warm.trees)) == (1, 1, 1)
        assert held[0].memo(str(local), str(remote / "skills")) is not \
            held[1].memo(str(local), str(remote / "skills"))

        await one.close()
        states, trees = held[0].states, held[0].trees
        assert states is not None and trees is not None
        assert (len(held[0].endpoints), len(states), len(trees)) == (0, 0, 0)
        # The other session's warm state is whole: its next pass runs on it.
        assert (len(held[1].endpoints), len(held[1].states or ()), len(held[1].trees or ())
                ) == (1, 1, 1)
        write(local / "b.txt", "b\n")
        assert (await two.push(mapping)).uploaded == 1
        assert two.connections_opened == 1
        assert snapshot(remote / "skills") == snapshot(local)
    finally:
        await one.close()
        await two.close()
    assert (len(held[1].endpoints), len(held[1].states or ()), len(held[1].trees or ())
            ) == (0, 0, 0)
