"""Uploads stream from a generator: the first file is sent while the rest are prepared."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from synctree import write

from filesync.endpoint.contract import SendItem
from filesync.endpoint.helper import HelperEndpoint
from filesync.host.scan import HashingReader
from filesync.transport.local import local_conduit


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
