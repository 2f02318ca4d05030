"""The helper protocol's wire: frames, constants and reason codes.

Frames: one kind byte, a 4-byte big-endian length, the payload.
``J`` JSON object, ``Z`` zlib-compressed JSON object, ``H`` per-file header (JSON),
``D`` raw data chunk, ``E`` end of one file (JSON), ``K`` keepalive (empty payload: the
helper is still at work; see ``Channel.keepalive``), ``F`` one whole small file of an
upload (``split_whole``: a 4-byte big-endian header length, the ``H`` header's JSON, the
file's bytes), which stands for its ``H``, ``D`` and ok ``E`` frames: a 100k-file push is
then one frame per file, not three.
"""

from __future__ import annotations

import enum
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
#: zlib's level for ``Z`` frames. A listing is compressed while the client waits for it:
#: level 1 takes a quarter of level 6's time (100k rows, 7 MB of JSON: 39 against 163 ms)
#: for 12 % more bytes (1.73 against 1.54 MB), less time than those bytes take on any link
#: from ~10 Mbit/s up.
Z_LEVEL = 1
#: The header length that starts an ``F`` frame's payload.
WHOLE_HEAD = struct.Struct(">I")
#: An upload of at most this many bytes goes as one ``F`` frame.
WHOLE_MAX = DIRECT
#: The ``E`` frame a client sends for a file it read whole (decoded without json).
END_OK = (b'{"ok": true}', b'{"ok":true}')
#: A keepalive goes out once nothing was written for this long (seconds), unless the client
#: asks for a shorter period (``{"op": "keepalive"}``): well inside its idle deadline.
KEEPALIVE = 5.0


def is_count(value: object) -> bool:
    """A non-negative int (sizes, times, modes, counts); bools are not counts."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0



class Reason(str, enum.Enum):  # noqa: UP042 (the remote may run a python3 before 3.11)
    """Why a path was not synced or not done: the machine-readable code.

    The helper, the POSIX fallback's shell scripts and the host walk emit these values;
    every client decision (safety refusal or plain failure, symlinked parent or not) is
    taken on the code, never on a message. ``describe`` derives the human text, which may
    be reworded freely.

    - ``unsafe-path``: a name ``tree.paths.unsafe_reason`` refuses (never opened);
    - ``symlink-in-path``: a parent directory is a symlink (not followed);
    - ``parent-not-a-directory``: a parent is a file or another non-directory;
    - ``path-raced``: a parent directory was swapped while it was being entered (a
      symlink or another directory put in its place; nothing was written);
    - ``symlink``, ``special-file``, ``hard-link``, ``not-regular``: listed, not synced;
    - ``changed``: the target changed on the remote since it was listed;
    - ``dir-in-the-way``: a file's place is taken by a directory that holds something
      no listing showed (excluded or skipped content, or files new since the listing):
      the directory is never removed, so nothing of it is lost;
    - ``torn``: the file changed while it was being read;
    - ``unreadable``: a directory could not be listed (``detail``: the OS error);
    - ``too-large``: left out by a size limit of the run (``--max-file-size``);
    - ``os-error``: any other failure (``detail``: the OS error text).
    """

    UNSAFE_PATH = "unsafe-path"
    SYMLINK_IN_PATH = "symlink-in-path"
    PARENT_NOT_DIR = "parent-not-a-directory"
    PATH_RACED = "path-raced"
    SYMLINK = "symlink"
    SPECIAL_FILE = "special-file"
    HARD_LINK = "hard-link"
    NOT_REGULAR = "not-regular"
    CHANGED = "changed"
    DIR_IN_WAY = "dir-in-the-way"
    TORN = "torn"
    UNREADABLE = "unreadable"
    TOO_LARGE = "too-large"
    OS_ERROR = "os-error"


#: Refusals that protect the tree (reported as skipped, not as failures of the run).
SAFETY = frozenset(
    {Reason.UNSAFE_PATH, Reason.SYMLINK_IN_PATH, Reason.PARENT_NOT_DIR, Reason.PATH_RACED,
     Reason.DIR_IN_WAY}
)

_TEXT = {
    Reason.UNSAFE_PATH: "unsafe path",
    Reason.SYMLINK_IN_PATH: "symlink in path (not followed)",
    Reason.PARENT_NOT_DIR: "a parent is not a directory",
    Reason.PATH_RACED: "a parent directory was swapped while in use (not followed)",
    Reason.SYMLINK: "symlink (not followed)",
    Reason.SPECIAL_FILE: "special file (fifo, socket or device)",
    Reason.HARD_LINK: "hard link on the remote (not synced)",
    Reason.NOT_REGULAR: "not a regular file on the remote",
    Reason.CHANGED: "changed on the remote during the run",
    Reason.DIR_IN_WAY: "a directory holding files that are not synced (excluded or "
                       "skipped) is in the way; move it aside to let the file through",
    Reason.TORN: "changed while being read",
    Reason.UNREADABLE: "unreadable directory",
    Reason.TOO_LARGE: "larger than --max-file-size",
    Reason.OS_ERROR: "failed",
}


def describe(code: Reason, detail: str = "") -> str:
    """The human text of ``code``: for ``unreadable`` with the OS ``detail``; for
    ``os-error`` (and a refused name's specific rule) the detail itself."""
    if code is Reason.UNREADABLE and detail:
        return f"unreadable directory: {detail}"
    if detail and code in (Reason.OS_ERROR, Reason.UNSAFE_PATH):
        return detail
    return _TEXT[code]


def parse_reason(value: object) -> Reason:
    """A code received from the remote; anything unknown is a plain ``os-error``."""
    try:
        return Reason(value)
    except ValueError:
        return Reason.OS_ERROR


def reason_of(exc: BaseException) -> tuple[Reason, str]:
    """The code (and OS detail) for an exception raised while opening a path."""
    if not isinstance(exc, OSError):
        return Reason.UNSAFE_PATH, ""
    if exc.errno == errno.ELOOP:
        return Reason.SYMLINK_IN_PATH, ""
    if exc.errno == errno.ENOTDIR:
        return Reason.PARENT_NOT_DIR, ""
    return Reason.OS_ERROR, exc.strerror or str(exc)


def reason_text(exc: BaseException) -> str:
    """The human text of ``reason_of(exc)``."""
    return describe(*reason_of(exc))


class BadRequest(Exception):
    """The client sent something this helper cannot parse: the stream is not trusted."""


def json_object(kind: bytes, payload: bytes) -> dict[str, Any]:
    """A frame's payload as a JSON object (``Z``: compressed); ``BadRequest`` otherwise."""
    try:
        if kind == b"Z":
            payload = zlib.decompress(payload)
        obj = json.loads(payload.decode("utf-8", "surrogateescape"))
    except (ValueError, zlib.error, RecursionError) as exc:
        raise BadRequest(f"undecodable {kind!r} frame") from exc
    if not isinstance(obj, dict):
        raise BadRequest(f"{kind!r} frame is not a JSON object")
    return obj


def put_whole(buf: bytearray, head: bytes, body: bytes) -> None:
    """Append the ``F`` frame of a whole small upload (``head``: its header's JSON)."""
    buf += HEADER.pack(b"F", WHOLE_HEAD.size + len(head) + len(body))
    buf += WHOLE_HEAD.pack(len(head))
    buf += head
    buf += body


def split_whole(payload: bytes) -> tuple[dict[str, Any], memoryview]:
    """An ``F`` frame's header (a JSON object) and file bytes; ``BadRequest`` for a payload
    that does not hold both."""
    if len(payload) < WHOLE_HEAD.size:
        raise BadRequest("F frame shorter than its header length")
    (length,) = WHOLE_HEAD.unpack_from(payload)
    end = WHOLE_HEAD.size + length
    if end > len(payload):
        raise BadRequest("F frame header runs past the frame")
    view = memoryview(payload)
    return json_object(b"F", bytes(view[WHOLE_HEAD.size:end])), view[end:]


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
        return kind, json_object(kind, payload)

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
            data = zlib.compress(data, Z_LEVEL)
        self.write(kind, data, flush)

