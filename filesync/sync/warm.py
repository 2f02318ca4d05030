"""``WarmState``: everything one owner keeps between its passes, and nothing else does.

Its owners: each ``AsyncSession`` (and the blocking ``Session`` through it), each CLI
run, the agent for its life. A pass is handed its owner's ``WarmState`` (``run_pass``'s
``warm``), or none: a cold pass keeps nothing and ends the endpoint it started.

Guarantees:

- what it holds: the endpoint of each conduit (``Endpoints``); the idle state databases
  with their reads (``StatePool``, only with ``keep_state``); the watched host trees
  (``WatchedTrees``) and the per-pair memos (``PassMemos``), only once watching;
- two owners never share any of it, so two sessions of one process are as independent
  as two processes (the pair lock still keeps two runs of one pair apart);
- ``close`` ends every endpoint politely, closes every idle database and ends every
  watch; the conduits are the owner's to close. A closed ``WarmState`` starts afresh if
  used again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from filesync.core import deferred
from filesync.endpoint.connect import Endpoints
from filesync.host.state import StatePool
from filesync.sync.memo import PassMemo, PassMemos

if TYPE_CHECKING:
    from filesync.host.watched import WatchedTrees


class WarmState:
    """The warm state of one owner (see the module docstring).

    ``watch``: keep both sides' trees watched between passes (the host's here, the
    remote's in its helper) and each pair's memo, so that a pass lists again only the
    directories that changed: for owners that run many passes over one connection (the
    agent, terminal backends, a watching session). ``keep_state``: keep each pair's state
    tables in memory after a pass, in step with its writes, so that the owner's next pass
    of the pair reads none of them again; an owner that runs one pass per pair (the plain
    CLI) says False, as a 100k-file pair's copies cost ~30 MB it would never use.
    """

    def __init__(self, *, watch: bool = False, keep_state: bool = True) -> None:
        self.endpoints = Endpoints()
        self.states: StatePool | None = StatePool() if keep_state else None
        self.trees: WatchedTrees | None = None
        self.memos: PassMemos | None = None
        if watch:
            self.start_watching()

    @property
    def watching(self) -> bool:
        return self.trees is not None

    def start_watching(self) -> None:
        """Watch from the next pass on (a session's first ``watch`` call)."""
        if self.trees is None:
            # Loaded here: the watch code (inotify, its threads) is loaded only by an owner
            # that watches, never by a single pass.
            self.trees = deferred.load("filesync.host.watched").WatchedTrees()
            self.memos = PassMemos()

    def memo(self, local_root: str, remote_root: str) -> PassMemo | None:
        """The pair's memo; None unless watching."""
        return self.memos.for_pair(local_root, remote_root) if self.memos is not None else None

    async def close(self) -> None:
        try:
            await self.endpoints.close()
        finally:
            if self.states is not None:
                self.states.close()
            if self.trees is not None:
                self.trees.close()
                self.memos = PassMemos()
