"""Durability is paid per batch, in the order that keeps every file old-or-new after a crash.

On both sides -- the host's pull (staging, then the journaled apply) and the remote
helper's ``send`` -- the system calls are recorded as they happen (``os.fsync`` and
``os.rename`` wrapped, each descriptor named through ``/proc/self/fd``), and the test
holds them to the rule:

- a file's data is fsynced before it is renamed into place;
- every directory that received a file is fsynced after the last rename into it, and
  only once (not once per file);
- the data of the whole batch is flushed before the first rename (the flushes are
  batched, not paid one file at a time between writes).

The crash tests (test_reliability_apply.py, _kill.py, _faults.py) hold the outcome; this
one holds the order that outcome depends on under power loss, which no test can cut.
"""

from __future__ import annotations

import io
import json
import os
import struct
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from synctree import Pair, write

from filesync.tree.dirfd import Batch
from filesync.tree.server import serve

Event = tuple[str, str, str]  # ("fsync", path, "") or ("rename", src, dst)


def _fd_path(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


def _at(path: Any, dir_fd: int | None) -> str:
    path = os.fsdecode(path)
    if dir_fd is None or os.path.isabs(path):
        return os.path.abspath(path)
    return os.path.join(_fd_path(dir_fd), path)


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> list[Event]:
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs /proc/self/fd to name descriptors")
    log: list[Event] = []
    real_fsync: Callable[[int], None] = os.fsync
    real_rename = os.rename

    def fsync(fd: int) -> None:
        log.append(("fsync", _fd_path(fd), ""))
        real_fsync(fd)

    def rename(src: Any, dst: Any, *, src_dir_fd: int | None = None,
               dst_dir_fd: int | None = None) -> None:
        log.append(("rename", _at(src, src_dir_fd), _at(dst, dst_dir_fd)))
        real_rename(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)
    return log


def assert_ordered(log: list[Event], placed: set[str]) -> None:
    """The rule of the module docstring, for the renames whose target is in ``placed``."""
    renames = [(i, src, dst) for i, (kind, src, dst) in enumerate(log)
               if kind == "rename" and dst in placed]
    assert {dst for _, _, dst in renames} == placed
    fsyncs = [(i, path) for i, (kind, path, _) in enumerate(log) if kind == "fsync"]
    first_rename = renames[0][0]
    for i, src, dst in renames:
        data = [j for j, path in fsyncs if path == src]
        assert data and data[-1] < i, f"{dst}: data not fsynced before its rename"
        assert data[-1] < first_rename, f"{dst}: data flushed between renames, not batched"
        parent = os.path.dirname(dst)
        flushed = [j for j, path in fsyncs if path == parent]
        assert len(flushed) == 1, f"{parent}: fsynced {len(flushed)} times, not once"
        assert flushed[0] > i, f"{parent}: directory fsynced before the rename into it"


# -- the host: a pull stages, then applies ---------------------------------------------------


def test_host_pull_flushes_data_then_renames_then_each_directory_once(
    tmp_path: Path, events: list[Event]
) -> None:
    pair = Pair(tmp_path / "local", tmp_path / "remote", tmp_path / "state")
    names = [f"{d}/f{i}.txt" for d in ("a", "b", "c/d") for i in range(4)]
    for rel in names:
        write(pair.remote / rel, f"old {rel}")
    pair.ok("pull")
    for rel in names:  # replaced on the remote, so the pull replaces them on the host
        write(pair.remote / rel, f"new {rel} " * 3)
    events.clear()
    report = pair.ok("pull")
    assert report["downloaded"] == len(names)
    placed = {str(pair.local / rel) for rel in names}
    assert_ordered(events, placed)
    for rel in names:
        assert (pair.local / rel).read_text() == f"new {rel} " * 3


# -- the remote: the helper's send -----------------------------------------------------------

HEADER = struct.Struct(">cI")


def _frame(kind: bytes, obj: Any) -> bytes:
    payload = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return HEADER.pack(kind, len(payload)) + payload


def _replies(data: bytes) -> list[dict[str, Any]]:
    out, pos = [], 0
    while pos < len(data):
        kind, n = HEADER.unpack_from(data, pos)
        payload = data[pos + HEADER.size: pos + HEADER.size + n]
        pos += HEADER.size + n
        out.append(json.loads(zlib.decompress(payload) if kind == b"Z" else payload))
    return out


def _send(root: Path, files: dict[str, bytes]) -> list[list[Any]]:
    """One ``send`` request through ``serve`` in this process; its result rows."""
    req = [_frame(b"J", {"op": "send", "root": str(root), "count": len(files)})]
    for rel, data in files.items():
        req.append(_frame(b"H", {"path": rel, "mode": 0o644, "mtime_ns": 1_600_000_000 * 10**9,
                                 "expect": None}))
        req.append(_frame(b"D", data))
        req.append(_frame(b"E", {"ok": True}))
    req.append(_frame(b"J", {"op": "bye"}))
    out = io.BytesIO()
    serve(io.BytesIO(b"".join(req)), out)
    replies = _replies(out.getvalue())
    rows: list[list[Any]] = replies[1]["results"]
    return rows


def test_remote_send_flushes_data_then_renames_then_each_directory_once(
    tmp_path: Path, events: list[Event]
) -> None:
    root = tmp_path / "remote"
    files = {f"{d}/f{i}.txt": f"{d} {i}".encode() * 50 for d in ("a", "b", "c/d") for i in range(4)}
    rows = _send(root, files)
    assert [r[:2] for r in rows] == [[rel, "ok"] for rel in files]
    assert_ordered(events, {str(root / rel) for rel in files})
    for rel, data in files.items():
        assert (root / rel).read_bytes() == data


def test_remote_send_over_the_batch_limit_keeps_the_order_per_batch(
    tmp_path: Path, events: list[Event], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Batch, "LIMIT", 3)
    root = tmp_path / "remote"
    files = {f"d{i % 2}/f{i}": b"x" * i for i in range(7)}
    rows = _send(root, files)
    assert [r[:2] for r in rows] == [[rel, "ok"] for rel in files]
    # three batches (3, 3, 1 files): data, names, directories, then the next batch
    renames = [k for k, e in enumerate(events) if e[0] == "rename"]
    assert len(renames) == 7
    bounds = [(0, 3), (3, 6), (6, 7)]
    for n, (lo, hi) in enumerate(bounds):
        first, last = renames[lo], renames[hi - 1]
        batch = [events[k] for k in renames[lo:hi]]
        before = events[renames[lo - 1] + 1 if lo else 0:first]
        data = {path for kind, path, _ in before if kind == "fsync"}
        assert {src for _, src, _ in batch} <= data, n
        upto = renames[hi] if hi < 7 else len(events)
        after = [e for e in events[last + 1:upto] if e[0] == "fsync"]
        dirs = [path for _, path, _ in after if path in {os.path.dirname(d) for _, _, d in batch}]
        assert sorted(dirs) == sorted({os.path.dirname(d) for _, _, d in batch}), n
        assert all(e[0] != "rename" for e in events[first:last + 1] if e not in batch)
    for rel, data in files.items():
        assert (root / rel).read_bytes() == data


def _fsyncs_meet(monkeypatch: pytest.MonkeyPatch, watched: Callable[[str], bool]) -> list[int]:
    """Run a batch's fsyncs 2 at a time, each taking long on the batch's clock (as a
    disk's do), and make each fsync of a ``watched`` path but the first (which runs alone,
    and shows that the disk is slow) wait at a barrier for a second one under way: one
    after another, the first would wait until the barrier breaks. The list returned gets
    each meeting's arrival indexes."""
    import itertools
    import threading

    from filesync.tree import dirfd

    monkeypatch.setattr(dirfd, "SYNC_THREADS", 2)
    ticks = itertools.count()
    monkeypatch.setattr(dirfd, "clock", lambda: float(next(ticks)))  # every call takes 1 s
    real_fsync = os.fsync
    meet = threading.Barrier(2, timeout=30)
    met: list[int] = []
    alone: list[str] = []

    def fsync(fd: int) -> None:
        path = _fd_path(fd)
        if watched(path):
            if alone:
                met.append(meet.wait())
            else:
                alone.append(path)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return met


def test_remote_send_runs_a_batchs_fsyncs_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Concurrent fsyncs share journal commits.
    met = _fsyncs_meet(monkeypatch, lambda path: os.path.basename(path).startswith(".filesync."))
    root = tmp_path / "remote"
    files = {f"f{i}": b"x" * i for i in range(5)}
    rows = _send(root, files)
    assert [r[:2] for r in rows] == [[rel, "ok"] for rel in files]
    assert sorted(met) == [0, 0, 1, 1]  # two meetings of two fsyncs each, none broken


def test_host_pull_runs_the_staged_files_fsyncs_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pair = Pair(tmp_path / "local", tmp_path / "remote", tmp_path / "state")
    for i in range(5):
        write(pair.remote / f"f{i}.txt", f"file {i}\n")
    staging = str(pair.state)
    met = _fsyncs_meet(monkeypatch, lambda path: path.startswith(staging)
                       and "/staging/" in path and os.path.isfile(path))
    assert pair.ok("pull")["downloaded"] == 5
    assert sorted(met) == [0, 0, 1, 1]  # two meetings of two fsyncs each, none broken


@pytest.mark.parametrize("slow", [3, None], ids=["slow-from-the-fourth", "all-quick"])
def test_a_batchs_calls_stay_in_the_calling_thread_while_each_is_quick(
    monkeypatch: pytest.MonkeyPatch, slow: int | None
) -> None:
    # On tmpfs a flush takes no time: threads would only cost lock hand-offs. From the
    # first call that took long (a disk), the rest run several at once.
    import threading

    from filesync.tree import dirfd

    monkeypatch.setattr(dirfd, "SYNC_THREADS", 2)
    now = [0.0]
    monkeypatch.setattr(dirfd, "clock", lambda: now[0])
    ran: dict[int, int] = {}

    def call(i: int) -> int:
        ran[i] = threading.get_ident()
        if i == slow:
            now[0] += 2 * dirfd.QUICK
        return i * 2

    assert dirfd.each_at_once(call, range(10)) == [i * 2 for i in range(10)]
    here = threading.get_ident()
    if slow is None:
        assert set(ran.values()) == {here}
    else:
        assert all(ran[i] == here for i in range(slow + 1))
        assert all(ran[i] != here for i in range(slow + 2, 10, 2))  # the other worker's share


def test_an_unexpected_error_in_a_batchs_fsync_is_raised() -> None:
    from filesync.tree import dirfd

    class Sink:
        def __init__(self, fail: bool) -> None:
            self.fail = fail

        def sync(self) -> list[Any] | None:
            if self.fail:
                raise RuntimeError("a bug in sync")
            return None

    sinks: list[Any] = [Sink(i == 5) for i in range(9)]
    with pytest.raises(RuntimeError, match="a bug in sync"):
        dirfd.each_at_once(Sink.sync, sinks)
    assert dirfd.each_at_once(Sink.sync, [Sink(False) for _ in range(3)]) == [None] * 3


@pytest.mark.parametrize(("open_files", "limit"),
                         [(-1, 512), (20000, 512), (1024, 256), (256, 64), (12, 3)])
def test_a_batch_takes_at_most_half_of_the_descriptors(open_files: int, limit: int) -> None:
    # a descriptor per pending file and per directory: 2 * LIMIT at most, of ``open_files``
    from filesync.tree.dirfd import batch_limit

    assert batch_limit(open_files) == limit
