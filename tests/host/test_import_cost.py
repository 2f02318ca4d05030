"""The modules a pull loads after its listings arrive create no dataclass at import.

Creating a dataclass writes and compiles its ``__init__``, ``__repr__`` and ``__eq__``
from source: ~0.6 ms of CPU each, paid by every run that imports the module. The state
is imported by every run, the journal, the host apply and the transition by every pass
with something to change; their records are named tuples or plain classes instead.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from pathlib import Path

import pytest

from filesync.host.apply import HostOp, OpResult
from filesync.host.journal import Journal
from filesync.host.state import ConflictRecord
from filesync.sync.transition import Transitioned
from filesync.tree.wire import Status

PULL_PATH = ("filesync.host.state", "filesync.host.journal", "filesync.host.apply",
             "filesync.sync.transition")


@pytest.mark.parametrize("name", PULL_PATH)
def test_no_dataclass_is_created_at_import(name: str) -> None:
    module = importlib.import_module(name)
    made = [value.__name__ for value in vars(module).values()
            if isinstance(value, type) and value.__module__ == name
            and dataclasses.is_dataclass(value)]
    assert made == []


def test_the_records_keep_their_fields_defaults_and_equality() -> None:
    op = HostOp("delete", "a/b", [3, 4])
    assert (op.staged, op.hash, op.mode, op.mtime_ns) == (None, None, 0o644, 0)
    assert OpResult(op, Status.OK) == OpResult(op, Status.OK, "", None)
    assert ConflictRecord("p", "l", None, "/s") == ConflictRecord("p", "l", None, "/s")
    done = Transitioned()
    assert (done.conflicts, done.skipped, done.errors, done.changes) == ([], [], [], [])
    assert done.changes is not Transitioned().changes  # each its own list


def test_journal_round_trips_with_the_field_names_it_always_wrote(tmp_path: Path) -> None:
    # A journal left by a crash of an older version must load in this one, and back.
    path = tmp_path / "journal.json"
    ops = [HostOp("write", "d/f", None, "/staged/1", "h1", 0o600, 7),
           HostOp("delete", "d/g", [1, 2])]
    Journal("run", ops, [["d/f", "h1", 1, 0o600, 1, 7, 9]], ["d/g"], [["d/g"]],
            "/undo/run").save(path)
    raw = json.loads(path.read_text())
    assert list(raw) == ["run_id", "ops", "ancestors", "forget", "previous", "undo_dir"]
    assert list(raw["ops"][0]) == ["kind", "path", "expect", "staged", "hash", "mode",
                                   "mtime_ns"]
    back = Journal.load(path)
    assert (back.run_id, back.ops, back.ancestors, back.forget, back.previous,
            back.undo_dir) == ("run", ops, [["d/f", "h1", 1, 0o600, 1, 7, 9]], ["d/g"],
                               [["d/g"]], "/undo/run")
    assert back == Journal("run", ops, [["d/f", "h1", 1, 0o600, 1, 7, 9]], ["d/g"],
                           [["d/g"]], "/undo/run")
    assert back != Journal("run", ops, undo_dir="/undo/run")
    assert Journal("r").ops is not Journal("r").ops  # each its own list
