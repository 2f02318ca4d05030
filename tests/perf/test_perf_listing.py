"""Correctness of the warm-pass speed-ups (no timings are asserted here).

- within one helper session a listing is sent as a delta against the previous one for
  the same root and rule; the client's result is exactly what a full listing gives, and
  a new session (or a base the helper does not hold) gets a full listing;
- ``prefetch_list`` sends the listing request ahead, ``list_tree`` reads its reply;
- a delta that does not fit the client's base is refused as garbage;
- ``PairState`` keeps its database and table reads between runs of one process, in step
  with its own writes and dropped when anything else wrote or the file was replaced;
- ``paths.all_safe`` never passes a name that ``unsafe_reason`` refuses;
- the walk stats through directory descriptors, and still follows a symlinked root.
"""

from __future__ import annotations

import asyncio
import copy
import io
import json
import os
import shutil
import sqlite3
import struct
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from synctree import snapshot, write

from filesync.core.exclude import ExcludeRule
from filesync.core.model import Listing
from filesync.core.reconcile import Direction
from filesync.endpoint.helper import HelperEndpoint
from filesync.errors import TransportError
from filesync.host import state
from filesync.host.state import Ancestor, PairState
from filesync.sync.engine import Options, run_pass
from filesync.sync.warm import WarmState
from filesync.transport.base import Conduit, RemoteProcess
from filesync.transport.local import local_conduit
from filesync.tree import server, walk
from filesync.tree.paths import all_safe, unsafe_reason
from filesync.tree.wire import PROTOCOL

HEADER = struct.Struct(">cI")
RULE = ExcludeRule.build(default_excludes=False)
OLD_NS = 1_600_000_000_000_000_000


def view(listing: Listing) -> tuple[dict[str, Any], list[tuple[str, str]], int, bool]:
    """Everything a listing says, independent of the order it was built in."""
    skipped = sorted((s.path, s.reason) for s in listing.skipped)
    return dict(listing.entries), skipped, listing.excluded, listing.exists


def spy_replies(session: HelperEndpoint) -> list[dict[str, Any]]:
    """Record every decoded reply of ``session``, as it came (a copy: the session lets go
    of a listing's rows as it reads them)."""
    seen: list[dict[str, Any]] = []
    real: Callable[[bytes, bytes], dict[str, Any]] = session._reply_of

    def recording(kind: bytes, payload: bytes) -> dict[str, Any]:
        obj = real(kind, payload)
        seen.append(copy.deepcopy(obj))
        return obj

    session._reply_of = recording  # type: ignore[method-assign]
    return seen


async def full_listing(root: Path, rule: ExcludeRule = RULE) -> Listing:
    """The listing of a session of its own: no base, so always a full reply."""
    conduit = local_conduit()
    session = await HelperEndpoint.start(conduit)
    try:
        return await session.list_tree(str(root), rule)
    finally:
        await session.close()
        await conduit.close()


def tree(root: Path) -> None:
    write(root / "a.txt", "a")
    write(root / "b" / "c.txt", "c")
    write(root / "b" / "d.txt", "d")
    write(root / "e" / "f.txt", "f")
    write(root / "node_modules" / "x.js", "x")
    os.symlink("a.txt", root / "link")
    for p in root.rglob("*"):
        if p.is_file() and not p.is_symlink():
            os.utime(p, ns=(OLD_NS, OLD_NS))


def change(root: Path) -> None:
    """An edit, a removal, an addition, a new hard link, a mode change, a new dir."""
    write(root / "a.txt", "a, edited")
    (root / "b" / "d.txt").unlink()
    write(root / "b" / "new.txt", "new")
    os.link(root / "e" / "f.txt", root / "e" / "g.txt")  # both now have nlink 2
    (root / "b" / "c.txt").chmod(0o600)
    write(root / "h" / "i.txt", "i")


def test_a_delta_listing_equals_a_full_listing(tmp_path: Path) -> None:
    root = tmp_path / "r"
    tree(root)

    async def main() -> None:
        conduit = local_conduit()
        session = await HelperEndpoint.start(conduit)
        replies = spy_replies(session)
        try:
            first = await session.list_tree(str(root), RULE)
            assert view(first) == view(await full_listing(root))
            assert "base" not in replies[-1]  # a new session: full
            assert len(replies[-1]["entries"]) == 4 + 1  # node_modules is not excluded
            # The caller may change its listing: the session's base is its own copy.
            first.entries.clear()
            change(root)
            second = await session.list_tree(str(root), RULE)
            reply = replies[-1]
            assert "base" in reply and reply["base"] == replies[-2]["gen"]
            sent = {row[0] for row in reply["entries"]}
            assert sent == {"a.txt", "b/new.txt", "b/c.txt", "e/f.txt", "e/g.txt", "h/i.txt"}
            assert reply["removed"] == ["b/d.txt"]
            assert view(second) == view(await full_listing(root))
            assert "e/f.txt" not in second.entries  # a hard link now: skipped
            # Undo the hard link and remove a whole dir: the delta brings f.txt back.
            (root / "e" / "g.txt").unlink()
            shutil.rmtree(root / "h")
            third = await session.list_tree(str(root), RULE)
            assert "base" in replies[-1]
            assert view(third) == view(await full_listing(root))
            assert "e/f.txt" in third.entries and "h/i.txt" not in third.entries
            # Nothing changed: an empty delta, the same listing.
            fourth = await session.list_tree(str(root), RULE)
            assert replies[-1]["entries"] == [] and replies[-1]["removed"] == []
            assert view(fourth) == view(third)
            # Another rule is another base: the first listing with it is full.
            ruled = await session.list_tree(str(root), ExcludeRule.build())
            assert "base" not in replies[-1]
            assert view(ruled) == view(await full_listing(root, ExcludeRule.build()))
            # ... and the first rule's base is still there.
            await session.list_tree(str(root), RULE)
            assert "base" in replies[-1]
        finally:
            await session.close()
            await conduit.close()

    asyncio.run(main())


def test_a_new_session_gets_a_full_listing(tmp_path: Path) -> None:
    root = tmp_path / "r"
    tree(root)

    async def main() -> None:
        conduit = local_conduit()
        try:
            for _ in range(2):
                session = await HelperEndpoint.start(conduit)
                replies = spy_replies(session)
                await session.list_tree(str(root), RULE)
                reply = replies[-1]
                await session.close()
                assert "base" not in reply and "removed" not in reply
                assert len(reply["entries"]) == 5
        finally:
            await conduit.close()

    asyncio.run(main())


def test_a_lost_reply_means_a_full_listing_next(tmp_path: Path) -> None:
    """A listing reply the client dropped is no base: the next one is full again."""
    root = tmp_path / "r"
    tree(root)

    async def main() -> None:
        conduit = local_conduit()
        session = await HelperEndpoint.start(conduit)
        replies = spy_replies(session)
        try:
            await session.list_tree(str(root), RULE)
            await session.prefetch_list(str(root), RULE)
            change(root)
            await session.delete(str(root), [])  # drops the unread listing reply
            listing = await session.list_tree(str(root), RULE)
            assert "base" not in replies[-1]
            assert view(listing) == view(await full_listing(root))
        finally:
            await session.close()
            await conduit.close()

    asyncio.run(main())


def test_prefetch_list_is_read_by_list_tree(tmp_path: Path) -> None:
    root = tmp_path / "r"
    tree(root)

    async def main() -> None:
        conduit = local_conduit()
        session = await HelperEndpoint.start(conduit)
        try:
            await session.list_tree(str(root), RULE)
            await session.prefetch_list(str(root), RULE)
            await session.prefetch_list(str(root), RULE)  # one pending at a time
            change(root)  # after the request: the helper may have walked already or not
            listing = await session.list_tree(str(root), RULE)
            again = await session.list_tree(str(root), RULE)
            assert view(again) == view(await full_listing(root))
            assert set(listing.entries) <= set(again.entries) | {"b/d.txt", "e/f.txt"}
            assert session._early is None and not session.broken
        finally:
            await session.close()
            await conduit.close()

    asyncio.run(main())


# -- the helper's side of the delta --------------------------------------------------------


def serve(*requests: dict[str, Any]) -> list[dict[str, Any]]:
    """Replies of ``server.serve`` to ``requests`` (hello first)."""
    inp = b"".join(HEADER.pack(b"J", len(p)) + p
                   for p in (json.dumps(r).encode() for r in requests))
    out = io.BytesIO()
    server.serve(io.BytesIO(inp), out)
    data, replies = out.getvalue(), []
    while data:
        kind, length = HEADER.unpack(data[:HEADER.size])
        payload = data[HEADER.size:HEADER.size + length]
        data = data[HEADER.size + length:]
        replies.append(json.loads(zlib.decompress(payload) if kind == b"Z" else payload))
    return replies


def test_the_helper_sends_a_delta_only_against_the_generation_it_holds(tmp_path: Path) -> None:
    root = tmp_path / "r"
    tree(root)
    ask: dict[str, Any] = {"op": "list", "root": str(root), **RULE.wire()}
    _hello, plain, first, bogus, boolean, good, other = serve(
        ask,  # no "delta": nothing remembered, no generation
        {**ask, "delta": True},
        {**ask, "delta": True, "since": 99},
        {**ask, "delta": True, "since": True},
        {**ask, "delta": True, "since": 3},  # the generation of the reply before
        {**ask, "root": str(root / "b"), "delta": True, "since": 4},  # another root
    )
    assert "gen" not in plain and "base" not in plain
    for full in (first, bogus, boolean):
        assert "base" not in full and len(full["entries"]) == len(plain["entries"])
    assert "base" not in other and {row[0] for row in other["entries"]} == {"c.txt", "d.txt"}
    assert [first["gen"], bogus["gen"], boolean["gen"], good["gen"]] == [1, 2, 3, 4]
    assert good["base"] == 3 and good["entries"] == [] and good["removed"] == []


# -- a helper that answers with a delta the client never asked for ----------------------------


class Scripted(RemoteProcess):
    """A remote process whose output is fixed in advance; input is discarded."""

    def __init__(self, output: bytes) -> None:
        self.data = output

    async def write(self, data: bytes) -> None:
        pass

    async def write_eof(self) -> None:
        pass

    async def readexactly(self, n: int) -> bytes:
        if len(self.data) < n:
            raise TransportError("ended")
        chunk, self.data = self.data[:n], self.data[n:]
        return chunk

    async def read(self, n: int) -> bytes:
        chunk, self.data = self.data[:n], self.data[n:]
        return chunk

    async def read_stderr(self) -> bytes:
        return b""

    async def wait(self) -> int:
        return 0

    def kill(self) -> None:
        pass


class ScriptedConduit(Conduit):
    identity = "scripted"

    def __init__(self, output: bytes) -> None:
        self.output = output

    async def start(self, command: str) -> RemoteProcess:
        return Scripted(self.output)

    async def close(self) -> None:
        pass

    @property
    def bytes_sent(self) -> int:
        return 0

    @property
    def bytes_received(self) -> int:
        return 0


def jframe(obj: dict[str, Any], kind: bytes = b"J") -> bytes:
    payload = json.dumps(obj).encode()
    if kind == b"Z":
        payload = zlib.compress(payload)
    return HEADER.pack(kind, len(payload)) + payload


ROW = ["a.txt", "f", 1, 1, 0o644, 1, 1]


@pytest.mark.parametrize(("first", "second"), [
    ({"gen": 1, "entries": [ROW]}, {"gen": 2, "base": 7, "entries": [], "removed": []}),
    ({"entries": [ROW]}, {"gen": 2, "base": 1, "entries": [], "removed": []}),
    ({"gen": 1, "entries": [ROW]}, {"gen": 2, "base": 1, "entries": [], "removed": ["zz"]}),
    ({"gen": 1, "entries": [ROW]}, {"gen": 2, "base": 1, "entries": [], "removed": "a.txt"}),
    ({"gen": 1, "entries": [ROW]}, {"gen": 2, "base": 1, "entries": [], "removed": [1]}),
])
def test_a_delta_that_does_not_fit_the_base_is_garbage(
    first: dict[str, Any], second: dict[str, Any]
) -> None:
    head = {"root": "/r", "exists": True, "is_dir": True, "skipped": [], "excluded": 0}
    output = (jframe({"hello": PROTOCOL, "cwd": "/", "home": "/"})
              + jframe({**head, **first}, b"Z") + jframe({**head, **second}, b"Z"))

    async def main() -> None:
        session = await HelperEndpoint.start(ScriptedConduit(output))
        listing = await session.list_tree("/r", RULE)
        assert list(listing.entries) == ["a.txt"]
        with pytest.raises(TransportError, match="garbage"):
            await session.list_tree("/r", RULE)
        assert session.broken

    asyncio.run(main())


# -- the engine on one conduit: warm passes with deltas converge ------------------------------


def test_warm_passes_on_one_conduit_stay_exact(tmp_path: Path) -> None:
    local, remote, state_dir = tmp_path / "l", tmp_path / "r", tmp_path / "s"
    tree(remote)
    (remote / "link").unlink()
    local.mkdir()

    async def main() -> None:
        conduit = local_conduit()
        warm = WarmState()
        try:
            async def sync(direction: Direction = Direction.SYNC) -> Any:
                return await run_pass(conduit, local, str(remote),
                                      Options(direction, rule=RULE, state_dir=state_dir),
                                      warm=warm)

            await sync()
            assert snapshot(local) == snapshot(remote)
            write(remote / "a.txt", "remote edit")
            (remote / "b" / "d.txt").unlink()
            write(remote / "z" / "new.txt", "new")
            report = await sync(Direction.PULL)
            assert (report.downloaded, report.deleted_local) == (2, 1)
            assert snapshot(local) == snapshot(remote)
            write(local / "b" / "c.txt", "local edit")
            report = await sync()
            assert report.uploaded == 1 and snapshot(local) == snapshot(remote)
            report = await sync()
            assert (report.uploaded, report.downloaded) == (0, 0)
            # A new endpoint (the old one dropped) starts from a full listing again.
            await warm.endpoints.drop_endpoint(conduit)
            (remote / "z" / "new.txt").unlink()
            report = await sync(Direction.PULL)
            assert report.deleted_local == 1 and snapshot(local) == snapshot(remote)
        finally:
            await warm.close()
            await conduit.close()

    asyncio.run(main())


# -- the kept state database ----------------------------------------------------------------


PAIR = ("/local", "host", "/remote")


def anc(n: int) -> Ancestor:
    return Ancestor(f"h{n}", n, 0o644, n, n, n)


def on_disk(db: Path, table: str) -> set[tuple[Any, ...]]:
    conn = sqlite3.connect(db)
    try:
        return set(conn.execute(f"SELECT * FROM {table}"))  # fixed table names
    finally:
        conn.close()


@pytest.fixture
def pool() -> Iterator[state.StatePool]:
    """An owner's pool of state databases, closed after the test."""
    kept = state.StatePool()
    yield kept
    kept.close()


def test_kept_reads_follow_own_writes(tmp_path: Path, pool: state.StatePool) -> None:
    s = PairState.open(tmp_path, *PAIR, pool=pool)
    db = s.dir / "state.db"
    try:
        assert s.ancestors() == {} and s.local_cache() == {} and s.remote_cache() == {}
        s.put_ancestors([("a", anc(1)), ("b", anc(2))])
        s.forget(["b"])
        s.update_local_cache({"a": (1, 2, 3, "h"), "c": (4, 5, 6, "k")}, [])
        s.update_local_cache({}, ["c"])
        s.put_remote_cache([("a", 1, 2, "h")])
    finally:
        s.close()
    s = PairState.open(tmp_path, *PAIR, pool=pool)
    try:
        assert s.db is not None and s._mem is not None and s._mem.ancestors is not None
        assert s.ancestors() == {"a": anc(1)}
        assert {(p, *a) for p, a in s.ancestors().items()} == on_disk(db, "ancestor")
        assert s.local_cache() == {"a": (1, 2, 3, "h")}
        assert {(p, *v) for p, v in s.local_cache().items()} == on_disk(db, "local_cache")
        assert s.remote_cache() == {"a": (1, 2, "h")}
        # What a caller does to the dicts it got is not kept.
        s.ancestors().clear()
        s.local_cache()["zz"] = (0, 0, 0, "")
        assert s.ancestors() == {"a": anc(1)} and "zz" not in s.local_cache()
        s.replace_local_cache([("q", 1, 1, 1, "q")])
        assert s.local_cache() == {"q": (1, 1, 1, "q")}
    finally:
        s.close()


def test_kept_reads_are_dropped_when_another_connection_wrote(
    tmp_path: Path, pool: state.StatePool
) -> None:
    s = PairState.open(tmp_path, *PAIR, pool=pool)
    try:
        s.put_ancestors([("a", anc(1))])
        assert s.ancestors() == {"a": anc(1)}
        assert s.local_cache() == {} and s.remote_cache() == {}
    finally:
        s.close()
    conn = sqlite3.connect(s.dir / "state.db")
    with conn:
        conn.execute("INSERT INTO ancestor VALUES ('b','hb',2,420,2,2,2)")
        conn.execute("INSERT INTO local_cache VALUES ('b',2,2,2,'hb')")
        conn.execute("INSERT INTO remote_cache VALUES ('b',2,2,'hb')")
    conn.close()
    s = PairState.open(tmp_path, *PAIR, pool=pool)
    try:
        assert set(s.ancestors()) == {"a", "b"}
        assert s.local_cache() == {"b": (2, 2, 2, "hb")}
        assert s.remote_cache() == {"b": (2, 2, "hb")}
    finally:
        s.close()


def test_raw_transactions_and_failed_writes_drop_the_kept_reads(
    tmp_path: Path, pool: state.StatePool
) -> None:
    s = PairState.open(tmp_path, *PAIR, pool=pool)
    try:
        s.put_ancestors([("a", anc(1))])
        assert s.ancestors() == {"a": anc(1)}
        with s.transaction() as conn:
            conn.execute("DELETE FROM ancestor")
        assert s.ancestors() == {}
        bad = Ancestor(None, 1, 0o644, 1, 1, 1)  # type: ignore[arg-type]  # NOT NULL
        with pytest.raises(sqlite3.IntegrityError):
            s.put_ancestors([("x", anc(1)), ("y", bad)])
        assert s.ancestors() == {}
    finally:
        s.close()


def test_a_replaced_state_dir_is_not_served_from_memory(
    tmp_path: Path, pool: state.StatePool
) -> None:
    s = PairState.open(tmp_path, *PAIR, pool=pool)
    try:
        s.put_ancestors([("a", anc(1))])
        assert s.ancestors() == {"a": anc(1)}
    finally:
        s.close()
    shutil.rmtree(tmp_path / "pairs")
    s = PairState.open(tmp_path, *PAIR, pool=pool)
    try:
        assert s.ancestors() == {}
        assert (s.dir / "state.db").is_file()
    finally:
        s.close()


def test_the_pool_is_bounded_and_closed_by_its_owner(tmp_path: Path,
                                                     pool: state.StatePool) -> None:
    for n in range(state.POOL_MAX + 3):
        PairState.open(tmp_path / str(n), *PAIR, pool=pool).close()
    assert len(pool) == state.POOL_MAX
    pool.close()
    assert not len(pool)
    s = PairState.open(tmp_path / "0", *PAIR, pool=pool)  # reopens fine after
    s.close()


# -- path checks and the walk ------------------------------------------------------------------


NAMES = st.lists(
    st.text(alphabet=["a", ".", "/", "\n", "\x00", "\x1f", "\x7f", "\x85", "é", "\udcff"],
            max_size=6),
    max_size=4,
)


@settings(max_examples=500, deadline=None)
@given(NAMES)
def test_all_safe_never_passes_an_unsafe_name(paths: list[str]) -> None:
    if all_safe(paths):
        assert all(unsafe_reason(p) is None for p in paths)


ASCII_NAMES = st.lists(
    st.text(alphabet=["a", ".", "/", "\x00", "\x1f", "\x7f", "\t"], max_size=6),
    max_size=4,
)


@settings(max_examples=500, deadline=None)
@given(ASCII_NAMES)
def test_all_safe_is_exact_for_ascii_names_without_newlines(paths: list[str]) -> None:
    assert all_safe(paths) == all(unsafe_reason(p) is None for p in paths)


def test_all_safe_passes_ordinary_names() -> None:
    assert all_safe(["a", ".hidden", "d/.x", "d/e/f.txt", "a..b", "x/..y/z"])
    for bad in ("", "/a", "a//b", "a/", "./a", "a/../b", "a/..", "..", ".", "a/./b", "a/.",
                "../a", "a\nb", "a\x7fb", "a\tb", "\x00", "é"):
        assert not all_safe(["ok", bad]), bad


def test_the_walk_follows_a_symlinked_root_but_no_symlink_below(tmp_path: Path) -> None:
    real = tmp_path / "real"
    write(real / "a.txt", "a")
    write(tmp_path / "elsewhere" / "secret.txt", "s")
    os.symlink(tmp_path / "elsewhere", real / "sub")
    os.symlink(real, tmp_path / "root")
    entries, skipped, _ = walk.walk(str(tmp_path / "root"), RULE.matcher())
    assert [e[0] for e in entries] == ["a.txt"]
    assert skipped == [["sub", "symlink", ""]]
