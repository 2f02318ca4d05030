"""The seal (``filesync.sync.seal``): a pass that found the pair in sync leaves one; the
next pass whose two listings are the sealed ones compares nothing; anything else --
a change on either side, a state write, a racy mtime, a different rule, something
skipped or in conflict -- gets the full pass. Every pass runs on a new local-transport
session (the real remote helper), as the plain CLI does."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from synctree import snapshot, write

from filesync.core.exclude import ExcludeRule
from filesync.core.reconcile import Direction, Kind
from filesync.endpoint.helper import HelperEndpoint
from filesync.host.scan import DIGEST_ROWS, list_local, walk_digest
from filesync.host.state import Ancestor, PairState, Seal
from filesync.sync import plan as plan_module
from filesync.sync import seal as seal_module
from filesync.sync.engine import Options, Report, run_pass
from filesync.sync.warm import WarmState
from filesync.transport.local import local_conduit

RULE = ExcludeRule.build()
#: Well outside the racy window.
OLD_NS = 1_600_000_000_000_000_000
SEALED = "both listings are as the last pass found them in sync: nothing to compare"


class Pair:
    def __init__(self, tmp_path: Path) -> None:
        self.local, self.remote = tmp_path / "local", tmp_path / "remote"
        self.state = tmp_path / "state"
        self.logs: list[str] = []

    def run(self, direction: Direction = Direction.PUSH, **kw: Any) -> Report:
        self.logs = []
        warm: WarmState | None = kw.pop("warm", None)
        opts = Options(direction, rule=kw.pop("rule", RULE), state_dir=self.state,
                       log=self.logs.append, **kw)

        async def main() -> Report:
            conduit = local_conduit()
            try:
                return await run_pass(conduit, self.local, str(self.remote), opts, warm=warm)
            finally:
                if warm is not None:
                    await warm.close()
                await conduit.close()

        return asyncio.run(main())

    @property
    def sealed(self) -> bool:
        return SEALED in self.logs

    def seal(self) -> Seal | None:
        state = self.pair_state()
        try:
            return state.seal()
        finally:
            state.close()

    def pair_state(self) -> PairState:
        (pair_dir,) = (self.state / "pairs").iterdir()
        state = PairState(pair_dir)
        state._connect()
        return state


def old(path: Path, ns: int = OLD_NS) -> Path:
    os.utime(path, ns=(ns, ns))
    return path


@pytest.fixture
def pair(tmp_path: Path) -> Pair:
    p = Pair(tmp_path)
    for rel in ("a.txt", "d/b.txt", "d/e/c.sh"):
        old(write(p.local / rel, f"{rel}\n"))
    old(write(p.local / "node_modules" / "x.js", "excluded\n"))
    return p


def sealed_pair(pair: Pair) -> Pair:
    first = pair.run()  # the first push seals the pair as it left it
    assert not pair.sealed and first.uploaded == 3
    assert pair.seal() is not None
    return pair


def count_ancestor_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A list that gets an item each time a pass reads the state's ancestors."""
    read: list[str] = []
    real_ancestors = PairState.ancestors

    def ancestors(self: PairState) -> Any:
        read.append("ancestors")
        return real_ancestors(self)

    monkeypatch.setattr(PairState, "ancestors", ancestors)
    return read


def drop_seal(pair: Pair) -> None:
    state = pair.pair_state()
    try:
        _empty_transaction(state)  # every write drops it
        assert state.seal() is None
    finally:
        state.close()


def test_a_pass_on_the_sealed_listings_reads_and_plans_nothing(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    drop_seal(sealed_pair(pair))
    full = pair.run()  # a full pass: it finds the pair in sync and seals it again
    assert not pair.sealed
    read = count_ancestor_reads(monkeypatch)
    report = pair.run()
    assert pair.sealed and read == []
    assert report.to_json() == {**full.to_json(), "seconds": report.to_json()["seconds"]}
    assert report.excluded == full.excluded > 0
    # A dry run and a pull take the seal as well (a pull's is its own: it seals anew).
    assert not pair.run(dry_run=True).plan and pair.sealed
    pair.run(Direction.PULL)
    assert not pair.sealed
    read.clear()
    pair.run(Direction.PULL)
    assert pair.sealed and read == []


def _rewrite_same_stat(path: Path) -> None:
    """New bytes, same size and mtime, through a new inode (as an editor's save does)."""
    st = path.stat()
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(b"X" * st.st_size)
    os.utime(tmp, ns=(st.st_mtime_ns, st.st_mtime_ns))
    os.replace(tmp, path)


def _host_edit(p: Pair) -> None:
    old(write(p.local / "a.txt", "edited on the host\n"), OLD_NS + 10**9)


def _host_chmod(p: Pair) -> None:
    os.chmod(p.local / "d" / "e" / "c.sh", 0o755)


def _host_new(p: Pair) -> None:
    old(write(p.local / "new.txt", "new\n"))


def _host_delete(p: Pair) -> None:
    (p.local / "d" / "b.txt").unlink()


def _host_same_stat(p: Pair) -> None:
    _rewrite_same_stat(p.local / "a.txt")


def _remote_edit(p: Pair) -> None:
    old(write(p.remote / "d" / "b.txt", "edited remotely\n"), OLD_NS + 10**9)


def _remote_chmod(p: Pair) -> None:
    os.chmod(p.remote / "a.txt", 0o600)


def _remote_new(p: Pair) -> None:
    old(write(p.remote / "d" / "new.txt", "new remotely\n"))


def _remote_delete(p: Pair) -> None:
    (p.remote / "a.txt").unlink()


def _remote_same_stat(p: Pair) -> None:
    _rewrite_same_stat(p.remote / "d" / "b.txt")


CHANGES: dict[str, Callable[[Pair], None]] = {
    "host edit": _host_edit, "host chmod": _host_chmod, "host new file": _host_new,
    "host delete": _host_delete, "host same size and mtime, new inode": _host_same_stat,
    "remote edit": _remote_edit, "remote chmod": _remote_chmod,
    "remote new file": _remote_new, "remote delete": _remote_delete,
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_any_change_after_the_seal_gets_the_full_pass_and_is_synced(
    pair: Pair, change: str
) -> None:
    sealed_pair(pair)
    CHANGES[change](pair)
    expected_host = snapshot(pair.local) if change.startswith("host") else None
    expected_remote = snapshot(pair.remote) if change.startswith("remote") else None
    report = pair.run(Direction.SYNC)
    assert not pair.sealed
    changed = (report.uploaded + report.downloaded + report.deleted_local
               + report.deleted_remote)
    assert changed == 1, report.to_json()
    host, remote = snapshot(pair.local), snapshot(pair.remote)
    host.pop("node_modules/x.js")
    assert host == remote
    if expected_host is not None:
        expected_host.pop("node_modules/x.js")
        assert host == expected_host
    if expected_remote is not None:
        assert remote == expected_remote
    for rel in remote:
        modes = {(side / rel).stat().st_mode & 0o777 for side in (pair.local, pair.remote)}
        assert len(modes) == 1, rel


def _empty_transaction(state: PairState) -> None:
    with state.transaction():
        pass


def test_a_remote_rewrite_keeping_size_and_mtime_is_not_sealed_over(pair: Pair) -> None:
    """The remote quiet test trusts size, mtime and mode (the full pass finds no change
    here either); the seal trusts no more than that: a new inode is a new listing."""
    sealed_pair(pair)
    _rewrite_same_stat(pair.remote / "d" / "b.txt")
    pair.run()
    assert not pair.sealed


def test_every_write_of_the_state_drops_the_seal(pair: Pair) -> None:
    sealed_pair(pair)
    writes: list[Callable[[PairState], None]] = [
        lambda s: s.put_ancestors([]),
        lambda s: s.forget(["nothing"]),
        lambda s: s.replace_local_cache([]),
        lambda s: s.update_local_cache({"x": (1, 2, 3, "h")}, []),
        lambda s: s.put_remote_cache([]),
        lambda s: s.set_conflicts([], ["nothing"]),
        _empty_transaction,
    ]
    for i, write_state in enumerate(writes):
        state = pair.pair_state()
        try:
            assert state.seal() is not None, i
            write_state(state)
            assert state.seal() is None, i
        finally:
            state.close()
        pair.run()
        assert not pair.sealed, i  # a dropped seal is never taken: a full pass, which
        # finds the pair in sync and seals it again for the next write


def test_a_racy_host_mtime_leaves_no_seal(pair: Pair) -> None:
    sealed_pair(pair)
    os.utime(pair.local / "a.txt")  # same bytes, mtime now: in sync, but racy
    report = pair.run()
    assert not pair.sealed and report.uploaded == 0
    state = pair.pair_state()
    try:
        assert state.seal() is None
    finally:
        state.close()
    pair.run()
    assert not pair.sealed


def test_a_different_rule_gets_the_full_pass(pair: Pair) -> None:
    sealed_pair(pair)
    other = ExcludeRule.build(["nothing-here-*"])
    pair.run(rule=other)
    assert not pair.sealed
    pair.run(rule=other)  # sealed under this rule now
    assert pair.sealed
    pair.run()
    assert not pair.sealed


def test_nothing_skipped_or_in_conflict_is_ever_sealed_over(pair: Pair) -> None:
    (pair.local / "link").symlink_to("a.txt")
    for _ in range(3):
        report = pair.run()
        assert not pair.sealed and [s.path for s in report.skipped] == ["link"]
    (pair.local / "link").unlink()
    pair.run()  # nothing skipped now: seals
    pair.run()
    assert pair.sealed
    old(write(pair.local / "a.txt", "host side\n"), OLD_NS + 10**9)
    old(write(pair.remote / "a.txt", "remote side\n"), OLD_NS + 2 * 10**9)
    for _ in range(3):
        report = pair.run(Direction.SYNC)
        assert not pair.sealed and [c.path for c in report.open_conflicts] == ["a.txt"]


def test_watched_and_dry_passes_leave_no_seal(pair: Pair) -> None:
    pair.run()
    pair.run(dry_run=True)
    pair.run(warm=WarmState(watch=True))
    assert pair.seal() is None


def test_a_push_seals_the_pair_as_its_transfers_left_it(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Uploads and remote deletions seal: the next pass matches without a state read, and
    a full compare of the same pair (its seal dropped) finds nothing to do either."""
    sealed_pair(pair)
    _host_edit(pair)
    _host_new(pair)
    _host_delete(pair)
    report = pair.run()
    assert (report.uploaded, report.deleted_remote) == (2, 1) and pair.seal() is not None
    read = count_ancestor_reads(monkeypatch)
    assert not pair.run().plan and pair.sealed and read == []
    drop_seal(pair)
    for direction in (Direction.PUSH, Direction.SYNC):
        full = pair.run(direction, dry_run=True)
        assert not pair.sealed and read and not full.plan


def test_a_remote_change_during_the_push_leaves_no_seal(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Written on the remote after the push listed it, by someone else: the helper's walk
    for the seal finds a row the push did not write."""
    real = HelperEndpoint.seal_digest

    async def meddled(self: HelperEndpoint, root: str, rule: ExcludeRule) -> str:
        old(write(pair.remote / "d" / "b.txt", "written during the push\n"), OLD_NS + 10**9)
        return await real(self, root, rule)

    monkeypatch.setattr(HelperEndpoint, "seal_digest", meddled)
    assert pair.run().uploaded == 3 and pair.seal() is None
    monkeypatch.undo()
    report = pair.run(Direction.SYNC)
    assert not pair.sealed and report.downloaded == 1
    assert (pair.local / "d" / "b.txt").read_text() == "written during the push\n"


def test_the_seals_walk_is_asked_before_the_push_is_recorded(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The helper walks for the seal while the push records what it did, not after: asked
    as soon as the last stream's reply is in, before its uploads are recorded."""
    from filesync.sync import transition as transition_module

    events: list[str] = []
    real_digest = HelperEndpoint.seal_digest
    real_caches = transition_module._update_caches
    real_ancestors = PairState.put_ancestors

    async def digest(self: HelperEndpoint, root: str, rule: ExcludeRule) -> str:
        events.append("seal asked")
        return await real_digest(self, root, rule)

    def caches(*args: Any) -> None:
        events.append("caches recorded")
        real_caches(*args)

    def ancestors(self: PairState, rows: Any) -> None:
        rows = list(rows)
        if rows:
            events.append("uploads recorded")
        real_ancestors(self, rows)

    monkeypatch.setattr(HelperEndpoint, "seal_digest", digest)
    monkeypatch.setattr(transition_module, "_update_caches", caches)
    monkeypatch.setattr(PairState, "put_ancestors", ancestors)
    assert pair.run().uploaded == 3 and pair.seal() is not None
    assert events == ["seal asked", "uploads recorded", "caches recorded"]


def test_a_push_into_a_missing_root_sends_one_stream(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stream makes the root: no empty send is added for it (only a push with
    nothing placed sends one, ``test_an_empty_tree_pushed_leaves_an_empty_remote_root``)."""
    real_send = HelperEndpoint.send
    sent: list[int] = []

    async def send(self: HelperEndpoint, root: str, items: Any, count: int | None = None
                   ) -> Any:
        sent.append(count or 0)
        return await real_send(self, root, items, count)

    monkeypatch.setattr(HelperEndpoint, "send", send)
    assert not pair.remote.exists()
    assert pair.run().uploaded == 3 and sent == [3]
    kept = {rel: data for rel, data in snapshot(pair.local).items()
            if not rel.startswith("node_modules/")}
    assert snapshot(pair.remote) == kept


def test_a_push_that_asked_for_the_seal_and_ends_unclean_keeps_its_helper_in_step(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The walk is asked before the push knows whether it ends clean. One that does not
    (a remote file appeared under an upload) still reads the unused reply, so the next
    pass on the same warm helper gets its own replies."""
    real_send = HelperEndpoint.send
    real_digest = HelperEndpoint.seal_digest
    asked: list[str] = []

    async def meddled(self: HelperEndpoint, *args: Any, **kw: Any) -> Any:
        old(write(pair.remote / "d" / "b.txt", "written during the push\n"), OLD_NS + 10**9)
        return await real_send(self, *args, **kw)

    async def digest(self: HelperEndpoint, root: str, rule: ExcludeRule) -> str:
        asked.append(root)
        return await real_digest(self, root, rule)

    monkeypatch.setattr(HelperEndpoint, "send", meddled)
    monkeypatch.setattr(HelperEndpoint, "seal_digest", digest)
    opts = Options(Direction.PUSH, rule=RULE, state_dir=pair.state)

    async def two_passes() -> tuple[Report, Report]:
        conduit = local_conduit()
        warm = WarmState()
        try:
            first = await run_pass(conduit, pair.local, str(pair.remote), opts, warm=warm)
            monkeypatch.setattr(HelperEndpoint, "send", real_send)
            second = await run_pass(conduit, pair.local, str(pair.remote), opts, warm=warm)
            return first, second
        finally:
            await warm.close()
            await conduit.close()

    first, second = asyncio.run(two_passes())
    assert asked and first.uploaded == 2 and [s.path for s in first.skipped] == ["d/b.txt"]
    assert pair.seal() is None
    # the second pass read its own listing, not the first one's unused digest
    assert [(a.path, a.kind, a.then) for a in second.plan] == [
        ("d/b.txt", Kind.CONFLICT, Kind.UPLOAD)]
    assert second.uploaded == 1 and snapshot(pair.remote)["d/b.txt"] == b"d/b.txt\n"
    saved = Path(second.conflicts[0]["saved_to"])
    assert saved.read_text() == "written during the push\n"


def test_only_a_pass_that_acted_on_every_loud_path_and_only_remotely_seals(
    pair: Pair
) -> None:
    sealed_pair(pair)
    # New on the remote only: a push leaves it alone, so it is neither quiet nor acted on.
    extra = old(write(pair.remote / "d" / "extra.txt", "only on the remote\n"))
    report = pair.run()
    assert not pair.sealed and not report.plan and pair.seal() is None
    extra.unlink()
    pair.run()  # a full pass finds all quiet now: sealed
    assert pair.seal() is not None
    _remote_edit(pair)  # brought to the host: the host tree is not as walked any more
    report = pair.run(Direction.SYNC)
    assert report.downloaded == 1 and pair.seal() is None
    assert not pair.run(Direction.SYNC).plan and not pair.sealed


def test_the_walk_digest_covers_every_field_of_every_row() -> None:
    rows: list[list[object]] = [["a.txt", "f", 3, OLD_NS, 0o644, 1001, 1],
                                ["d/b.txt", "f", 5, OLD_NS + 1, 0o600, 1002, 1]]
    digest = walk_digest(rows, [], 2)
    same = [[*map(_copy, row)] for row in rows]  # equal values, other objects
    assert walk_digest(same, [], 2) == digest
    for i in range(len(rows[0])):
        changed = [list(row) for row in rows]
        value = changed[1][i]
        changed[1][i] = value + "x" if isinstance(value, str) else int(value) + 1  # type: ignore[call-overload]
        assert walk_digest(changed, [], 2) != digest, i
    assert walk_digest(rows[::-1], [], 2) != digest
    assert walk_digest(rows, [["link", "symlink", ""]], 2) != digest
    assert walk_digest(rows, [], 3) != digest


def _copy(value: object) -> object:
    return (value + "!")[:-1] if isinstance(value, str) else int(str(value))


def test_the_walk_digest_covers_rows_past_its_first_piece() -> None:
    rows: list[list[object]] = [[f"f{i}", "f", 1, OLD_NS, 0o644, i, 1]
                                for i in range(DIGEST_ROWS + 2)]
    digest = walk_digest(rows, [], 0)
    rows[-1][5] = 0  # the inode of the last row
    assert walk_digest(rows, [], 0) != digest
    assert walk_digest(rows[:-1], [], 0) != walk_digest(rows, [], 0)


def count_host_scans(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A list that gets an item each time a pass reads the stat cache or applies it."""
    done: list[str] = []
    real_cache, real_scan = PairState.local_cache, plan_module.scan_cached

    def local_cache(self: PairState) -> Any:
        done.append("local_cache")
        return real_cache(self)

    def scan_cached(*args: Any) -> Any:
        done.append("scan_cached")
        return real_scan(*args)

    monkeypatch.setattr(PairState, "local_cache", local_cache)
    monkeypatch.setattr(plan_module, "scan_cached", scan_cached)
    return done


def _stat_cache(pair: Pair) -> dict[str, tuple[int, int, str]]:
    """The host stat cache without its inodes (size, mtime, hash)."""
    state = pair.pair_state()
    try:
        return {p: (size, mtime, h) for p, (size, mtime, _ino, h)
                in PairState.local_cache(state).items()}
    finally:
        state.close()


def test_a_pull_on_the_sealed_host_walk_takes_the_host_side_from_the_seal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The teardown pull: only the remote changed since the push sealed the pair. The
    host's stat cache is neither read nor applied, and the pass leaves the state a full
    scan leaves (its seal ignored)."""
    left: list[dict[str, tuple[int, int, str]]] = []
    for take_seal in (True, False):
        pair = Pair(tmp_path / str(take_seal))
        for rel in ("a.txt", "d/b.txt", "d/e/c.sh"):
            old(write(pair.local / rel, f"{rel}\n"))
        sealed_pair(pair)
        _remote_edit(pair)
        _remote_new(pair)
        scans = count_host_scans(monkeypatch)
        if not take_seal:
            monkeypatch.setattr(seal_module, "host_digest", lambda inputs: None)
        report = pair.run(Direction.PULL)
        assert report.downloaded == 2 and not report.skipped
        assert (scans == []) is take_seal, scans
        assert snapshot(pair.local) == snapshot(pair.remote)
        monkeypatch.undo()
        left.append(_stat_cache(pair))
        # The next pass compares in full (nothing sealed the pulled host) and agrees.
        assert not pair.run(Direction.SYNC).plan
    assert left[0] == left[1] and "d/b.txt" not in left[0]  # pulled: hashed again later


HOST_CHANGES = [c for c in CHANGES if c.startswith("host")]


@pytest.mark.parametrize("change", HOST_CHANGES)
def test_a_host_change_after_the_seal_gets_the_full_host_scan(
    pair: Pair, change: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sealed_pair(pair)
    CHANGES[change](pair)
    _remote_new(pair)
    expected = snapshot(pair.local)
    scans = count_host_scans(monkeypatch)
    report = pair.run(Direction.SYNC)
    assert "local_cache" in scans and "scan_cached" in scans
    assert (report.uploaded + report.deleted_remote, report.downloaded) == (1, 1), \
        report.to_json()
    host, remote = snapshot(pair.local), snapshot(pair.remote)
    host.pop("node_modules/x.js")
    expected.pop("node_modules/x.js")
    assert host == remote
    assert {p: v for p, v in host.items() if p != "d/new.txt"} == expected


def test_ancestors_that_are_not_the_walks_files_get_the_full_scan(pair: Pair) -> None:
    # Never so for a walk the seal speaks for; were it, no file would go without a hash.
    listed = list_local(pair.local, RULE)
    anc = {p: Ancestor("h", e.size, e.mode & 0o777, e.size, e.mtime_ns, 0)
           for p, e in listed.entries.items()}
    scan = plan_module._sealed_scan(listed, anc, OLD_NS * 2)
    assert scan is not None and scan.hashes == dict.fromkeys(listed.entries, "h")
    anc.pop("a.txt")
    assert plan_module._sealed_scan(listed, anc, OLD_NS * 2) is None
    anc["a.txt"], anc["gone.txt"] = anc["d/b.txt"], anc["d/b.txt"]
    assert plan_module._sealed_scan(listed, anc, OLD_NS * 2) is None
