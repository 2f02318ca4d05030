"""The host walk that ``run_pass`` starts before the helper (``planning.start_walk``).

It runs while the helper starts (over SSH: while ssh still logs in); ``scan`` uses it
unless the replay of an interrupted apply changed the host tree after it was taken. A
pass that fails has waited for it first: no walk outlives the pass that started it.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from synctree import write
from walkscript import ScriptedWalks, fail_helper_start_while_walking

from filesync.core.exclude import ExcludeRule
from filesync.core.reconcile import Direction
from filesync.endpoint.connect import Endpoints
from filesync.errors import TransportError
from filesync.host.apply import HostOp
from filesync.host.journal import Journal
from filesync.host.state import PairState
from filesync.sync import plan as planning
from filesync.sync.engine import Options, run_pass
from filesync.sync.inputs import PassInputs, Scans
from filesync.sync.staging import StagingSink
from filesync.transport.local import local_conduit

RULE = ExcludeRule.build(default_excludes=False)


def scan_with_early_walk(tmp: Path, *, journal_deletes: str | None) -> Scans:
    local, remote, state_dir = tmp / "local", tmp / "remote", tmp / "state"
    remote.mkdir()

    async def main() -> Scans:
        conduit = local_conduit()
        try:
            walk = planning.start_walk(local, RULE, None)
            await walk.listing  # taken before anything below changes the tree
            endpoints = Endpoints()
            session = await endpoints.endpoint_for(conduit)
            root = session.resolve_root(str(remote))
            state = PairState.open(state_dir, str(local), conduit.identity, root)
            try:
                if journal_deletes is not None:
                    st = (local / journal_deletes).stat()
                    Journal("crashed", [HostOp("delete", journal_deletes,
                                               [st.st_size, st.st_mtime_ns])]
                            ).save(state.journal_path)
                run_id = f"{time.time_ns():020d}-test"
                inputs = PassInputs(Options(Direction.PUSH, rule=RULE, state_dir=state_dir),
                                    session, state, local, root, run_id, time.time_ns(),
                                    StagingSink(state.staging / run_id))
                return await planning.scan(inputs, await planning.recover_host(inputs, walk))
            finally:
                state.close()
        finally:
            await endpoints.close()
            await conduit.close()

    return asyncio.run(main())


def test_the_early_walk_is_the_scan_of_the_host(tmp_path: Path) -> None:
    write(tmp_path / "local" / "a.txt", "a\n")
    scans = scan_with_early_walk(tmp_path, journal_deletes=None)
    assert set(scans.local.listing.files()) == {"a.txt"}


def test_a_walk_taken_before_a_journal_replay_is_walked_again(tmp_path: Path) -> None:
    write(tmp_path / "local" / "keep.txt", "k\n")
    write(tmp_path / "local" / "gone.txt", "g\n")
    scans = scan_with_early_walk(tmp_path, journal_deletes="gone.txt")
    assert not (tmp_path / "local" / "gone.txt").exists()  # the replay deleted it
    assert set(scans.local.listing.files()) == {"keep.txt"}


def test_a_pass_whose_helper_fails_to_start_waits_for_its_walk(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path / "local" / "a.txt", "a\n")
    walks = ScriptedWalks(monkeypatch, hold=True)
    failure = TransportError("the helper did not start (test)")
    fail_helper_start_while_walking(monkeypatch, walks, failure)

    async def main() -> None:
        conduit = local_conduit()
        try:
            with pytest.raises(TransportError) as raised:
                await run_pass(conduit, tmp_path / "local", str(tmp_path / "remote"),
                               Options(Direction.PUSH, rule=RULE, state_dir=tmp_path / "s"))
            walks.events.append("pass returned")
            assert raised.value is failure
        finally:
            walks.release.set()
            await conduit.close()

    asyncio.run(main())
    assert walks.events == ["walk done", "pass returned"]
