"""``sync.carry``: a watched pass recomputes only the paths whose inputs changed, and
what it plans is what a pass computing everything plans; ``core.lineage`` names every
changed path or says it cannot.

Real trees, the real helper over the local transport, real SQLite, passes run with
a watching ``WarmState`` on one conduit, as ``filesync watch`` runs them.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator, Sized
from operator import itemgetter
from pathlib import Path
from typing import Any

import pytest
from synctree import snapshot, write
from watchedpair import WatchedPair, watched_pair

import filesync.sync.plan as planning
from filesync.core.exclude import ExcludeRule
from filesync.core.lineage import KEEP_PATHS, Series
from filesync.endpoint.helper import HelperEndpoint
from filesync.endpoint.listings import wire_key
from filesync.sync.carry import AllBut, Overlaid
from filesync.sync.memo import Carried

RULE = ExcludeRule.build(default_excludes=False)


def test_a_series_names_every_change_or_says_it_cannot() -> None:
    series = Series()
    start = series.now()
    series.advance(["a", "b"])
    middle = series.now()
    series.advance([])
    series.advance(["c"])
    assert series.now().changed_since(start) == {"a", "b", "c"}
    assert series.now().changed_since(middle) == {"c"}
    assert middle.changed_since(start) == {"a", "b", "c"}  # later versions: more, not fewer
    assert series.now().changed_since(Series().now()) is None  # another series
    assert series.now().changed_since(None) is None
    series.advance(f"p{i}" for i in range(KEEP_PATHS))  # forgets the oldest versions
    assert series.now().changed_since(start) is None
    assert series.now().changed_since(middle) is None


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[WatchedPair]:
    with watched_pair(tmp_path) as opened:
        yield opened


def _old(path: Path, age: float = 3600) -> None:
    past = time.time() - age
    os.utime(path, (past, past))


def _watch_recompute(monkeypatch: pytest.MonkeyPatch) -> list[int | None]:
    """Per carried pass, how many paths it recomputed (None: it computed everything)."""
    seen: list[int | None] = []
    real = planning._carried_scan

    def spy(carry: Any, *args: Any) -> Any:
        seen.append(len(carry.recompute) if carry.carried is not None else None)
        return real(carry, *args)

    monkeypatch.setattr(planning, "_carried_scan", spy)
    return seen


def test_a_watched_pass_recomputes_only_what_changed(
    pair: WatchedPair, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(60):
        write(pair.local / f"d{i % 4}" / f"f{i}.txt", f"file {i}\n")
        _old(pair.local / f"d{i % 4}" / f"f{i}.txt")
    seen = _watch_recompute(monkeypatch)
    assert pair.run().uploaded == 60
    pair.run()
    assert seen[0] is None  # the first pass computes everything
    write(pair.local / "d1" / "f1.txt", "edited\n")
    _old(pair.local / "d1" / "f1.txt")
    report = pair.run()
    assert report.uploaded == 1
    assert seen[-1] is not None and 1 <= seen[-1] <= 2  # the edit (and nothing else)
    assert pair.run().plan == []
    assert seen[-1] == 0 or seen[-1] == 1  # the echo of its own upload at most


def test_carried_passes_plan_what_a_full_pass_plans(
    pair: WatchedPair, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Random edits, creations and deletions on both sides, some in conflict: after each
    carried pass, both trees agree with what a pass without carried results makes of
    them (a copy of the pair run as a one-shot pass finds nothing left to do)."""
    rng = random.Random(22)
    names = [f"d{i % 5}/f{i}.txt" for i in range(80)]
    for rel in names[:60]:
        write(pair.local / rel, f"{rel} v0\n")
        _old(pair.local / rel)
    seen = _watch_recompute(monkeypatch)
    pair.run()
    pair.run()
    for round_ in range(8):
        for _ in range(rng.randint(1, 6)):
            side = rng.choice((pair.local, pair.remote))
            rel = rng.choice(names)
            target = side / rel
            if target.exists() and rng.random() < 0.3:
                target.unlink()
            else:
                write(target, f"{rel} round {round_} {rng.random()}\n")
                if rng.random() < 0.5:
                    _old(target, rng.choice((3600, 7200)))
        pair.run()
        pair.run()  # the echo of the pass's own writes
        assert snapshot(pair.local) == snapshot(pair.remote)
        assert pair.run(watch=False).plan == [], round_
    assert any(n is not None for n in seen[2:])  # carried passes did run


def test_what_is_kept_between_passes_is_taken_over_never_copied(pair: WatchedPair) -> None:
    """The memory rule of a long watch: the carried sets, and the helper's delta base,
    are updated in place by the next pass; no second copy is kept."""
    for i in range(30):
        write(pair.local / f"d{i % 3}" / f"f{i}.txt", f"file {i}\n")
        _old(pair.local / f"d{i % 3}" / f"f{i}.txt")
    pair.run()
    pair.run()
    memo = pair.warm.memo(str(pair.local), str(pair.remote))
    assert memo is not None
    before = memo.carried
    assert isinstance(before, Carried)
    endpoint = pair.loop.run_until_complete(pair.warm.endpoints.endpoint_for(pair.conduit))
    assert isinstance(endpoint, HelperEndpoint)
    key = (str(pair.remote), wire_key(RULE.wire()))
    base = endpoint._bases.get(key)
    assert base is not None
    write(pair.remote / "d0" / "f0.txt", "edited on the remote\n")
    _old(pair.remote / "d0" / "f0.txt")
    assert pair.run().downloaded == 1
    after = memo.carried
    assert isinstance(after, Carried) and after is not before
    for name in ("rest", "loud"):
        assert getattr(after, name) is getattr(before, name), name
    now = endpoint._bases.get(key)
    # a new base (a new generation), whose files are the old base's, the delta applied
    assert now is not None and now is not base and now.files is base.files


def test_an_idle_tree_carries_no_set_of_its_paths(pair: WatchedPair) -> None:
    """The memory rule of a long watch: ``same`` and ``quiet`` are carried as what they
    leave out, the stat-cache lookup's hits are made again from the state's cache, so a
    pair in sync carries no collection of its paths: each is empty."""
    for i in range(30):
        write(pair.local / f"d{i % 3}" / f"f{i}.txt", f"file {i}\n")
        _old(pair.local / f"d{i % 3}" / f"f{i}.txt")
    pair.run()
    pair.run()
    assert pair.run().plan == []
    memo = pair.warm.memo(str(pair.local), str(pair.remote))
    assert memo is not None and isinstance(memo.carried, Carried)
    per_path = {name: len(value) for name in Carried._fields if name != "lineages"
                and isinstance(value := getattr(memo.carried, name), Sized)}
    assert per_path == {"misses": 0, "rest": 0, "loud": 0}


def test_a_carried_single_edit_builds_no_collection_of_the_tree(
    pair: WatchedPair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The latency rule of a long watch: a carried pass hands the planning ``same``,
    ``quiet`` and the stat-cache lookup's hits and rows as views of the tree's mappings
    (``carry.AllBut``, ``carry.Overlaid``), and nothing sweeps them (a sweep, or a set
    built in their place, is O(tree) again)."""
    for i in range(40):
        write(pair.local / f"d{i % 4}" / f"f{i}.txt", f"file {i}\n")
        _old(pair.local / f"d{i % 4}" / f"f{i}.txt")
    pair.run()
    pair.run()
    handed: list[tuple[object, ...]] = []
    real_plan, real_quiet = planning.plan, planning._carried_quiet

    def plan_spy(inputs: Any, scans: Any, versions: Any) -> Any:
        handed.append((versions.same, scans.local.hashes, scans.local.cache_rows))
        return real_plan(inputs, scans, versions)

    def quiet_spy(*args: Any) -> Any:
        got = real_quiet(*args)
        handed.append((got[0],))
        return got

    swept: list[str] = []

    def sweep_spy(real: Any) -> Any:
        def spy(self: Any) -> Any:
            swept.append(type(self).__name__)
            return real(self)
        return spy

    monkeypatch.setattr(planning, "plan", plan_spy)
    monkeypatch.setattr(planning, "_carried_quiet", quiet_spy)
    for view in (AllBut, Overlaid):
        monkeypatch.setattr(view, "__iter__", sweep_spy(view.__iter__))
    write(pair.local / "d1" / "f1.txt", "edited\n")
    _old(pair.local / "d1" / "f1.txt")
    assert pair.run().uploaded == 1
    quiet = [h[0] for h in handed if len(h) == 1]
    same, hashes, rows = next(h for h in handed if len(h) == 3)
    assert len(quiet) == 1 and isinstance(quiet[0], AllBut)
    assert isinstance(same, AllBut)
    assert isinstance(hashes, Overlaid) and isinstance(rows, Overlaid)
    assert swept == []
    assert (pair.remote / "d1" / "f1.txt").read_text() == "edited\n"


def test_the_views_answer_as_the_collections_they_stand_for() -> None:
    """``AllBut`` is ``base.keys() - left_out``, ``Overlaid`` the dict of ``base`` with
    the same changes made, over random changes."""
    rng = random.Random(7)
    base = {f"p{i}": (i, i, i, f"h{i}") for i in range(50)}
    for _ in range(200):
        left_out = {f"p{rng.randrange(70)}" for _ in range(rng.randrange(8))}
        view = AllBut(base, left_out)
        assert set(view) == base.keys() - left_out and len(view) == len(set(view))
        probe = f"p{rng.randrange(70)}"
        assert (probe in view) == (probe in base.keys() - left_out)
    hashes: Overlaid[tuple[int, int, int, str], str] = Overlaid(base, itemgetter(3))
    mirror = {p: row[3] for p, row in base.items()}
    for step in range(300):
        path = f"p{rng.randrange(70)}"
        if rng.random() < 0.5:
            hashes[path] = mirror[path] = f"new {step}"
        else:
            assert hashes.pop(path, None) == mirror.pop(path, None)
        assert len(hashes) == len(mirror) and dict(hashes) == mirror
        assert (path in hashes) == (path in mirror) and hashes.get(path) == mirror.get(path)
    assert dict(Overlaid(base, itemgetter(3))) == {p: row[3] for p, row in base.items()}
