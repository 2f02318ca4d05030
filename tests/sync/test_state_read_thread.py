"""The pass reads its state tables in a thread while it waits for the remote listing; the
thread is always done with the state database before the pass goes on or unwinds (and
closes it), even when the listing fails or the pass is cancelled."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from synctree import write

from filesync.core.exclude import ExcludeRule
from filesync.core.reconcile import Direction
from filesync.endpoint.helper import HelperEndpoint
from filesync.errors import TransportError
from filesync.host.state import PairState
from filesync.sync.engine import Options, run_pass
from filesync.sync.plan import wait_out
from filesync.transport.local import local_conduit

RULE = ExcludeRule.build(default_excludes=False)


def test_wait_out_outlasts_a_cancellation_then_raises_it() -> None:
    release = threading.Event()

    async def main() -> tuple[bool, bool]:
        loop = asyncio.get_running_loop()
        fut = loop.run_in_executor(None, release.wait)
        waiter = asyncio.ensure_future(wait_out(fut))
        for _ in range(5):
            await asyncio.sleep(0)
        waiter.cancel()
        for _ in range(20):  # the cancellation is delivered, the wait goes on
            await asyncio.sleep(0)
        still_waiting = not waiter.done()
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        return still_waiting, fut.done()

    still_waiting, thread_done = asyncio.run(main())
    assert still_waiting and thread_done


def test_a_failed_listing_waits_for_the_state_read_before_closing_the_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path / "local" / "a.txt", "a\n")
    inside, release = threading.Event(), threading.Event()
    reading: list[bool] = []  # True while the read thread is in ancestors()
    closed_while_reading: list[bool] = []
    real_ancestors, real_close = PairState.ancestors, PairState.close

    def ancestors(self: PairState) -> Any:
        reading.append(True)
        inside.set()
        release.wait(60)
        try:
            return real_ancestors(self)
        finally:
            reading.append(False)

    def close(self: PairState) -> None:
        closed_while_reading.append(bool(reading) and reading[-1])
        real_close(self)

    async def list_tree(self: HelperEndpoint, root: str, rule: ExcludeRule) -> Any:
        await asyncio.get_running_loop().run_in_executor(None, inside.wait, 60)
        release.set()  # the read goes on while the failure unwinds the pass
        raise TransportError("the listing failed (test)")

    monkeypatch.setattr(PairState, "ancestors", ancestors)
    monkeypatch.setattr(PairState, "close", close)
    monkeypatch.setattr(HelperEndpoint, "list_tree", list_tree)

    async def main() -> None:
        conduit = local_conduit()
        try:
            await run_pass(conduit, tmp_path / "local", str(tmp_path / "remote"),
                           Options(Direction.PUSH, rule=RULE, state_dir=tmp_path / "state"))
        finally:
            await conduit.close()

    with pytest.raises(TransportError, match="listing failed"):
        asyncio.run(main())
    assert reading == [True, False] and closed_while_reading == [False]
