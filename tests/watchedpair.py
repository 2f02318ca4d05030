"""Watched passes of one pair on one local conduit (the helper is a local process), as
the agent, the terminal backends and ``filesync watch`` run them: passes through
``run_pass`` with a watching ``WarmState`` on a conduit kept open between them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

from filesync.core.exclude import ExcludeRule
from filesync.core.reconcile import Direction
from filesync.sync.engine import Options, Report, run_pass
from filesync.sync.warm import WarmState
from filesync.transport.local import local_conduit

RULE = ExcludeRule.build(default_excludes=False)


class WatchedPair:
    """``tmp/local`` and ``tmp/remote``, with their state in ``tmp/state``."""

    def __init__(self, tmp: Path) -> None:
        self.local, self.remote = tmp / "local", tmp / "remote"
        self.state = tmp / "state"
        self.local.mkdir(exist_ok=True)
        self.remote.mkdir(exist_ok=True)
        self.loop = asyncio.new_event_loop()
        self.conduit = local_conduit()
        self.warm = WarmState(watch=True)

    def run(self, direction: Direction = Direction.SYNC, watch: bool = True) -> Report:
        """One pass; ``watch=False`` runs it cold (nothing kept, nothing carried)."""
        opts = Options(direction, rule=RULE, state_dir=self.state)
        return self.loop.run_until_complete(
            run_pass(self.conduit, self.local, str(self.remote), opts,
                     warm=self.warm if watch else None))

    def close(self) -> None:
        async def end() -> None:
            await self.warm.close()
            await self.conduit.close()

        self.loop.run_until_complete(end())
        self.loop.close()


@contextlib.contextmanager
def watched_pair(tmp: Path) -> Iterator[WatchedPair]:
    """A ``WatchedPair`` under ``tmp``, closed on the way out."""
    pair = WatchedPair(tmp)
    try:
        yield pair
    finally:
        pair.close()
