"""The helper's ``wait`` request, driven in-process over pipes (``serve`` in a thread):
it answers when a watched root changes, at once for a root it does not watch, when the
client sends anything, and keeps what the events said for the next listing."""

from __future__ import annotations

import inspect
import json
import os
import select
import struct
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from filesync.core.exclude import ExcludeRule
from filesync.tree.server import Server, serve

HEADER = struct.Struct(">cI")
DEADLINE = 60.0
RULE = ExcludeRule.build([], default_excludes=True).wire()


class Client:
    def __init__(self) -> None:
        c2s_r, c2s_w = os.pipe()
        s2c_r, s2c_w = os.pipe()
        self.out, self.inp = os.fdopen(c2s_w, "wb"), os.fdopen(s2c_r, "rb", buffering=0)
        server_in, server_out = os.fdopen(c2s_r, "rb"), os.fdopen(s2c_w, "wb")

        def run() -> None:
            try:
                serve(server_in, server_out)
            finally:
                server_out.close()
                server_in.close()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        self.buffer = b""
        assert "hello" in self.reply()

    def close(self) -> None:
        self.send({"op": "bye"})
        assert self.reply() == {"bye": True}
        self.thread.join(DEADLINE)
        self.out.close()
        self.inp.close()

    def send(self, obj: dict[str, Any]) -> None:
        data = json.dumps(obj).encode()
        self.out.write(HEADER.pack(b"J", len(data)) + data)
        self.out.flush()

    def _read(self, n: int) -> bytes:
        while len(self.buffer) < n:
            ready, _, _ = select.select([self.inp], [], [], DEADLINE)
            assert ready, "the helper sent nothing before the deadline"
            chunk = self.inp.read(1 << 16)
            assert chunk, "the helper ended"
            self.buffer += chunk
        out, self.buffer = self.buffer[:n], self.buffer[n:]
        return out

    def reply(self) -> dict[str, Any]:
        while True:
            kind, length = HEADER.unpack(self._read(HEADER.size))
            payload = self._read(length)
            if kind == b"K":
                continue
            data = zlib.decompress(payload) if kind == b"Z" else payload
            obj: dict[str, Any] = json.loads(data)
            return obj

    def list_watched(self, root: Path, since: int | None = None) -> dict[str, Any]:
        req: dict[str, Any] = {"op": "list", "root": str(root), **RULE, "delta": True,
                               "watch": True}
        if since is not None:
            req["since"] = since
        self.send(req)
        return self.reply()

    def wait(self, root: Path, timeout: float, settle: float = 0.05) -> None:
        self.send({"op": "wait", "roots": [{"root": str(root), **RULE}], "timeout": timeout,
                   "settle": settle})


@pytest.fixture
def c() -> Iterator[Client]:
    client = Client()
    yield client
    client.close()


def test_a_write_in_a_watched_root_ends_the_wait_and_the_next_listing_has_it(
    c: Client, tmp_path: Path
) -> None:
    (tmp_path / "a").write_text("a")
    first = c.list_watched(tmp_path)
    c.wait(tmp_path, timeout=300)
    for i in range(50):  # a burst: one reply
        (tmp_path / f"f{i}").write_text(str(i))
    assert c.reply() == {"changed": True, "watched": 1}
    # The events were read while the burst settled, and kept: the delta has every file.
    delta = c.list_watched(tmp_path, since=first["gen"])
    assert delta["base"] == first["gen"]
    assert sorted(row[0] for row in delta["entries"]) == sorted(f"f{i}" for i in range(50))


def _select_line() -> int:
    lines, first = inspect.getsourcelines(Server.op_wait)
    return first + next(i for i, line in enumerate(lines) if "select.select" in line)


def _sleeping_in_select(c: Client) -> None:
    """Wait until the helper thread sleeps in the wait's ``select`` (so the wake below
    reaches it through its input descriptor, not through a read-ahead buffer)."""
    line, end = _select_line(), time.monotonic() + DEADLINE
    while True:
        frame = sys._current_frames().get(c.thread.ident or 0)
        while frame is not None and frame.f_code.co_name != "op_wait":
            frame = frame.f_back
        if frame is not None and frame.f_lineno == line:
            return
        assert time.monotonic() < end, "the helper never reached the wait's select"
        time.sleep(0.005)


def test_anything_from_the_client_ends_the_wait(c: Client, tmp_path: Path) -> None:
    c.list_watched(tmp_path)
    c.wait(tmp_path, timeout=300)
    _sleeping_in_select(c)
    c.send({"op": "wake"})
    assert c.reply() == {"changed": False, "watched": 1}
    c.wait(tmp_path, timeout=300)  # and the wake of a wait already sent with it
    c.send({"op": "wake"})
    assert c.reply() == {"changed": False, "watched": 1}
    c.send({"op": "list", "root": str(tmp_path), **RULE})  # the stream is in step
    assert c.reply()["is_dir"] is True


def test_a_root_not_watched_is_answered_at_once(c: Client, tmp_path: Path) -> None:
    c.wait(tmp_path, timeout=300)  # never listed with watch: nothing watches it
    assert c.reply() == {"changed": False, "watched": 0}


def test_a_quiet_root_waits_out_its_timeout(c: Client, tmp_path: Path) -> None:
    c.list_watched(tmp_path)
    c.wait(tmp_path, timeout=0.2)
    assert c.reply() == {"changed": False, "watched": 1}
