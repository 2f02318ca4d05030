"""The cold path's records are ``FrozenRecord``s / ``Record``s, not dataclasses.

Creating a dataclass compiles its methods from source at import, ~0.6-1 ms of CPU per
class in 3.11, paid by every run (issue 21). These tests hold the converted modules to no
new dataclass (the ones kept are named, with the reason), and the records to what the
dataclass gave: equality, hash, repr, frozenness and field defaults.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from pathlib import Path

import pytest

from filesync.cli.settings import STDIO, Output, PassSettings, Request
from filesync.core.lineage import Series
from filesync.core.model import Listing, Skipped
from filesync.core.reconcile import Action, Clash, Kind, Version
from filesync.core.record import FrozenRecord, Record
from filesync.endpoint.contract import FetchHeader, Outcome, SendItem
from filesync.endpoint.listings import DeltaBase, EarlyListing
from filesync.transport.base import Completed
from filesync.transport.spawn import Spawn
from filesync.transport.target import ConnectOptions, Target
from filesync.tree.wire import Reason, Status

#: module -> the dataclasses it still creates, each kept because callers
#: ``dataclasses.replace`` it
KEPT = {
    "filesync.cli.settings": set(),
    "filesync.core.model": set(),
    "filesync.core.reconcile": set(),
    "filesync.endpoint.contract": set(),
    "filesync.endpoint.listings": set(),
    "filesync.sync.inputs": {"Options", "Planned"},
    "filesync.sync.memo": set(),
    "filesync.sync.plan": set(),
    "filesync.transport.base": set(),
    "filesync.transport.target": {"Target"},
}


@pytest.mark.parametrize("name", sorted(KEPT))
def test_converted_modules_create_no_new_dataclass(name: str) -> None:
    module = importlib.import_module(name)
    made = {value.__name__ for value in vars(module).values()
            if isinstance(value, type) and value.__module__ == name
            and dataclasses.is_dataclass(value)}
    assert made == KEPT[name]


class _Pair(FrozenRecord):
    __slots__ = ("a", "note")
    _fields = ("note", "a")
    _uncompared = frozenset({"a"})

    def __init__(self, note: str, a: int) -> None:
        self.note = note
        self.a = a


class _Box(Record):
    __slots__ = ("items",)
    _fields = ("items",)

    def __init__(self, items: list[int]) -> None:
        self.items = items


class _OtherBox(_Box):
    __slots__ = ()


def test_a_record_compares_hashes_and_shows_like_a_dataclass() -> None:
    assert _Pair("x", 1) == _Pair("x", 2)  # "a" is uncompared
    assert _Pair("x", 1) != _Pair("y", 1)
    assert hash(_Pair("x", 1)) == hash(_Pair("x", 2)) == hash(("x",))
    assert repr(_Pair("x", 1)) == "_Pair(note='x', a=1)"  # field order, not slot order
    assert _Box([1]) == _Box([1]) and _Box([1]) != _Box([2])
    assert _Box([1]) != _OtherBox([1])  # same class only, as a dataclass's __eq__
    assert _Box([1]) != ([1],)
    with pytest.raises(TypeError):
        hash(_Box([1]))
    box = _Box([1])
    box.items = [2]
    assert box.items == [2]


def test_a_frozen_record_refuses_assignment_and_deletion() -> None:
    pair = _Pair("x", 1)
    with pytest.raises(AttributeError):
        pair.note = "y"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del pair.a
    with pytest.raises(AttributeError):
        pair.other = 1  # type: ignore[attr-defined]
    assert (pair.note, pair.a) == ("x", 1)


def test_cli_records_keep_defaults_equality_and_hash() -> None:
    settings = PassSettings()
    assert (settings.state_dir, settings.exclude, settings.default_excludes,
            settings.dry_run, settings.force, settings.lock_timeout, settings.timeout,
            settings.max_file_size, settings.max_pull_bytes) == (
        None, (), True, False, False, 0.0, 0.0, 1 << 30, 2 << 30)
    assert PassSettings(force=True) == PassSettings(force=True) != settings
    assert hash(PassSettings(exclude=("a",))) == hash(PassSettings(exclude=("a",)))
    with pytest.raises(ValueError, match="max_file_size"):
        PassSettings(max_file_size=0)
    assert Output().sink is STDIO
    assert Output(verbose=1) == Output(verbose=1, sink=STDIO.__class__())  # sink uncompared
    options = ConnectOptions()
    assert options.spawn is ConnectOptions().spawn  # one default context, as before
    assert {ConnectOptions(log=print): 1}[ConnectOptions(spawn=Spawn(cwd="/"))] == 1
    assert ConnectOptions(identity=Path("k")) != options
    request = Request("push", settings, options, Output(), local=Path("/l"),
                      targets=(Target("local", "/r"),))
    assert request.env is os.environ and (request.config, request.via, request.path,
                                          request.keep, request.umask) == (None, None, "",
                                                                            "", None)
    assert request == Request("push", settings, options, Output(), local=Path("/l"),
                              targets=(Target("local", "/r"),), env={"HOME": "/h"})
    assert repr(Output()).startswith("Output(json=False, quiet=False, verbose=0, sink=")


def test_row_records_keep_defaults_equality_and_hash() -> None:
    # Named tuples: immutable, equal and hashed by value, as the frozen dataclasses were.
    clash = Clash(("a",), ("a/b",), "h1", "h2", True)
    action = Action("a", Kind.CONFLICT, Kind.UPLOAD, clash)
    assert (Action("p", Kind.UPLOAD).then, Action("p", Kind.UPLOAD).clash,
            Action("p", Kind.UPLOAD).of) == (None, None, None)
    assert {action: 1}[Action("a", Kind.CONFLICT, Kind.UPLOAD, clash)] == 1
    assert Version("h", 0o644).same(Version("h", 0o644))
    assert not Version("h", 0o644).same(Version("h", 0o600))
    with pytest.raises(AttributeError):
        action.path = "b"  # type: ignore[misc]
    assert Outcome("p", Status.OK) == Outcome("p", Status.OK, 0, 0, "", None)
    assert Outcome("p", Status.OK)._replace(path="q").path == "q"  # what renamed.py uses
    assert FetchHeader("p", 1, 2, 3) == FetchHeader("p", 1, 2, 3)
    assert SendItem("p", 0o644, 1, None, list).path == "p"
    assert Skipped.of("p", Reason.UNSAFE_PATH).code is Reason.UNSAFE_PATH
    assert Skipped("p", "r") == Skipped("p", "r", None)
    assert Completed(0, b"o", b"e").stdout == b"o"


def test_mutable_and_cold_records_keep_their_defaults() -> None:
    listing = Listing("/r", True)
    assert (listing.entries, listing.skipped, listing.excluded, listing.digest,
            listing.lineage) == ({}, [], 0, "", None)
    assert listing.entries is not Listing("/r", True).entries  # each its own dict
    assert listing == Listing("/r", True) != Listing("/r", False)
    listing.excluded = 3  # a listing is filled in place
    assert repr(listing) == ("Listing(root='/r', exists=True, entries={}, skipped=[], "
                             "excluded=3, digest='', lineage=None)")
    base = DeltaBase(1, {}, {})
    assert not base.safe and isinstance(base.series, Series)
    assert base.series is not DeltaBase(1, {}, {}).series  # each its own series
    early = EarlyListing("/r", {"x": 1}, resolved=True)
    assert early.answers("/r", {"x": 1}, str) and early == EarlyListing("/r", {"x": 1}, True)
