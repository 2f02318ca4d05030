"""The one bounded cache: the limit holds, oldest put goes first, evicted values are handed on."""

from __future__ import annotations

import pytest

from filesync.tree.bounded import Bounded


def test_the_oldest_put_is_evicted_and_handed_to_evict() -> None:
    evicted: list[str] = []
    cache: Bounded[str, str] = Bounded(2, evicted.append)
    cache.put("a", "A")
    cache.put("b", "B")
    cache.put("a", "A2")  # re-put makes "a" the newest
    cache.put("c", "C")
    assert evicted == ["B"]
    assert len(cache) == 2
    assert cache.get("a") == "A2" and cache.get("c") == "C" and "b" not in cache


def test_pop_and_drain_hand_entries_to_the_caller_without_evicting() -> None:
    evicted: list[int] = []
    cache: Bounded[str, int] = Bounded(3, evicted.append)
    for i, key in enumerate("xyz"):
        cache.put(key, i)
    assert cache.pop("y") == 1 and cache.pop("y") is None
    assert list(cache.drain()) == [2, 0]
    assert evicted == [] and len(cache) == 0


def test_a_cache_holds_at_least_one_entry() -> None:
    with pytest.raises(ValueError):
        Bounded(0)
