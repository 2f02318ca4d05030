"""Scripting of a pass's host walk and of the helper's start, for the tests of the walk
that runs while the helper starts (``filesync.sync.plan.start_walk``): every wait is on
an event another thread sets, bounded only so that a broken rule fails instead of hanging.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from filesync.endpoint.helper import HelperEndpoint
from filesync.errors import FilesyncError
from filesync.sync import plan as planning
from filesync.transport.base import Conduit

#: A generous bound on waits for another thread: reached only when the rule under test is
#: broken (the awaited event never comes), never by a slow machine.
BOUND = 120


class ScriptedWalks:
    """The host walk (``list_local``, as the planner calls it) counted, and each call's
    end noted in ``events``; with ``hold``, a walk waits inside until ``release``, which
    ``release_on_join`` sets once the walk's starter waits for it (``Walk.join``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, hold: bool = False) -> None:
        self.monkeypatch = monkeypatch
        self.calls = 0
        self.events: list[str] = []
        self.inside, self.done, self.release = (threading.Event(), threading.Event(),
                                                threading.Event())
        if not hold:
            self.release.set()
        real = planning.list_local

        def walk(*args: Any) -> Any:
            self.calls += 1
            self.inside.set()
            try:
                assert self.release.wait(BOUND)
                return real(*args)
            finally:
                self.events.append("walk done")
                self.done.set()

        monkeypatch.setattr(planning, "list_local", walk)

    def release_on_join(self) -> None:
        real = planning.Walk.join

        async def join(walk: planning.Walk) -> None:
            self.release.set()
            await real(walk)

        self.monkeypatch.setattr(planning.Walk, "join", join)


def script_helper_start(monkeypatch: pytest.MonkeyPatch,
                        before: Callable[[], Awaitable[None]]) -> None:
    """``HelperEndpoint.start`` awaits ``before()`` first (which may raise)."""
    real = HelperEndpoint.start

    async def start(conduit: Conduit, **kw: Any) -> HelperEndpoint:
        await before()
        return await real(conduit, **kw)

    monkeypatch.setattr(HelperEndpoint, "start", start)


def fail_helper_start_while_walking(monkeypatch: pytest.MonkeyPatch, walks: ScriptedWalks,
                                    failure: FilesyncError) -> None:
    """The helper fails to start (``failure``) while the host walk is under way, and the
    walk goes on until its starter waits for it."""

    async def fail() -> None:
        assert await asyncio.to_thread(walks.inside.wait, BOUND)
        raise failure

    script_helper_start(monkeypatch, fail)
    walks.release_on_join()
