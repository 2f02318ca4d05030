"""Uploads stream from a generator: the first file is sent while the rest are prepared."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from synctree import write

from filesync.endpoint.contract import SendItem
from filesync.endpoint.helper import HelperEndpoint
from filesync.endpoint.upload_stream import write_stream
from filesync.host.scan import HashingReader
from filesync.transport.local import local_conduit
from filesync.tree.wire import HEADER, WHOLE_MAX


async def test_a_generator_with_a_count_sends_like_a_list(tmp_path: Path) -> None:
    names = [f"d{i % 3}/f{i}.txt" for i in range(20)]
    for i, name in enumerate(names):
        write(tmp_path / "src" / name, f"file {i}\n" * (i + 1))
    made: list[str] = []

    def items() -> Iterator[SendItem]:
        for name in names:
            made.append(name)
            reader = HashingReader(str(tmp_path / "src" / name), None, 10)
            yield SendItem(name, 0o640, 1_700_000_000_000_000_000, None, reader)

    session = await HelperEndpoint.start(local_conduit())
    try:
        outcomes = await session.send(str(tmp_path / "dst"), items(), len(names))
        assert [o.path for o in outcomes] == names and {o.status for o in outcomes} == {"ok"}
        for name in names:
            assert (tmp_path / "dst" / name).read_bytes() == (tmp_path / "src" / name).read_bytes()
            assert (tmp_path / "dst" / name).stat().st_mode & 0o777 == 0o640
        with pytest.raises(ValueError, match="announced"):
            await session.send(str(tmp_path / "dst"), iter(()), 1)
    finally:
        await session.close()


def test_a_small_file_is_read_whole_with_a_size_hint(tmp_path: Path) -> None:
    path = write(tmp_path / "f", b"abc" * 1000)
    reader = HashingReader(str(path), None, 3000)
    assert b"".join(reader()) == b"abc" * 1000 and reader.size == 3000
    wrong = HashingReader(str(path), None, 10)  # a stale hint still reads everything
    assert b"".join(wrong()) == b"abc" * 1000 and wrong.digest == reader.digest


async def test_small_files_go_as_one_frame_and_big_or_unreadable_ones_as_a_stream(
    tmp_path: Path,
) -> None:
    """A file read whole in at most ``WHOLE_MAX`` bytes is one ``W`` frame; a bigger one is
    ``H``, ``D`` chunks and ``E``; one whose read fails is ``H`` and an error ``E``."""
    sizes = {"small.txt": 100, "edge.bin": WHOLE_MAX, "big.bin": WHOLE_MAX + 1, "empty": 0}
    for name, size in sizes.items():
        write(tmp_path / "src" / name, os.urandom(size))
    names = [*sizes, "gone.txt"]
    session = await HelperEndpoint.start(local_conduit())
    sent = bytearray()
    real = session.proc.write

    async def recording(data: bytes) -> None:
        sent.extend(data)
        await real(data)

    session.proc.write = recording  # type: ignore[method-assign]
    try:
        items = [SendItem(name, 0o644, 1_700_000_000_000_000_000, None,
                          HashingReader(str(tmp_path / "src" / name), None, sizes.get(name, 0)))
                 for name in names]
        outcomes = await session.send(str(tmp_path / "dst"), items)
        stream = bytes(sent)  # the send request and its files, not the goodbye
    finally:
        await session.close()
    assert [o.status for o in outcomes] == ["ok"] * 4 + ["error"]
    assert "local read failed" in outcomes[-1].reason
    for name in sizes:
        assert (tmp_path / "dst" / name).read_bytes() == (tmp_path / "src" / name).read_bytes()
    kinds, pos = [], 0
    while pos < len(stream):
        kind, length = HEADER.unpack_from(stream, pos)
        kinds.append(kind)
        pos += HEADER.size + length
    assert kinds == [b"J", b"W", b"W", b"H", b"D", b"E", b"W", b"H", b"E"]


async def test_a_small_file_whose_header_the_binary_layout_cannot_hold_goes_as_a_stream() -> None:
    """A negative mtime (or any field ``whole_head`` cannot pack) still reaches the helper,
    as ``H``/``D``/``E``, whose JSON header it checks as it always did."""
    sent = bytearray()

    async def write(data: bytes) -> None:
        sent.extend(data)

    items = [SendItem("old.txt", 0o644, -1, None, lambda: iter([b"1969"])),
             SendItem("new.txt", 0o644, 1, None, lambda: iter([b"now"]))]
    assert await write_stream(write, "/r", items, 2) == ["old.txt", "new.txt"]
    kinds, pos = [], 0
    while pos < len(sent):
        kind, length = HEADER.unpack_from(sent, pos)
        kinds.append(kind)
        pos += HEADER.size + length
    assert kinds == [b"J", b"H", b"D", b"E", b"W"]
    assert b'"mtime_ns":-1' in sent
