"""The helper protocol's wire: frames, constants and reason codes.

Frames: one kind byte, a 4-byte big-endian length, the payload.
``J`` JSON object, ``Z`` zlib-compressed JSON object, ``H`` per-file header (JSON),
``D`` raw data chunk, ``E`` end of one file (JSON), ``K`` keepalive (empty payload: the
helper is still at work; see ``Channel.keepalive``).
"""

from __future__ import annotations

import errno
import json
import struct
import threading
import time
import zlib
from typing import IO, Any

PROTOCOL = 1
CHUNK = 1 << 20
HEADER = struct.Struct(">cI")
#: Output is gathered into writes of about this size: a fetch of many small files then
#: costs one pipe write (and one SSH packet run) per 256 KiB, not two per file.
FLUSH_AT = 1 << 18
#: Data chunks at least this big skip the gathering buffer (no copy).
DIRECT = 1 << 16
#: How many (root, rule) listings one helper remembers for delta replies.
#: The ``E`` frame a client sends for a file it read whole (decoded without json).
END_OK = (b'{"ok": true}', b'{"ok":true}')
#: A keepalive goes out once nothing was written for this long (seconds), unless the client
#: asks for a shorter period (``{"op": "keepalive"}``): well inside its idle deadline.
KEEPALIVE = 5.0


def is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0



SAFETY_REASONS = frozenset(
    {"unsafe path", "symlink in path (not followed)", "a parent is not a directory"}
)


def reason_of(exc: BaseException) -> str:
    if not isinstance(exc, OSError):
        return "unsafe path"
    if exc.errno == errno.ELOOP:
        return "symlink in path (not followed)"
    if exc.errno == errno.ENOTDIR:
        return "a parent is not a directory"
    return exc.strerror or str(exc)


class BadRequest(Exception):
    """The client sent something this helper cannot parse: the stream is not trusted."""


class Channel:
    """Framed I/O over a pair of binary streams.

    Frames written are gathered in a buffer and go out in writes of about ``FLUSH_AT``
    bytes (big data chunks straight through); ``flush`` (done by every reply) sends
    what is pending. Nothing is left pending while the helper waits for input.

    Writes hold ``lock`` from a frame's first byte to its last, so ``keepalive`` (called
    from another thread) lands between frames, never inside one.
    """

    def __init__(self, inp: IO[bytes], out: IO[bytes]) -> None:
        self.inp = inp
        self.out = out
        self._pending = bytearray()
        self.lock = threading.Lock()
        #: when bytes last went out (``time.monotonic``)
        self.wrote_at = time.monotonic()

    def keepalive(self, quiet_for: float) -> bool:
        """Send a ``K`` frame (and whatever is pending) if nothing went out for
        ``quiet_for`` seconds; True if it did."""
        with self.lock:
            if time.monotonic() - self.wrote_at < quiet_for:
                return False
            self._pending += HEADER.pack(b"K", 0)
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
        try:
            if kind == b"Z":
                payload = zlib.decompress(payload)
            obj = json.loads(payload.decode("utf-8", "surrogateescape"))
        except (ValueError, zlib.error, RecursionError) as exc:
            raise BadRequest(f"undecodable {kind!r} frame") from exc
        if not isinstance(obj, dict):
            raise BadRequest(f"{kind!r} frame is not a JSON object")
        return kind, obj

    def write(self, kind: bytes, payload: bytes, flush: bool = False) -> None:
        """Queue one frame; ``flush`` sends it (and everything before it) at once."""
        with self.lock:
            self._write(kind, payload, flush)

    def _write(self, kind: bytes, payload: bytes, flush: bool) -> None:
        pending = self._pending
        pending += HEADER.pack(kind, len(payload))
        if len(payload) >= DIRECT:
            self.out.write(pending)
            pending.clear()
            self.out.write(payload)
        else:
            pending += payload
            if len(pending) >= FLUSH_AT:
                self.out.write(pending)
                pending.clear()
        if flush:
            self._flush()
        self.wrote_at = time.monotonic()

    def flush(self) -> None:
        with self.lock:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            self.out.write(self._pending)
            self._pending.clear()
        self.out.flush()
        self.wrote_at = time.monotonic()

    def send_json(self, obj: dict[str, Any], kind: bytes = b"J", flush: bool = True) -> None:
        data = json.dumps(obj, separators=(",", ":")).encode("utf-8", "surrogateescape")
        if kind == b"Z":
            data = zlib.compress(data, 6)
        self.write(kind, data, flush)

