"""The helper client's delta base outlives every pass of a watch: its rows hold one
object per distinct value where the decoder would make one per row, a path keeps the
string it was first listed with, and the decoded rows are let go of as they are read.
Real helper, local transport."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from synctree import write

import filesync.endpoint.helper as helper
from filesync.core.exclude import ExcludeRule
from filesync.endpoint.helper import HelperEndpoint
from filesync.transport.local import local_conduit


async def test_a_kept_listing_shares_its_modes_and_path_strings(tmp_path: Path) -> None:
    root = tmp_path / "r"
    for i in range(20):
        write(root / f"d{i % 2}" / f"f{i}.txt", f"file {i}\n")
        os.chmod(root / f"d{i % 2}" / f"f{i}.txt", 0o600 if i % 5 == 0 else 0o644)
    rule = ExcludeRule.build(default_excludes=False)
    conduit = local_conduit()
    session = await HelperEndpoint.start(conduit, watch=True)
    try:
        full = await session.list_tree(str(root), rule)
        rows = full.entries.values()
        assert len(rows) == 20
        # two modes among 20 rows: two int objects (the decoder's own would be 20)
        assert len({id(e.mode) for e in rows}) == len({e.mode for e in rows}) == 2
        write(root / "d0" / "f0.txt", "edited on the remote, longer than before\n")
        again = await session.list_tree(str(root), rule)
        was, now = full.entries["d0/f0.txt"], again.entries["d0/f0.txt"]
        assert now != was  # the delta's row replaced the listed one
        assert now.path is was.path  # with the string the path was first listed with
    finally:
        await session.close()
        await conduit.close()


async def test_each_decoded_row_is_let_go_of_once_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row's list is out of the decoded reply before the next row is read, so the
    entries made from the rows take up the rows' memory instead of new pages."""
    for i in range(50):
        write(tmp_path / "r" / f"f{i}.txt", f"file {i}\n")
    replies: list[list[Any]] = []
    left: list[int] = []  # rows still in the reply as each row is checked
    decode, check = helper.decode_json, helper.listing_row

    def decoding(kind: bytes, payload: bytes) -> dict[str, Any]:
        obj = decode(kind, payload)
        if isinstance(obj.get("entries"), list):
            replies.append(obj["entries"])
        return obj

    def checking(row: object) -> bool:
        left.append(sum(r is not None for r in replies[-1]))
        return check(row)

    monkeypatch.setattr(helper, "decode_json", decoding)
    monkeypatch.setattr(helper, "listing_row", checking)
    conduit = local_conduit()
    session = await HelperEndpoint.start(conduit)
    try:
        listing = await session.list_tree(str(tmp_path / "r"),
                                           ExcludeRule.build(default_excludes=False))
    finally:
        await session.close()
        await conduit.close()
    assert len(listing.entries) == 50
    assert left == [49 - i for i in range(50)]
