"""Keepalive frames (``K``) land between frames, never inside one, whatever thread writes
them, and they flush what is pending; the client's reader skips them."""

from __future__ import annotations

import io
import os
import threading

from filesync.tree.channel import Channel
from filesync.tree.wire import DIRECT, FLUSH_AT, HEADER


class SlowOut(io.RawIOBase):
    """A stream whose every write is copied in small steps with a thread switch between
    them, so that an unlocked concurrent writer would land inside a frame."""

    def __init__(self) -> None:
        self.data = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, b: object) -> int:
        view = memoryview(b).cast("B")  # type: ignore[arg-type]
        for i in range(0, len(view), 4096):
            self.data += view[i:i + 4096]
            os.sched_yield()
        return len(view)


def frames(data: bytes) -> list[tuple[bytes, bytes]]:
    out, at = [], 0
    while at < len(data):
        kind, length = HEADER.unpack_from(data, at)
        at += HEADER.size
        out.append((kind, data[at:at + length]))
        at += length
    assert at == len(data)
    return out


def test_keepalives_from_another_thread_never_split_a_frame() -> None:
    out = SlowOut()
    chan = Channel(io.BytesIO(), out)  # type: ignore[arg-type]
    sizes = [10, DIRECT, DIRECT * 3, 100, FLUSH_AT, 7] * 6
    done = threading.Event()
    sent = [0]

    def keep() -> None:
        while not done.is_set():
            sent[0] += chan.keepalive(0.0)

    thread = threading.Thread(target=keep)
    thread.start()
    for n, size in enumerate(sizes):
        chan.write(b"D", bytes([n % 251]) * size)
    chan.flush()
    done.set()
    thread.join()
    got = frames(bytes(out.data))
    data = [payload for kind, payload in got if kind == b"D"]
    assert [len(p) for p in data] == sizes
    assert all(p == bytes([n % 251]) * len(p) for n, p in enumerate(data))
    keepalives = [payload for kind, payload in got if kind == b"K"]
    assert len(keepalives) == sent[0] > 0 and set(keepalives) == {b""}


def test_a_keepalive_flushes_what_is_pending_and_waits_for_quiet() -> None:
    out = io.BytesIO()
    chan = Channel(io.BytesIO(), out)
    chan.write(b"H", b'{"path":"a"}')  # small: gathered, not yet written
    assert out.getvalue() == b""
    assert not chan.keepalive(3600.0)  # something went out (was queued) just now
    assert chan.keepalive(0.0)
    assert frames(out.getvalue()) == [(b"H", b'{"path":"a"}'), (b"K", b"")]
