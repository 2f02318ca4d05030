"""``Session`` from threads: no event loop needed, concurrent calls serialized, close from
another thread, calls after close refused; one connection across calls."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sessionkit import Factory
from synctree import snapshot, write

import filesync.session.aio as aio
from filesync import (
    AsyncSession,
    FilesyncError,
    Mapping,
    Session,
    SessionClosed,
    SessionTimeout,
    UsageError,
)
from filesync.transport.base import Conduit


def _in_thread(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in a new thread (which has no event loop) and return or raise its result."""
    out: list[Any] = []

    def body() -> None:
        try:
            with pytest.raises(RuntimeError):
                asyncio.get_running_loop()  # really no loop in this thread
            out.append((True, fn()))
        except BaseException as exc:
            out.append((False, exc))

    t = threading.Thread(target=body)
    t.start()
    t.join()
    ok, value = out[0]
    if not ok:
        raise value
    return value


@pytest.fixture
def tree(tmp_path: Path) -> Mapping:
    write(tmp_path / "home" / "skills" / "a.md", "a\n")
    return Mapping(tmp_path / "home" / "skills", "skills")


def test_a_worker_thread_with_no_loop_pushes_and_pulls(tmp_path: Path, tree: Mapping,
                                                       factory: Factory) -> None:
    box = tmp_path / "box"
    s = Session(box, conduit=factory, state_dir=tmp_path / "state")

    def work() -> tuple[int, int]:
        up = s.push(tree).uploaded
        write(box / "skills" / "b.md", "b\n")
        down = s.pull(tree).downloaded
        s.sync(tree)
        s.status(tree)
        s.close()
        return up, down

    assert _in_thread(work) == (1, 1)
    assert (Path(tree.local) / "b.md").read_text() == "b\n"
    assert len(factory.opened) == 1  # one connection for all four calls
    assert factory.opened[0].closed  # and close() closed it


def test_the_default_transport_opens_one_connection_for_all_calls(
    tmp_path: Path, tree: Mapping, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[Conduit] = []
    real = aio.open_conduit

    async def counting(*args: Any) -> Conduit:
        opened.append(await real(*args))
        return opened[-1]

    monkeypatch.setattr(aio, "open_conduit", counting)
    with Session(tmp_path / "box", state_dir=tmp_path / "state") as s:
        for call in (s.push, s.pull, s.sync, s.status, s.push):
            call(tree)
        assert s.connections_opened == 1
    assert len(opened) == 1


def test_a_dead_connection_is_replaced_on_the_next_call(tmp_path: Path, tree: Mapping,
                                                        factory: Factory) -> None:
    with Session(tmp_path / "box", conduit=factory, state_dir=tmp_path / "state") as s:
        s.push(tree)
        asyncio.run(factory.opened[0].close())  # dropped under the session's feet
        write(Path(tree.local) / "c.md", "c\n")
        assert s.push(tree).uploaded == 1
        assert s.connections_opened == 2 and len(factory.opened) == 2


def test_concurrent_calls_from_many_threads_are_serialized(tmp_path: Path, tree: Mapping,
                                                           factory: Factory) -> None:
    # lock_timeout 0: two passes of the pair at once would make one fail with LockBusy,
    # and two on one helper stream would garble it.
    box = tmp_path / "box"
    s = Session(box, conduit=factory, state_dir=tmp_path / "state", lock_timeout=0)
    start = threading.Barrier(8)
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        start.wait()
        try:
            write(Path(tree.local) / f"w{i}.md", f"{i}\n")
            (s.push if i % 2 else s.sync)(tree)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s.close()
    assert errors == []
    assert {f"skills/w{i}.md" for i in range(8)} <= set(snapshot(box))
    assert len(factory.opened) == 1


def test_close_from_another_thread_waits_for_the_running_call(
    tmp_path: Path, tree: Mapping, factory: Factory
) -> None:
    box = tmp_path / "box"
    s = Session(box, conduit=factory, state_dir=tmp_path / "state")
    s.status(tree)  # connected; the next command is held at the gate
    conduit = factory.opened[0]
    conduit.gate.clear()
    write(Path(tree.local) / "late.md", "late\n")
    results: list[Any] = []
    pusher = threading.Thread(target=lambda: results.append(s.push(tree)))
    pusher.start()
    assert conduit.waiting.wait(60)
    closer = threading.Thread(target=s.close)
    closer.start()
    _poll(lambda: s._closed)  # close() has begun while the push is held
    with pytest.raises(SessionClosed):
        s.push(tree)  # a new call is refused at once
    conduit.gate.set()
    pusher.join()
    closer.join()
    assert results[0].uploaded == 2  # the held push ran to its end, not cut by close
    assert (box / "skills" / "late.md").read_text() == "late\n"
    assert conduit.closed
    assert s._thread is not None and not s._thread.is_alive()  # the loop thread stopped


def test_calls_after_close_raise_a_clear_error(tmp_path: Path, tree: Mapping,
                                               factory: Factory) -> None:
    s = Session(tmp_path / "box", conduit=factory, state_dir=tmp_path / "state")
    s.close()  # before any call: nothing to close, still closed
    with pytest.raises(SessionClosed) as err:
        s.push(tree)
    assert isinstance(err.value, FilesyncError) and "closed" in str(err.value)
    s2 = Session(tmp_path / "box", conduit=factory, state_dir=tmp_path / "state")
    s2.push(tree)
    _in_thread(s2.close)
    s2.close()  # twice is fine
    with pytest.raises(SessionClosed):
        _in_thread(lambda: s2.pull(tree))


def test_a_call_from_inside_the_sessions_loop_is_refused(tmp_path: Path, tree: Mapping,
                                                        factory: Factory) -> None:
    seen: list[BaseException] = []
    holder: list[Session] = []

    async def reentrant() -> Conduit:
        try:  # the factory runs in the session's loop: a blocking call there would hang
            holder[0].status(tree)
        except UsageError as exc:
            seen.append(exc)
        return await factory()

    with Session(tmp_path / "box", conduit=reentrant, state_dir=tmp_path / "state") as s:
        holder.append(s)
        assert s.push(tree).uploaded == 1
    assert seen and "its own" in str(seen[0])


def test_timeout_bounds_a_call(tmp_path: Path, tree: Mapping, factory: Factory) -> None:
    with Session(tmp_path / "box", conduit=factory, state_dir=tmp_path / "state",
                 timeout=600) as s:
        s.push(tree)
        factory.opened[0].gate.clear()  # the next command never starts
        s._impl.timeout = 0.2  # short only for the call that cannot finish
        with pytest.raises(SessionTimeout):
            s.push(tree)
        s._impl.timeout = 600
        factory.opened[0].gate.set()
        assert s.push(tree).uploaded == 0  # usable again, nothing half-applied


async def test_async_session_in_a_loop(tmp_path: Path, tree: Mapping, factory: Factory) -> None:
    async with AsyncSession(tmp_path / "box", conduit=factory,
                            state_dir=tmp_path / "state") as s:
        a, b = await asyncio.gather(s.push(tree), s.sync(tree))
        assert a.uploaded == 1 and b.uploaded == 0
    with pytest.raises(SessionClosed):
        await s.status(tree)
    assert len(factory.opened) == 1


def _poll(cond: Callable[[], bool]) -> None:
    done = threading.Event()
    for _ in range(6000):
        if cond():
            return
        done.wait(0.01)
    raise AssertionError("condition not reached within 60 s")
