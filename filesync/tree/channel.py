"""Framed I/O over a pair of binary streams: the helper's side of ``tree.wire``'s codec."""

from __future__ import annotations

import time
from _thread import allocate_lock

from filesync.tree.wire import HEADER, Gather, decode_json, json_payload

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import IO, Any


class Channel:
    """Framed I/O over a pair of binary streams.

    Frames written are gathered (``wire.Gather``) and go out in writes of about
    ``FLUSH_AT`` bytes (big data chunks straight through); ``flush`` (done by every reply)
    sends what is pending. Nothing is left pending while the helper waits for input.

    Writes hold ``lock`` from a frame's first byte to its last, so ``keepalive`` (called
    from another thread) lands between frames, never inside one.
    """

    def __init__(self, inp: IO[bytes], out: IO[bytes]) -> None:
        self.inp = inp
        self.out = out
        self._gather = Gather()
        self.lock = allocate_lock()
        #: when bytes last went out (``time.monotonic``)
        self.wrote_at = time.monotonic()

    def keepalive(self, quiet_for: float) -> bool:
        """Send a ``K`` frame (and whatever is pending) if nothing went out for
        ``quiet_for`` seconds; True if it did."""
        with self.lock:
            if time.monotonic() - self.wrote_at < quiet_for:
                return False
            self._gather.add(b"K", b"")
            self._flush()
            return True

    def read_frame(self) -> tuple[bytes, bytes] | None:
        head = self.inp.read(HEADER.size)
        if len(head) < HEADER.size:
            return None
        kind, length = HEADER.unpack(head)
        payload = self.inp.read(length)
        if len(payload) < length:
            return None
        return kind, payload

    def read_json(self) -> tuple[bytes, dict[str, Any]] | None:
        """The next frame decoded as a JSON object (``{}`` for ``D``); ``None`` at EOF.

        Raises ``BadRequest`` for a payload that is not a (compressed) JSON object.
        """
        frame = self.read_frame()
        if frame is None:
            return None
        kind, payload = frame
        if kind == b"D":
            return kind, {}
        return kind, decode_json(kind, payload)

    def write(self, kind: bytes, payload: bytes, flush: bool = False) -> None:
        """Queue one frame; ``flush`` sends it (and everything before it) at once."""
        with self.lock:
            for data in self._gather.add(kind, payload):
                self.out.write(data)
            if flush:
                self._flush()
            self.wrote_at = time.monotonic()

    def flush(self) -> None:
        with self.lock:
            self._flush()

    def _flush(self) -> None:
        if self._gather.pending:
            self.out.write(self._gather.take())
        self.out.flush()
        self.wrote_at = time.monotonic()

    def send_json(self, obj: dict[str, Any], kind: bytes = b"J", flush: bool = True) -> None:
        self.write(kind, json_payload(obj, kind), flush)
