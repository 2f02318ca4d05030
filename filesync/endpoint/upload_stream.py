"""The upload stream ``HelperEndpoint.send`` writes to the helper, in ``tree.wire`` frames.

Guarantees:

- a file that reads whole in at most ``WHOLE_MAX`` bytes is one ``F`` frame; a bigger one
  is ``H``, its ``D`` chunks and ``E``; one whose local read fails ends with an error
  ``E`` (the helper drops it, and the rest of the stream goes on);
- frames are gathered into writes of about ``FLUSH_AT`` bytes, data chunks of ``DIRECT``
  bytes or more go straight through (no copy), and each write is awaited until the
  conduit took it: a small file is one part of a packet, not three packets;
- files are read as the stream goes: the first is on its way while the rest of ``items``
  (which may be a generator) are still being made.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from filesync.endpoint.contract import SendItem
from filesync.tree.wire import DIRECT, END_OK, FLUSH_AT, HEADER, WHOLE_MAX, put_whole


def json_bytes(obj: dict[str, Any]) -> bytes:
    """A JSON object as a frame's payload (names that are not UTF-8 survive)."""
    return json.dumps(obj).encode("utf-8", "surrogateescape")


def frame_bytes(kind: bytes, payload: bytes) -> bytes:
    return HEADER.pack(kind, len(payload)) + payload


def put(buf: bytearray, kind: bytes, payload: bytes) -> None:
    buf += HEADER.pack(kind, len(payload))
    buf += payload


def file_head(item: SendItem) -> bytes:
    """An upload's header: the JSON object, formatted without a dict and an encoder run
    per file (only the path needs escaping)."""
    expect = f"[{item.expect[0]},{item.expect[1]}]" if item.expect else "null"
    path = json.dumps(item.path)
    return (f'{{"path":{path},"mode":{int(item.mode)},"mtime_ns":{int(item.mtime_ns)},'
            f'"expect":{expect}}}').encode("utf-8", "surrogateescape")


def _read_failed(exc: OSError) -> bytes:
    """The ``E`` frame of an upload whose local read failed (the remote drops the file)."""
    return json_bytes({"ok": False, "error": f"local read failed: {exc.strerror}"})


async def write_stream(write: Callable[[bytes], Awaitable[None]], request: bytes,
                       items: Iterable[SendItem], count: int) -> list[str]:
    """Write ``request`` (the send request's frame), then every file of ``items``; returns
    their paths in order. Raises ``ValueError`` before the stream's last write if
    ``items`` held other than ``count`` files."""
    buf = bytearray(request)

    async def data(chunk: bytes) -> None:
        if len(chunk) >= DIRECT:
            buf.extend(HEADER.pack(b"D", len(chunk)))
            await write(bytes(buf))
            buf.clear()
            await write(chunk)
            return
        put(buf, b"D", chunk)
        if len(buf) >= FLUSH_AT:
            await write(bytes(buf))
            buf.clear()

    paths: list[str] = []
    for item in items:
        paths.append(item.path)
        head = file_head(item)
        chunks = iter(item.chunks())
        held: list[bytes] = []
        size = 0
        whole = False
        failed: bytes | None = None  # the E frame of a file whose local read failed
        try:
            for chunk in chunks:
                held.append(chunk)
                size += len(chunk)
                if size > WHOLE_MAX:
                    break
            else:
                whole = True  # read whole: ``held`` is the file
        except OSError as exc:
            failed = _read_failed(exc)
        if whole:
            put_whole(buf, head, held[0] if len(held) == 1 else b"".join(held))
        else:
            put(buf, b"H", head)
            for chunk in held:
                await data(chunk)
            if failed is None:
                try:
                    for chunk in chunks:
                        await data(chunk)
                except OSError as exc:
                    failed = _read_failed(exc)
            put(buf, b"E", END_OK[0] if failed is None else failed)
        if len(buf) >= FLUSH_AT:
            await write(bytes(buf))
            buf.clear()
    if len(paths) != count:
        raise ValueError(f"send: {len(paths)} items given, {count} announced")
    await write(bytes(buf))
    return paths
