"""The helper protocol's declared wire: frames, messages, rows and reason codes, sans I/O.

Both sides use this one module (stdlib only; the helper bundle ships it): the remote's
request loop (``tree.server`` over ``tree.channel``), the client (``endpoint.helper``) and
its upload stream (``endpoint.upload_stream``). It holds the one frame codec (``Gather``
gathers frames into writes, ``frame_head`` checks a header against the size cap,
``decode_json``/``encode_json`` a JSON payload, with the decompression cap), the operation
and status enums, and every row layout as named indexes with its validator. Nothing here
reads or writes a stream.

Frames: one kind byte, a 4-byte big-endian length, the payload.
``J`` JSON object, ``Z`` zlib-compressed JSON object, ``H`` per-file header (JSON),
``D`` raw data chunk, ``E`` end of one file (JSON), ``K`` keepalive (empty payload: the
helper is still at work; see ``Channel.keepalive``), ``W`` one whole small file of an
upload, which stands for its ``H``, ``D`` and ok ``E`` frames: a 100k-file push is then
one frame per file, not three. Its header is binary, not JSON (``whole_head``,
``split_whole``): the ``WHOLE_HEAD`` fields (path length, mode, mtime_ns, whether an
``expect`` follows, the expected size and mtime_ns), the path's bytes, the file's bytes.
Decoding it is one ``unpack`` where a JSON header cost a parse and a check per field, paid
100k times on a large push. A file whose header does not fit those fields (a negative
time, say) goes as ``H``/``D``/``E`` instead, checked as before.

``PROTOCOL`` is in the helper's hello, and the client refuses a helper of another one
before it sends a file. Protocol 1 sent ``F`` frames (a JSON header):
this helper refuses them as a bad request, so a stale client is stopped, never misread.
"""

from __future__ import annotations

import enum
import errno
import struct
import zlib

try:  # ``hashlib`` would load OpenSSL and read its configuration first
    from _blake2 import blake2b
except ImportError:  # a Python built without its own BLAKE2
    from hashlib import blake2b

#: ``typing`` is for the type checker only: the remote helper starts without importing it.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

#: The wire's version, in the hello; 2: ``W`` (binary header) replaced ``F`` (JSON header).
PROTOCOL = 2
CHUNK = 1 << 20
HEADER = struct.Struct(">cI")
#: Output is gathered into writes of about this size: a fetch of many small files then
#: costs one pipe write (and one SSH packet run) per 256 KiB, not two per file.
FLUSH_AT = 1 << 18
#: Data chunks at least this big skip the gathering buffer (no copy).
DIRECT = 1 << 16
#: zlib's level for ``Z`` frames. A listing is compressed while the client waits for it,
#: so the fastest level wins: the few more bytes it sends take less time on any usable
#: link than a higher level's compression (figures in ``docs/benchmarks.md``).
Z_LEVEL = 1
#: A ``W`` frame's header: path length, mode, mtime_ns, 1 if an ``expect`` follows (else
#: 0), the expected size and mtime_ns (0 without one). Unsigned: every field is a count.
WHOLE_HEAD = struct.Struct(">IIQBQQ")
#: An upload of at most this many bytes goes as one ``W`` frame.
WHOLE_MAX = DIRECT
#: The ``E`` frame a client sends for a file it read whole (decoded without json).
END_OK = (b'{"ok": true}', b'{"ok":true}')
#: A keepalive goes out once nothing was written for this long (seconds), unless the client
#: asks for a shorter period (``{"op": "keepalive"}``): well inside its idle deadline.
KEEPALIVE = 5.0
#: Largest frame a client accepts (a listing of a huge tree is one ``Z`` frame; data chunks
#: are 1 MiB). Anything larger is garbage, refused before it is buffered.
MAX_FRAME = 256 << 20
#: Largest decompressed ``Z`` payload accepted (guards against a zlib bomb).
MAX_JSON = 1 << 30
#: The frames a helper sends in answer (``K`` keepalives are skipped before this check).
REPLY_KINDS = b"JZHDE"


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
    """The peer sent something this side cannot parse: the stream is not trusted."""


# -- the frame codec ------------------------------------------------------------------


def frame_head(head: bytes, kinds: bytes = REPLY_KINDS) -> tuple[bytes, int]:
    """A frame header's kind and length; ``BadRequest`` for a kind not in ``kinds`` or a
    length over ``MAX_FRAME``."""
    kind, length = HEADER.unpack(head)
    if kind not in kinds or length > MAX_FRAME:
        raise BadRequest(f"frame {kind!r} of {length} bytes")
    return kind, length


def frame(kind: bytes, payload: bytes) -> bytes:
    """One frame, on its own (a request; ``Gather`` for a stream of them)."""
    return HEADER.pack(kind, len(payload)) + payload


class _Decoding:
    """What ``json.loads`` configures its C scanner with (``json.JSONDecoder``'s defaults)."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    array_hook = None  # read from Python 3.15 on
    parse_float = float
    parse_int = int
    parse_constant = {"-Infinity": float("-inf"), "Infinity": float("inf"),
                      "NaN": float("nan")}.__getitem__


def _unencodable(obj: object) -> object:
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


#: JSON's whitespace, which ``json.loads`` skips before and after the value.
_BLANK = " \t\n\r"


def json_codec(native: bool = True) -> tuple[Callable[[str], Any], Callable[[Any], str],
                                             Callable[[str], str]]:
    """``json.loads``, ``json.dumps`` (compact separators) and the string quoting ``dumps``
    uses, the same C code run the same way, but without importing ``json``: that module
    imports ``re`` and compiles its expressions, a sixth of the remote helper's start-up.
    ``json`` itself where its C part is missing or takes other arguments (another Python),
    or ``native`` is False."""
    try:
        if not native:
            raise ImportError("json asked for")
        from _json import encode_basestring_ascii, make_encoder, make_scanner

        scan = make_scanner(_Decoding())  # type: ignore[arg-type]
        make_encoder({}, _unencodable, encode_basestring_ascii, None, ":", ",", False, False,
                     True)
    except (ImportError, TypeError, AttributeError):
        import json
        from functools import partial

        return (json.loads, partial(json.dumps, separators=(",", ":")),
                json.encoder.encode_basestring_ascii)

    def loads(text: str) -> Any:
        text = text.strip(_BLANK)
        try:
            obj, end = scan(text, 0)
        except StopIteration:
            raise ValueError("expecting a JSON value") from None
        if end != len(text):
            raise ValueError("extra data after the JSON value")
        return obj

    def dumps(obj: Any) -> str:
        # A new encoder per call, as json.dumps makes one: its circular-reference
        # markers are left behind by a call that fails.
        return "".join(make_encoder({}, _unencodable, encode_basestring_ascii, None, ":", ",",
                                    False, False, True)(obj, 0))

    return loads, dumps, encode_basestring_ascii


_loads, _dumps, _quote = json_codec()


def encode_json(obj: dict[str, Any]) -> bytes:
    """A JSON object as a frame's payload (names that are not UTF-8 survive)."""
    return _dumps(obj).encode("utf-8", "surrogateescape")


def decode_json(kind: bytes, payload: bytes) -> dict[str, Any]:
    """A frame's payload as a JSON object (``Z``: compressed, inflated to at most
    ``MAX_JSON`` bytes); ``BadRequest`` for anything else."""
    try:
        if kind == b"Z":
            inflate = zlib.decompressobj()
            payload = inflate.decompress(payload, MAX_JSON)
            if inflate.unconsumed_tail:
                raise ValueError("decompressed frame too large")
        obj = _loads(payload.decode("utf-8", "surrogateescape"))
    except (ValueError, zlib.error, RecursionError) as exc:
        raise BadRequest(f"undecodable {kind!r} frame") from exc
    if not isinstance(obj, dict):
        raise BadRequest(f"{kind!r} frame is not a JSON object")
    return obj


def json_payload(obj: dict[str, Any], kind: bytes = b"J") -> bytes:
    """``obj`` as the payload of a ``kind`` frame (``Z``: compressed at ``Z_LEVEL``)."""
    data = encode_json(obj)
    return zlib.compress(data, Z_LEVEL) if kind == b"Z" else data


#: One listing row as JSON (two strings, five counts), as the encoder writes it.
_ROW_TEXT = "[%s,%s,%d,%d,%d,%d,%d]"
#: A listing reply's rows, where ``listing_payload`` writes them in.
_NO_ENTRIES = '"entries":[]'


def listing_payload(reply: dict[str, Any]) -> bytes:
    """``json_payload(reply, b"Z")`` of a listing reply, byte for byte, each of its
    ``entries`` rows (``listing_row``'s layout, as the walk makes them) written by one
    format operation, where the encoder takes 1.7 times as long for a row of seven values
    (a 100k-file listing: about 65 ms against 110 ms here)."""
    if "entries" not in reply:  # a root that is not a directory
        return json_payload(reply, b"Z")
    quote = _quote
    rows = ",".join([_ROW_TEXT % (quote(r[0]), quote(r[1]), r[2], r[3], r[4], r[5], r[6])
                     for r in reply["entries"]])
    text = _dumps({**reply, "entries": []})
    # The first occurrence is the key: a quote inside a string is always escaped.
    at = text.index(_NO_ENTRIES) + len(_NO_ENTRIES) - 1
    data = (text[:at] + rows + text[at:]).encode("utf-8", "surrogateescape")
    return zlib.compress(data, Z_LEVEL)


def listing_digest(kind: bytes, payload: bytes) -> str:
    """The digest of a listing reply frame, as the client and the helper both take it (a
    ``Seal`` holds it): the helper has only the standard library, hence BLAKE2b."""
    h = blake2b(kind, digest_size=16)
    h.update(payload)
    return h.hexdigest()


class Gather:
    """Frames gathered into writes of about ``FLUSH_AT`` bytes; data of ``DIRECT`` bytes
    or more goes straight through (no copy). Each ``add`` returns the writes due now, in
    order; ``take`` the rest. Sans I/O: the caller writes (a pipe, a conduit)."""

    __slots__ = ("pending",)

    def __init__(self) -> None:
        self.pending = bytearray()

    def add(self, kind: bytes, payload: bytes) -> list[bytes]:
        pending = self.pending
        pending += HEADER.pack(kind, len(payload))
        if len(payload) >= DIRECT:
            out = [bytes(pending), payload]
            pending.clear()
            return out
        pending += payload
        return [self.take()] if len(pending) >= FLUSH_AT else []

    def add_whole(self, head: bytes, body: bytes) -> list[bytes]:
        """The ``W`` frame of a whole small upload (``head``: ``whole_head``'s bytes)."""
        pending = self.pending
        pending += HEADER.pack(b"W", len(head) + len(body))
        pending += head
        pending += body
        return [self.take()] if len(pending) >= FLUSH_AT else []

    def take(self) -> bytes:
        """What is pending, now to be written."""
        data = bytes(self.pending)
        self.pending.clear()
        return data


def whole_head(path: str, mode: int, mtime_ns: int,
               expect: tuple[int, int] | None) -> bytes | None:
    """The header of a ``W`` frame for these fields, path included; None if they do not fit
    its layout (a negative or oversized count, a name that is not bytes): such a file goes
    as ``H``/``D``/``E``, whose JSON header the helper checks field by field."""
    try:
        name = path.encode("utf-8", "surrogateescape")
        if not name.isascii() and name.decode("utf-8", "surrogateescape") != path:
            return None  # escapes that read back as another name: JSON keeps it exact
        if expect is None:
            return WHOLE_HEAD.pack(len(name), mode, mtime_ns, 0, 0, 0) + name
        return WHOLE_HEAD.pack(len(name), mode, mtime_ns, 1, expect[0], expect[1]) + name
    except (struct.error, UnicodeEncodeError, TypeError):
        return None


def split_whole(payload: bytes) -> tuple[str, int, int, list[int] | None, memoryview]:
    """A ``W`` frame's path, mode, mtime_ns, expect and file bytes (the same fields
    ``file_header`` gives of a JSON header); ``BadRequest`` for a payload that does not
    hold them."""
    if len(payload) < WHOLE_HEAD.size:
        raise BadRequest("W frame shorter than its header")
    length, mode, mtime_ns, has_expect, size, expect_mtime = WHOLE_HEAD.unpack_from(payload)
    end = WHOLE_HEAD.size + length
    if end > len(payload) or has_expect > 1:
        raise BadRequest("malformed W frame header")
    rel = payload[WHOLE_HEAD.size:end].decode("utf-8", "surrogateescape")
    return (rel, mode, mtime_ns, [size, expect_mtime] if has_expect else None,
            memoryview(payload)[end:])


# -- messages and rows ----------------------------------------------------------------


class Op(str, enum.Enum):  # noqa: UP042 (the remote may run a python3 before 3.11)
    """A request's ``op``."""

    LIST = "list"
    FETCH = "fetch"
    SEND = "send"
    DELETE = "delete"
    BYE = "bye"
    #: ``{"every": seconds}``: the client's keepalive pace; no reply
    KEEPALIVE = "keepalive"
    #: sleep until a watched root changes, ``timeout`` passes, or the client says anything
    WAIT = "wait"
    #: ends a running ``wait``; no reply of its own
    WAKE = "wake"
    #: ``{"paths": [absolute, ...]}``: ``{"found": bool}``, whether any of them exists
    #: (symlinks followed); the self-sync check's probe
    EXISTS = "exists"
    #: ``{"root", "names", "rules", "since": gen}``: ``{"digest": str}``, the
    #: ``listing_digest`` of the listing a fresh helper would send first for that root and
    #: rule, if the root is exactly as listing ``since`` left it plus what this helper
    #: wrote and deleted under it since; ``""`` if not, or if it cannot tell
    SEAL = "seal"


class Status(str, enum.Enum):  # noqa: UP042 (the remote may run a python3 before 3.11)
    """What was done with one file, on either side: the remote's result rows and
    ``Outcome``, the host's ``OpResult``."""

    OK = "ok"
    #: the target changed since it was listed or scanned: left as it is
    CHANGED = "changed"
    ERROR = "error"


#: A listing row (``walk``): path, kind (``"f"``), size, mtime_ns, mode, inode, link count.
ROW_PATH, ROW_KIND, ROW_SIZE, ROW_MTIME, ROW_MODE, ROW_INO, ROW_NLINK = range(7)
ROW_LEN = 7
#: A skipped row: path, reason code, OS detail.
SKIP_PATH, SKIP_CODE, SKIP_DETAIL = range(3)
#: A result row (send, delete): path, status, then size and mtime_ns (``ok`` of a send),
#: nothing (``ok`` of a delete) or code and detail (``changed``, ``error``).
RES_PATH, RES_STATUS = 0, 1


def listing_row(row: object) -> bool:
    """``row`` has the listing row's layout: exact types (JSON gives nothing else; bools
    are refused) and one sign check for the five counts, a third less time per row than
    ``isinstance`` calls (a listing decodes 100k of them)."""
    if type(row) is not list or len(row) != ROW_LEN:
        return False
    rel, kind, size, mtime_ns, mode, ino, nlink = row
    return (type(rel) is str and type(kind) is str and type(size) is int
            and type(mtime_ns) is int and type(mode) is int and type(ino) is int
            and type(nlink) is int and size | mtime_ns | mode | ino | nlink >= 0)


def skipped_row(row: object) -> bool:
    """``row`` has the skipped row's layout: three strings."""
    return isinstance(row, list) and len(row) == 3 and all(isinstance(x, str) for x in row)


def ok_sent(row: object, path: str) -> bool:
    """``row`` is the common result, ``[path, "ok", size, mtime_ns]``, for ``path``:
    checked inline, with exact types (the fast path of a 100k-file send)."""
    return (type(row) is list and len(row) == 4 and row[1] == "ok" and row[0] == path
            and type(row[2]) is int and type(row[3]) is int and row[2] >= 0 and row[3] >= 0)


def result_row(row: object) -> tuple[str, Status, list[Any]] | None:
    """A result row's path, status and the rest (``[size, mtime_ns]``, ``[]`` or
    ``[code, detail]``, each checked); None if it has no such layout."""
    if not (isinstance(row, list) and len(row) >= 2 and isinstance(row[0], str)):
        return None
    rest = row[2:]
    if row[1] == Status.OK:
        if not rest or (len(rest) >= 2 and is_count(rest[0]) and is_count(rest[1])):
            return row[0], Status.OK, rest[:2]
        return None
    if row[1] in (Status.CHANGED, Status.ERROR) and len(rest) == 2:
        return row[0], Status(row[1]), rest
    return None


def file_header(head: dict[str, Any]) -> tuple[str, int, int, list[int] | None]:
    """An upload's ``path``, ``mode``, ``mtime_ns`` and ``expect``; ``BadRequest`` if any
    is not what it must be."""
    rel: Any = head.get("path")
    mode: Any = head.get("mode")
    mtime_ns: Any = head.get("mtime_ns")
    expect: Any = head.get("expect")
    if not (isinstance(rel, str) and is_count(mode) and is_count(mtime_ns) and (
        expect is None
        or (isinstance(expect, list) and len(expect) == 2 and all(map(is_count, expect)))
    )):
        raise BadRequest("malformed file header")
    return rel, mode, mtime_ns, expect


def fetch_header(head: dict[str, Any]) -> tuple[int, int, int] | None:
    """A fetched file's ``size``, ``mtime_ns`` and ``mode``; None if any is not a count."""
    size, mtime_ns, mode = head.get("size"), head.get("mtime_ns"), head.get("mode")
    if is_count(size) and is_count(mtime_ns) and is_count(mode):
        return size, mtime_ns, mode  # type: ignore[return-value]
    return None
