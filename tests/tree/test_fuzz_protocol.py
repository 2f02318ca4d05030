"""Property tests of both ends of the framed protocol with random and garbled streams.

Client side: ``HelperEndpoint`` (start, list, fetch, send, delete, close) reads a stream that
is random bytes, random frames, or valid frames with mutated lengths and JSON. Every
outcome must be a normal result or a ``FilesyncError`` (``TransportError`` /
``ConnectionLost``); never another exception type, never a hang (the fake process ends its
stream with EOF, so waiting forever would be a bug), and a sink only ever receives the
paths it asked for.

Helper side: ``server.serve`` reads random requests (random bytes, random frames, and
well-framed requests with random fields) in a sandbox directory. It must return normally,
write only complete frames whose JSON payloads are objects, leave no temp file, and never
write outside the sandbox.

Each fuzz test records how many inputs it ran on (``record``) and fails if that is fewer
than its ``max_examples``.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import struct
import tempfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_reliability_support import leftovers, record

from filesync.core.exclude import ExcludeRule
from filesync.core.model import Entry
from filesync.endpoint.contract import FetchHeader, FetchSink, SendItem
from filesync.endpoint.helper import HelperEndpoint
from filesync.errors import ConnectionLost, FilesyncError, TransportError
from filesync.transport.base import Conduit, RemoteProcess
from filesync.tree import server
from filesync.tree.wire import PROTOCOL, WHOLE_HEAD

H = struct.Struct(">cI")
FUZZ = settings(max_examples=200, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def fuzz(inputs: st.SearchStrategy[bytes], check: Callable[[bytes], None]) -> int:
    """Run ``check`` on ``FUZZ``'s examples of ``inputs``; return how many it ran on.

    The count is the figure recorded (docs/reliability.md quotes it), so it is checked:
    hypothesis stops early, and silently, when a strategy runs out of distinct inputs.
    """
    tried = 0

    @FUZZ
    @given(data=inputs)
    def one(data: bytes) -> None:
        nonlocal tried
        tried += 1
        check(data)

    one()
    assert tried >= FUZZ.max_examples, f"only {tried} distinct inputs were tried"
    return tried


# -- a remote process that plays back bytes ---------------------------------------------------


class Playback(RemoteProcess):
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    async def write(self, data: bytes) -> None:
        await asyncio.sleep(0)

    async def write_eof(self) -> None:
        pass

    async def readexactly(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            self.pos = len(self.data)
            raise ConnectionLost("ended mid-stream")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    async def read(self, n: int) -> bytes:
        chunk = self.data[self.pos : self.pos + n]
        self.pos += len(chunk)
        return chunk

    async def read_stderr(self) -> bytes:
        return b""

    async def wait(self) -> int:
        return 0

    def kill(self) -> None:
        self.pos = len(self.data)


class PlaybackConduit(Conduit):
    identity = "fuzz"

    def __init__(self, data: bytes) -> None:
        self.data = data

    async def start(self, command: str) -> RemoteProcess:
        return Playback(self.data)

    async def close(self) -> None:
        pass


class Sink(FetchSink):
    def __init__(self) -> None:
        self.paths: list[str] = []

    def begin(self, head: FetchHeader) -> Any:
        self.paths.append(head.path)
        return lambda data: None

    def end(self, head: FetchHeader, ok: bool, reason: str) -> None:
        pass

    def failed(self, path: str, reason: str) -> None:
        self.paths.append(path)


def frame(kind: bytes, payload: bytes) -> bytes:
    return H.pack(kind, len(payload)) + payload


HELLO = frame(b"J", json.dumps({"hello": PROTOCOL, "cwd": "/r", "pid": 1}).encode())
REQUESTED = ["a.txt", "d/b.txt"]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=12)
    | st.sampled_from([*REQUESTED, "../x", "/etc/passwd", "", "f"]),
    lambda inner: st.lists(inner, max_size=7) | st.dictionaries(
        st.sampled_from(["path", "size", "mtime_ns", "mode", "ok", "error", "done", "results",
                         "entries", "skipped", "root", "exists", "is_dir", "excluded", "hello",
                         "cwd", "bye", "x"]), inner, max_size=7),
    max_leaves=25,
)


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from([b"J", b"Z", b"H", b"D", b"E", b"W", b"X", b"\x00"]))
    if draw(st.booleans()):
        payload = json.dumps(draw(json_values)).encode()
    else:
        payload = draw(st.binary(max_size=64))
    if kind == b"Z" and draw(st.booleans()):
        payload = zlib.compress(payload)
    length = len(payload)
    if draw(st.integers(0, 9)) == 0:  # now and then a lying length field
        length = draw(st.sampled_from([0, length + 1, max(length - 1, 0), 2**32 - 1]))
    return H.pack(kind, length) + payload


@st.composite
def plausible(draw: st.DrawFn) -> bytes:
    """Valid-looking replies with random corruption: the hardest case for a parser."""
    out = []
    for path in draw(st.lists(st.sampled_from([*REQUESTED, "../x", "z"]), max_size=4)):
        size = draw(st.integers(0, 6))
        head = {"path": path, "size": draw(st.sampled_from([size, -1, "7", None])),
                "mtime_ns": 1, "mode": 0o644}
        out.append(frame(b"H", json.dumps(head).encode()))
        out += [frame(b"D", draw(st.binary(max_size=8))) for _ in range(draw(st.integers(0, 2)))]
        out.append(frame(b"E", json.dumps({"ok": draw(json_values)}).encode()))
    reply = {"results": draw(st.lists(st.lists(json_values, max_size=4), max_size=3)),
             "root": "/r", "exists": True, "is_dir": True,
             "entries": draw(st.lists(st.lists(json_values, max_size=8), max_size=3))}
    out.append(frame(draw(st.sampled_from([b"J", b"Z"])),
                     zlib.compress(json.dumps(reply).encode())
                     if draw(st.booleans()) else json.dumps(reply).encode()))
    out.append(frame(b"J", json.dumps({"done": True}).encode()))
    blob = b"".join(out)
    if blob and draw(st.booleans()):  # flip one byte somewhere
        i = draw(st.integers(0, len(blob) - 1))
        blob = blob[:i] + bytes([blob[i] ^ draw(st.integers(1, 255))]) + blob[i + 1 :]
    return blob


streams = st.one_of(
    st.binary(max_size=300).map(lambda b: HELLO + b),
    st.lists(frames(), max_size=8).map(lambda fs: HELLO + b"".join(fs)),
    plausible().map(lambda b: HELLO + b),
    st.binary(max_size=200),  # not even a hello
)


async def exercise(data: bytes, op: str) -> None:
    try:
        session = await HelperEndpoint.start(PlaybackConduit(data))
    except FilesyncError:
        return
    sink = Sink()
    try:
        if op == "list":
            listing = await session.list_tree("/r", ExcludeRule.build())
            assert all(isinstance(p, str) for p in listing.entries)
        elif op == "fetch":
            await session.fetch("/r", REQUESTED, sink)
        elif op == "send":
            items = [SendItem(p, 0o644, 1, None, lambda: iter([b"x"])) for p in REQUESTED]
            outcomes = await session.send("/r", items)
            assert [o.path for o in outcomes] == REQUESTED
        else:
            entries = [Entry(p, "f", 1, 1, 0o644) for p in REQUESTED]
            outcomes = await session.delete("/r", entries)
            assert [o.path for o in outcomes] == REQUESTED
    except FilesyncError:
        pass
    finally:
        await session.close()  # never raises, never waits on a broken stream
    assert set(sink.paths) <= set(REQUESTED)
    assert len(sink.paths) == len(set(sink.paths))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("op", ["list", "fetch", "send", "delete"])
def test_client_parser_turns_any_stream_into_a_result_or_a_filesync_error(op: str) -> None:
    # The wait_for bound is a hang detector (an input takes milliseconds), not a timing.
    tried = fuzz(streams, lambda data: asyncio.run(asyncio.wait_for(exercise(data, op), 60)))
    record("fuzz", inputs=tried, client=tried)


def test_the_client_refuses_a_helper_of_another_protocol() -> None:
    async def start(hello: int) -> None:
        data = frame(b"J", json.dumps({"hello": hello, "cwd": "/r", "pid": 1}).encode())
        session = await HelperEndpoint.start(PlaybackConduit(data))
        await session.close()

    asyncio.run(start(PROTOCOL))  # the same stream of this protocol starts
    with pytest.raises(TransportError, match=f"protocol {PROTOCOL - 1}, this filesync "
                                             f"{PROTOCOL}; run one version on both ends"):
        asyncio.run(start(PROTOCOL - 1))


# -- the helper's request parser --------------------------------------------------------------


@contextlib.contextmanager
def sandbox() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as outer:
        box = Path(outer) / "box"
        (box / "sub").mkdir(parents=True)
        (box / "sub" / "f.txt").write_text("f\n")
        (box / "g.txt").write_text("g\n")
        old = os.getcwd()
        os.chdir(box)
        try:
            yield box
        finally:
            os.chdir(old)
        assert sorted(os.listdir(outer)) == ["box"]  # nothing escaped the sandbox
        assert leftovers(box) == []


ROOTS = st.sampled_from([".", "sub", "new", "sub/deeper"])
rel_paths = st.sampled_from(["g.txt", "sub/f.txt", "../x", "/abs", "", "a/../b", "sub",
                             "new.txt", "sub/new.txt"]) | st.text(max_size=10)


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    op = draw(st.sampled_from(["list", "fetch", "send", "delete", "bye", "nope", 7, None]))
    req: dict[str, Any] = {"op": op, "root": draw(ROOTS)}
    if op == "list":
        req["names"] = draw(st.lists(st.text(max_size=5), max_size=3) | json_values)
        req["rules"] = draw(st.lists(st.tuples(st.sampled_from(["^a", "(", ".*", "\xff"]),
                                               *[st.booleans() | st.integers(0, 1)] * 3),
                                     max_size=2) | json_values)
    elif op == "fetch":
        req["paths"] = draw(st.lists(rel_paths, max_size=4) | json_values)
    elif op == "delete":
        req["files"] = draw(st.lists(st.tuples(rel_paths, st.integers(0, 3), st.integers(0, 3)),
                                     max_size=3) | json_values)
    elif op == "send":
        req["count"] = draw(st.integers(0, 3) | json_values)
    for key in draw(st.lists(st.sampled_from(list(req)), max_size=2)):
        req[key] = draw(json_values)  # now and then a field of the wrong type
    if "root" in req:  # the root is the client's choice, trusted: keep it in the sandbox
        req["root"] = draw(ROOTS)
    out = frame(b"J", json.dumps(req).encode())
    if op == "send":
        for _ in range(draw(st.integers(0, 3))):
            head = {"path": draw(rel_paths), "mode": draw(st.sampled_from([0o644, -1, "x"])),
                    "mtime_ns": 1, "expect": draw(st.sampled_from([None, [1, 1], "x", [1]]))}
            encoded = json.dumps(head).encode()
            if draw(st.booleans()):  # one whole-file frame, its path length now and then a lie
                name = str(head["path"]).encode("utf-8", "surrogateescape")
                told = draw(st.sampled_from([len(name), len(name) + 9, 0, 2**32 - 1]))
                fields = WHOLE_HEAD.pack(told, 0o644, 1, draw(st.sampled_from([0, 1, 2])), 1, 1)
                out += frame(draw(st.sampled_from([b"W", b"F"])), fields + name + b"data")
                continue
            out += frame(b"H", encoded)
            out += b"".join(frame(b"D", b"data") for _ in range(draw(st.integers(0, 2))))
            out += frame(draw(st.sampled_from([b"E", b"J", b"D", b"W"])),
                         json.dumps({"ok": draw(st.booleans())}).encode())
    return out


helper_input = st.one_of(
    st.binary(max_size=300),
    st.lists(frames(), max_size=6).map(b"".join),
    st.lists(requests(), min_size=1, max_size=4).map(b"".join),
)


def parse_frames(data: bytes) -> list[tuple[bytes, bytes]]:
    out = []
    pos = 0
    while pos < len(data):
        kind, length = H.unpack(data[pos : pos + H.size])
        payload = data[pos + H.size : pos + H.size + length]
        assert len(payload) == length, "a frame was cut short"
        out.append((kind, payload))
        pos += H.size + length
    return out


@pytest.mark.timeout(120)
def test_helper_answers_any_input_without_crashing() -> None:
    tried = fuzz(helper_input, helper_answers)
    record("fuzz", inputs=tried, helper=tried)


def helper_answers(data: bytes) -> None:
    out = io.BytesIO()
    with sandbox():
        server.serve(io.BytesIO(data), out)
    replies = parse_frames(out.getvalue())
    assert replies and replies[0][0] == b"J"
    for kind, payload in replies:
        if kind in (b"J", b"Z", b"H", b"E"):
            obj = json.loads(zlib.decompress(payload) if kind == b"Z" else payload)
            assert isinstance(obj, dict)

