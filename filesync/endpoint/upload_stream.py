"""The upload stream ``HelperEndpoint.send`` writes to the helper, in ``tree.wire`` frames.

Guarantees:

- a file that reads whole in at most ``WHOLE_MAX`` bytes is one ``W`` frame (its header
  binary, ``tree.wire.whole_head``); a bigger one, or one whose fields that header cannot
  hold, is ``H`` (JSON), its ``D`` chunks and ``E``; one whose local read fails ends with an error
  ``E`` (the helper drops it, and the rest of the stream goes on);
- frames are gathered (``tree.wire.Gather``, the helper's own codec) into writes of about
  ``FLUSH_AT`` bytes, data chunks of ``DIRECT`` bytes or more go straight through (no
  copy), and each write is awaited until the conduit took it: a small file is one part
  of a packet, not three packets;
- files are read as the stream goes: the first is on its way while the rest of ``items``
  (which may be a generator) are still being made.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable

from filesync.endpoint.contract import SendItem
from filesync.tree.wire import END_OK, WHOLE_MAX, Gather, Op, encode_json, whole_head


def file_head(item: SendItem) -> bytes:
    """An upload's header: the JSON object, formatted without a dict and an encoder run
    per file (only the path needs escaping)."""
    expect = f"[{item.expect[0]},{item.expect[1]}]" if item.expect else "null"
    path = json.dumps(item.path)
    return (f'{{"path":{path},"mode":{int(item.mode)},"mtime_ns":{int(item.mtime_ns)},'
            f'"expect":{expect}}}').encode("utf-8", "surrogateescape")


def _read_failed(exc: OSError) -> bytes:
    """The ``E`` frame of an upload whose local read failed (the remote drops the file)."""
    return encode_json({"ok": False, "error": f"local read failed: {exc.strerror}"})


async def write_stream(write: Callable[[bytes], Awaitable[None]], root: str,
                       items: Iterable[SendItem], count: int) -> list[str]:
    """Write the send request of ``count`` files to ``root``, then every file of
    ``items``; returns their paths in order. Raises ``ValueError`` before the stream's
    last write if ``items`` held other than ``count`` files."""
    gather = Gather()
    gather.add(b"J", encode_json({"op": Op.SEND.value, "root": root, "count": count}))

    async def put(kind: bytes, payload: bytes) -> None:
        for data in gather.add(kind, payload):
            await write(data)

    paths: list[str] = []
    for item in items:
        paths.append(item.path)
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
        binary = whole_head(item.path, item.mode, item.mtime_ns, item.expect) if whole else None
        if binary is not None:
            for data in gather.add_whole(binary, held[0] if len(held) == 1 else b"".join(held)):
                await write(data)
            continue
        await put(b"H", file_head(item))
        for chunk in held:
            await put(b"D", chunk)
        if failed is None:
            try:
                for chunk in chunks:
                    await put(b"D", chunk)
            except OSError as exc:
                failed = _read_failed(exc)
        await put(b"E", END_OK[0] if failed is None else failed)
    if len(paths) != count:
        raise ValueError(f"send: {len(paths)} items given, {count} announced")
    await write(gather.take())
    return paths
