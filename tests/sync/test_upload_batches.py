"""Uploads go in send streams of ``UPLOAD_BATCH`` files, each recorded once the remote
confirmed it: a connection lost after some batches leaves those recorded (the next run
sends only the rest), and nothing of the batch in flight is recorded. A pass run with
an owner of warm state with ``keep_state=False`` (the plain CLI's) leaves no copies of the
state tables in memory; the library's default keeps them for the owner's next pass."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from pathlib import Path

import pytest
from synctree import snapshot, write

from filesync.core.exclude import ExcludeRule
from filesync.core.reconcile import Direction
from filesync.endpoint.contract import Outcome, SendItem
from filesync.endpoint.helper import HelperEndpoint
from filesync.errors import ConnectionLost
from filesync.host.state import PairState
from filesync.sync import transition
from filesync.sync.engine import Options, Report, run_pass
from filesync.sync.warm import WarmState
from filesync.transport.local import local_conduit

RULE = ExcludeRule.build(default_excludes=False)
NAMES = [f"d{i % 2}/f{i}.txt" for i in range(7)]


def _push(tmp: Path, warm: WarmState | None = None) -> Report:
    async def main() -> Report:
        conduit = local_conduit()
        try:
            options = Options(Direction.PUSH, rule=RULE, state_dir=tmp / "state")
            return await run_pass(conduit, tmp / "local", str(tmp / "remote"), options,
                                  warm=warm)
        finally:
            if warm is not None:
                await warm.endpoints.drop_endpoint(conduit)
            await conduit.close()

    return asyncio.run(main())


def test_each_batch_is_its_own_stream_and_recorded_once_confirmed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in NAMES:
        write(tmp_path / "local" / name, name)
    monkeypatch.setattr(transition, "UPLOAD_BATCH", 3)
    real = HelperEndpoint.send
    streams: list[list[str]] = []

    async def send(self: HelperEndpoint, root: str, items: Iterable[SendItem],
                   count: int | None = None) -> list[Outcome]:
        if len(streams) == 2:  # the third stream: the connection drops mid-batch
            raise ConnectionLost("dropped by the test")
        outcomes = await real(self, root, items, count)
        streams.append([o.path for o in outcomes])
        return outcomes

    monkeypatch.setattr(HelperEndpoint, "send", send)
    with pytest.raises(ConnectionLost):
        _push(tmp_path)
    assert [len(s) for s in streams] == [3, 3]
    sent = {p for s in streams for p in s}
    # Both confirmed batches are recorded; the one in flight is not.
    identity = local_conduit().identity
    s = PairState.open(tmp_path / "state", str(tmp_path / "local"), identity,
                       str(tmp_path / "remote"))
    try:
        assert set(s.ancestors()) == sent
    finally:
        s.close()
    monkeypatch.setattr(HelperEndpoint, "send", real)
    report = _push(tmp_path)
    assert report.uploaded == len(NAMES) - 6
    assert snapshot(tmp_path / "remote") == snapshot(tmp_path / "local")


@pytest.mark.parametrize("keep", [True, False])
def test_keep_state_says_whether_the_tables_stay_in_memory(tmp_path: Path, keep: bool) -> None:
    for name in NAMES:
        write(tmp_path / "local" / name, name)
    warm = WarmState(keep_state=keep)
    report = _push(tmp_path, warm)
    assert report.uploaded == len(NAMES)
    if keep:
        assert warm.states is not None
        (kept,) = warm.states._idle.drain()  # the database stays open, with its reads
        assert kept.ancestors is not None and set(kept.ancestors) == set(NAMES)
        assert kept.local is not None  # read (the files are too new to be cached)
        kept.conn.close()
    else:
        assert warm.states is None  # the database was closed, nothing of it kept
    # Either way the next pass finds everything done.
    assert _push(tmp_path, warm).uploaded == 0
    asyncio.run(warm.close())
