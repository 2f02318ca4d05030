"""The fast paths of a pass decide exactly what the plain per-file code decides.

The slow scenario swaps the bulk filters ``filesync.sync.plan`` uses (``unchanged_remote``,
``quiet_paths`` of ``filesync.core.quiet``) for the plain per-file loops this module keeps
as the reference, swaps in the per-file
``scan_cached``, and makes ``_update_caches`` diff the caches field by field. Hypothesis
builds an ancestor (a first pass), then edits both sides; the same scenario is played
in two fresh directories, fast and slow, and every pass must give the same report, the
same trees and the same state rows. No timing is asserted.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from filesync.core.exclude import ExcludeRule
from filesync.core.model import Entry, Listing
from filesync.core.reconcile import Direction
from filesync.host.scan import LocalScan, scan_cached
from filesync.host.state import Ancestor, PairState
from filesync.sync import engine, plan, transition
from filesync.sync.engine import Options, run_pass
from filesync.sync.warm import WarmState
from filesync.transport.local import local_conduit

RULE = ExcludeRule.build(default_excludes=False)
OLD_NS = 1_600_000_000_000_000_000
NAMES = ["a", "b", "d/c", "d/e", "d/f/g", "h/i"]
MODES = [0o644, 0o600, 0o755, 0o4755]
# What happens to one path on one side after the first pass.
EDITS = ["keep", "edit", "chmod", "touch", "delete", "racy"]


def reference_scan_cached(
    listing: Listing, cache: dict[str, tuple[int, int, int, str]], started_ns: int
) -> LocalScan:
    """``scan_cached`` as a plain loop, the way it was written before the fast path."""
    scan = LocalScan(listing, started_ns=started_ns)
    for rel, entry in listing.entries.items():
        cached = cache.get(rel)
        if cached is not None and cached[:3] == (entry.size, entry.mtime_ns, entry.ino):
            scan.hashes[rel] = cached[3]
            scan.cache_rows[rel] = cached
        else:
            scan.misses.append(rel)
    return scan


def reference_unchanged_remote(
    anc: dict[str, Ancestor], rfiles: dict[str, Entry], racy_ns: int
) -> set[str]:
    """``quiet.unchanged_remote`` as the plain per-file test it stands for."""
    out = set()
    for rel, e in rfiles.items():
        a = anc.get(rel)
        if a is not None and (e.size, e.mtime_ns, e.mode & 0o777) == (
                a.remote_size, a.remote_mtime_ns, a.mode) \
                and a.remote_mtime_ns < a.synced_ns - racy_ns:
            out.add(rel)
    return out


def reference_quiet(
    anc: dict[str, Ancestor], hashes: dict[str, str], entries: dict[str, Entry],
    rfiles: dict[str, Entry], same: set[str],
) -> set[str]:
    """``quiet.quiet_paths`` as the plain per-file test it stands for."""
    return {p for p in same
            if hashes.get(p) == anc[p].hash and entries[p].mode & 0o777 == anc[p].mode}


def put(path: Path, data: bytes, mode: int, mtime_ns: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(mode)
    os.utime(path, ns=(mtime_ns, mtime_ns))


def mutate(root: Path, rel: str, edit: str, salt: int) -> None:
    path = root / rel
    if not path.exists():
        if edit in ("edit", "racy"):  # a new file on this side
            put(path, f"new {rel} {salt}".encode(), 0o644,
                OLD_NS + salt if edit == "edit" else time.time_ns())
        return
    st_ = path.stat()
    if edit == "edit":
        put(path, path.read_bytes() + f"edit {salt}".encode(), st_.st_mode & 0o7777,
            st_.st_mtime_ns + 1_000_000_000)
    elif edit == "chmod":
        path.chmod(0o700 if st_.st_mode & 0o777 != 0o700 else 0o644)
    elif edit == "touch":  # same bytes, new mtime: a remote candidate, no change
        os.utime(path, ns=(st_.st_mtime_ns + 5, st_.st_mtime_ns + 5))
    elif edit == "delete":
        path.unlink()
    elif edit == "racy":  # same size, fresh mtime: only a re-read tells
        data = bytearray(path.read_bytes())
        data[0] ^= 1
        put(path, bytes(data), st_.st_mode & 0o7777, time.time_ns())


def rewrite_fresh(root: Path) -> None:
    """Same size, same (fresh) mtime, other bytes: only the racy-timestamp rule catches it."""
    for p in sorted(root.rglob("*")):
        st_ = p.lstat()
        if p.is_file() and st_.st_mtime_ns > OLD_NS + 10**15 and st_.st_size:
            data = bytearray(p.read_bytes())
            data[-1] ^= 2
            p.write_bytes(bytes(data))
            os.utime(p, ns=(st_.st_mtime_ns, st_.st_mtime_ns))


def snapshot(root: Path) -> dict[str, tuple[bytes, int, int]]:
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            p = Path(dirpath) / name
            st_ = p.lstat()
            out[str(p.relative_to(root))] = (p.read_bytes(), st_.st_mode & 0o7777,
                                             st_.st_mtime_ns)
    return out


def state_rows(state_dir: Path) -> dict[str, Any]:
    """The state tables, without what differs between two directories (inodes, times)."""
    (db,) = state_dir.rglob("state.db")
    conn = sqlite3.connect(db)
    try:
        return {
            "ancestor": sorted(conn.execute(
                "SELECT path, hash, size, mode, remote_size, remote_mtime_ns FROM ancestor")),
            "local_cache": sorted(conn.execute(
                "SELECT path, size, mtime_ns, hash FROM local_cache")),
            "remote_cache": sorted(conn.execute(
                "SELECT path, size, mtime_ns, hash FROM remote_cache")),
        }
    finally:
        conn.close()


def report_view(report: engine.Report) -> dict[str, Any]:
    view = report.to_json()
    del view["seconds"], view["bytes_sent"], view["bytes_received"]
    view["conflicts"] = sorted(c["path"] for c in report.conflicts)
    view["skipped"] = sorted((s.path, s.reason) for s in report.skipped)
    view["plan"] = [(a.path, a.kind, a.then) for a in report.plan]
    return view


def play(
    base: Path, files: dict[str, int], local_edits: list[str], remote_edits: list[str],
    direction: Direction, fast: bool, monkeypatch: pytest.MonkeyPatch,
) -> list[Any]:
    """First pass (sync), edits, ``direction``; racy rewrites, ``direction`` again (warm)."""
    local, remote, state = base / "local", base / "remote", base / "state"
    local.mkdir()  # a sync from a missing local root is an error, an empty one is a tree
    for i, (rel, mode) in enumerate(sorted(files.items())):
        put(local / rel, f"{rel} {i}".encode(), mode, OLD_NS + i * 10**9)
    with monkeypatch.context() as m:
        if not fast:
            m.setattr(plan, "unchanged_remote", reference_unchanged_remote)
            m.setattr(plan, "quiet_paths", reference_quiet)
            m.setattr(plan, "scan_cached", reference_scan_cached)
            m.setattr(transition, "_same_objects", lambda new, old: False)

        async def main() -> list[Any]:
            conduit = local_conduit()
            warm = WarmState()  # one owner: the second pass is warm
            seen: list[Any] = []
            try:
                opts = Options(Direction.SYNC, rule=RULE, state_dir=state)
                await run_pass(conduit, local, str(remote), opts, warm=warm)
                for i, rel in enumerate(NAMES):
                    mutate(local, rel, local_edits[i], i)
                    mutate(remote, rel, remote_edits[i], 100 + i)
                opts = Options(direction, rule=RULE, state_dir=state, force=True)
                for step in range(2):
                    if step:
                        rewrite_fresh(remote)
                    try:
                        report = await run_pass(conduit, local, str(remote), opts, warm=warm)
                        seen.append(report_view(report))
                    except engine.TransferFailed as exc:
                        seen.append(("failed", report_view(exc.report)))
                    seen.append((snapshot(local), snapshot(remote), state_rows(state)))
            finally:
                await warm.close()
                await conduit.close()
            return seen

        return asyncio.run(main())


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    files=st.dictionaries(st.sampled_from(NAMES), st.sampled_from(MODES), max_size=len(NAMES)),
    local_edits=st.lists(st.sampled_from(EDITS), min_size=len(NAMES), max_size=len(NAMES)),
    remote_edits=st.lists(st.sampled_from(EDITS), min_size=len(NAMES), max_size=len(NAMES)),
    direction=st.sampled_from(list(Direction)),
)
def test_fast_and_slow_paths_plan_alike(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
    files: dict[str, int], local_edits: list[str], remote_edits: list[str],
    direction: Direction,
) -> None:
    racy = "racy" in local_edits or "racy" in remote_edits
    fast = play(tmp_path_factory.mktemp("fast"), files, local_edits, remote_edits,
                direction, True, monkeypatch)
    slow = play(tmp_path_factory.mktemp("slow"), files, local_edits, remote_edits,
                direction, False, monkeypatch)
    if racy:  # wall-clock mtimes differ between the two runs: compare all but them
        fast, slow = _without_mtimes(fast), _without_mtimes(slow)
    assert fast == slow


def _without_mtimes(seen: list[Any]) -> list[Any]:
    out: list[Any] = []
    for item in seen:
        if isinstance(item, tuple) and len(item) == 3 and isinstance(item[2], dict):
            local, remote, rows = item
            out.append((
                {k: v[:2] for k, v in local.items()},
                {k: v[:2] for k, v in remote.items()},
                {t: [tuple(c for i, c in enumerate(r) if i != (5 if t == "ancestor" else 2))
                     for r in rs] for t, rs in rows.items()},
            ))
        else:
            out.append(item)
    return out


def test_warm_noop_writes_no_cache_rows(tmp_path: Path) -> None:
    """A no-op pass on an open conduit finds every cache row unchanged by identity."""
    local, remote, state = tmp_path / "local", tmp_path / "remote", tmp_path / "state"
    for i in range(30):
        put(local / f"d{i % 3}" / f"f{i}", f"{i}".encode(), 0o644, OLD_NS + i)

    async def main() -> list[bool]:
        conduit = local_conduit()
        warm = WarmState()
        calls: list[bool] = []
        real = PairState.update_local_cache

        def spy(self: PairState, upserts: Any, deletes: Any) -> None:
            calls.append(True)
            real(self, upserts, deletes)

        try:
            opts = Options(Direction.PUSH, rule=RULE, state_dir=state)
            await run_pass(conduit, local, str(remote), opts, warm=warm)
            PairState.update_local_cache = spy  # type: ignore[method-assign]
            try:
                for _ in range(2):
                    report = await run_pass(conduit, local, str(remote), opts, warm=warm)
                    assert report.plan == []
            finally:
                PairState.update_local_cache = real  # type: ignore[method-assign]
        finally:
            await warm.close()
            await conduit.close()
        return calls

    assert asyncio.run(main()) == []


@settings(max_examples=200, deadline=None)
@given(
    stats=st.dictionaries(
        st.sampled_from(["a", "b", "c", "d/e", "d/f"]),
        st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(0, 2)),
    ),
    cached=st.dictionaries(
        st.sampled_from(["a", "b", "c", "d/e", "d/f", "g"]),
        st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(0, 2),
                  st.sampled_from(["h1", "h2"])),
    ),
)
def test_scan_cached_matches_the_plain_loop(
    stats: dict[str, tuple[int, int, int]], cached: dict[str, tuple[int, int, int, str]]
) -> None:
    listing = Listing("/x", True)
    for rel, (size, mtime, ino) in stats.items():
        listing.entries[rel] = Entry(rel, "f", size, mtime, 0o644, ino)
    got, want = scan_cached(listing, cached, 0), reference_scan_cached(listing, cached, 0)
    assert got.hashes == want.hashes and list(got.hashes) == list(want.hashes)
    assert got.cache_rows == want.cache_rows
    assert got.misses == want.misses
