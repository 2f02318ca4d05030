"""The client side of the remote helper protocol, over any conduit.

``RemoteSession.start`` launches the helper (``python3 -c``, its source fed on
stdin) in one remote process and keeps it for the whole run: listing, fetching,
sending and deleting are requests on that one stream, with no per-file round trip.
"""

from __future__ import annotations

import json
import posixpath
import shlex
import struct
import zlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from filesync.errors import ConnectionLost, TransportError
from filesync.exclude import ExcludeRule
from filesync.model import FILE, Entry, Listing, Skipped
from filesync.transport.base import Conduit, RemoteProcess

_HEADER = struct.Struct(">cI")
NO_PYTHON = b"FILESYNC-NO-PYTHON"


@cache
def helper_payload() -> bytes:
    """The helper's source, compressed, as it is sent over stdin."""
    source = resources.files("filesync").joinpath("helper.py").read_bytes()
    return zlib.compress(source, 9)


def bootstrap_command() -> str:
    """A shell command that runs the helper fed on stdin, or says python3 is missing."""
    n = len(helper_payload())
    code = (
        "import sys,zlib;exec(compile(zlib.decompress("
        f"sys.stdin.buffer.read({n})),'filesync-helper','exec'))"
    )
    return (
        "if command -v python3 >/dev/null 2>&1; then exec python3 -c "
        f"{shlex.quote(code)}; else echo {NO_PYTHON.decode()}; fi"
    )


@dataclass(slots=True)
class SendItem:
    """One file to upload. ``expect`` is the remote (size, mtime_ns) it may replace."""

    path: str
    mode: int
    mtime_ns: int
    expect: tuple[int, int] | None
    chunks: Callable[[], Any]  # returns an iterator of bytes; may raise to abort


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the remote did with one file: ``ok``, ``changed`` or ``error``."""

    path: str
    status: str
    size: int = 0
    mtime_ns: int = 0
    reason: str = ""


@dataclass(frozen=True, slots=True)
class FetchHeader:
    path: str
    size: int
    mtime_ns: int
    mode: int


class NoPython(TransportError):
    """The remote has no python3: the caller may fall back to the POSIX path."""


class FetchSink:
    """Receives fetched files. ``begin`` returns a writer; ``end`` says if it was whole."""

    def begin(self, head: FetchHeader) -> Callable[[bytes], None]:
        raise NotImplementedError

    def end(self, head: FetchHeader, ok: bool, reason: str) -> None:
        raise NotImplementedError

    def failed(self, path: str, reason: str) -> None:
        raise NotImplementedError


class RemoteSession:
    """One helper process on the remote side, serving one root."""

    def __init__(self, conduit: Conduit, proc: RemoteProcess, hello: dict[str, Any]) -> None:
        self.conduit = conduit
        self.proc = proc
        self.hello = hello

    @classmethod
    async def start(cls, conduit: Conduit) -> RemoteSession:
        """Start the helper; raise ``TransportError`` if the remote can't run it."""
        proc = await conduit.start(bootstrap_command())
        await proc.write(helper_payload())
        first = await proc.read(1)
        if first != b"J":
            rest = first + await _drain(proc)
            if rest.startswith(NO_PYTHON):
                raise NoPython(
                    "the remote has no python3; install python3 there "
                    "(the POSIX fallback needs tar and find)"
                )
            err = (await proc.read_stderr()).decode(errors="replace").strip().splitlines()
            tail = err[-1] if err else rest.decode(errors="replace").strip()[:200]
            raise TransportError(f"the remote helper did not start: {tail or 'no output'}")
        session = cls(conduit, proc, {})
        session.hello = await session._payload(first)
        return session

    def resolve_root(self, path: str) -> str:
        """The absolute remote root for ``path`` (relative paths are relative to home)."""
        cwd = str(self.hello.get("cwd", "/"))
        if path == "~" or path.startswith("~/"):
            path = path[2:] if len(path) > 1 else ""
        return posixpath.normpath(posixpath.join(cwd, path))

    # -- framing ------------------------------------------------------------------

    async def _send(self, kind: bytes, payload: bytes) -> None:
        await self.proc.write(_HEADER.pack(kind, len(payload)) + payload)

    async def _request(self, obj: dict[str, Any]) -> None:
        await self._send(b"J", json.dumps(obj).encode("utf-8", "surrogateescape"))

    async def _frame(self) -> tuple[bytes, bytes]:
        kind, length = _HEADER.unpack(await self.proc.readexactly(_HEADER.size))
        return kind, await self.proc.readexactly(length)

    async def _payload(self, kind_byte: bytes) -> dict[str, Any]:
        rest = await self.proc.readexactly(_HEADER.size - 1)
        (length,) = struct.unpack(">I", rest)
        return _decode(kind_byte, await self.proc.readexactly(length))

    async def _reply(self) -> dict[str, Any]:
        kind, payload = await self._frame()
        obj = _decode(kind, payload)
        if "error" in obj and kind in (b"J", b"Z"):
            raise TransportError(f"remote: {obj['error']}")
        return obj

    # -- operations -------------------------------------------------------------

    async def list_tree(self, root: str, rule: ExcludeRule) -> Listing:
        """List regular files under ``root``, pruned on the remote by ``rule``."""
        await self._request({"op": "list", "root": root, **rule.wire()})
        reply = await self._reply()
        listing = Listing(reply["root"], bool(reply["exists"]))
        if reply["exists"] and not reply["is_dir"]:
            raise TransportError(
                f"remote root {reply['root']} is not a directory; give a directory path"
            )
        for rel, kind, size, mtime_ns, mode, ino, nlink in reply.get("entries", []):
            if nlink > 1:
                listing.skipped.append(Skipped(rel, "hard link on the remote (not synced)"))
                continue
            listing.entries[rel] = Entry(rel, kind, size, mtime_ns, mode, ino)
        listing.skipped += [Skipped(p, r) for p, r in reply.get("skipped", [])]
        listing.excluded = int(reply.get("excluded", 0))
        return listing

    async def fetch(self, root: str, paths: Sequence[str], sink: FetchSink) -> None:
        """Stream ``paths`` into ``sink``; torn or vanished files are reported to it."""
        await self._request({"op": "fetch", "root": root, "paths": list(paths)})
        while True:
            kind, payload = await self._frame()
            obj = _decode(kind, payload) if kind != b"D" else {}
            if kind == b"J":
                if "error" in obj:
                    raise TransportError(f"remote: {obj['error']}")
                return
            if kind != b"H":
                raise TransportError("remote helper sent an unexpected frame; rerun")
            if "error" in obj:
                sink.failed(obj["path"], obj["error"])
                continue
            await self._receive(FetchHeader(obj["path"], obj["size"], obj["mtime_ns"],
                                            obj["mode"]), sink)

    async def _receive(self, head: FetchHeader, sink: FetchSink) -> None:
        write = sink.begin(head)
        while True:
            kind, payload = await self._frame()
            if kind == b"D":
                write(payload)
                continue
            end = _decode(kind, payload)
            sink.end(head, bool(end.get("ok")), str(end.get("error", "")))
            return

    async def send(self, root: str, items: Sequence[SendItem]) -> list[Outcome]:
        """Upload ``items`` in one stream; each is renamed into place only if unchanged."""
        await self._request({"op": "send", "root": root, "count": len(items)})
        for item in items:
            head = {"path": item.path, "mode": item.mode, "mtime_ns": item.mtime_ns,
                    "expect": list(item.expect) if item.expect else None}
            await self._send(b"H", json.dumps(head).encode("utf-8", "surrogateescape"))
            end: dict[str, Any] = {"ok": True}
            try:
                for chunk in item.chunks():
                    await self._send(b"D", chunk)
            except OSError as exc:
                end = {"ok": False, "error": f"local read failed: {exc.strerror}"}
            await self._send(b"E", json.dumps(end).encode())
        reply = await self._reply()
        return [_outcome(r) for r in reply["results"]]

    async def delete(self, root: str, files: Sequence[Entry]) -> list[Outcome]:
        """Delete files that are still as listed; others come back ``changed``."""
        req = [[e.path, e.size, e.mtime_ns] for e in files if e.kind == FILE]
        await self._request({"op": "delete", "root": root, "files": req})
        reply = await self._reply()
        return [_outcome(r) for r in reply["results"]]

    async def close(self) -> None:
        """Ask the helper to exit and wait for it; never raises."""
        try:
            await self._request({"op": "bye"})
            await self._reply()
            await self.proc.write_eof()
            await self.proc.wait()
        except Exception:
            self.proc.kill()


def _decode(kind: bytes, payload: bytes) -> dict[str, Any]:
    if kind == b"Z":
        payload = zlib.decompress(payload)
    try:
        obj = json.loads(payload.decode("utf-8", "surrogateescape"))
    except ValueError as exc:
        raise TransportError("remote helper sent garbage; check the remote's python3") from exc
    if not isinstance(obj, dict):
        raise TransportError("remote helper sent garbage; check the remote's python3")
    return obj


def _outcome(row: list[Any]) -> Outcome:
    if row[1] == "ok":
        return Outcome(row[0], "ok", *(row[2:4] if len(row) >= 4 else (0, 0)))
    return Outcome(row[0], row[1], reason=str(row[2]))


async def _drain(proc: RemoteProcess) -> bytes:
    chunks = []
    while chunk := await proc.read(1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


Opener = Callable[[], Awaitable[Conduit]]

__all__ = ["ConnectionLost", "FetchHeader", "FetchSink", "Outcome", "RemoteSession", "SendItem"]
