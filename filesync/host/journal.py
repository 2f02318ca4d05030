"""The intent journal of a host apply, and the recovery that finishes it after a crash.

A pull first stages every file (fsynced) under the state dir, then writes the journal
(temp, every byte, fsync, rename, fsync dir) or nothing at all, then applies its ops in
order through ``HostTree``. Every op is idempotent, so a run that finds an unfinished
journal (``recover``) replays it before doing anything else: a crash at any point ends
with every file holding its old or its new content. The ancestor rows a journal carries
are committed only for the ops that were done (``commit_journal``); the journal is
retired only after that commit.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from filesync.core.faults import crash_point
from filesync.errors import FilesyncError
from filesync.host.apply import DIR_FLAGS, HostOp, HostTree, OpResult
from filesync.host.state import Ancestor, PairState
from filesync.tree.dirfd import make_dirs
from filesync.tree.wire import Status


class Journal:
    """The intent of one apply: its ops and the state rows to commit when done.

    A plain class, not a dataclass: a pull loads this module, and a dataclass compiles
    its methods from source when created (~0.6 ms); the three it needs are written out.
    """

    __slots__ = ("ancestors", "forget", "ops", "previous", "run_id", "undo_dir")

    def __init__(self, run_id: str, ops: list[HostOp] | None = None,
                 ancestors: list[list[Any]] | None = None, forget: list[str] | None = None,
                 previous: list[list[Any]] | None = None, undo_dir: str = "") -> None:
        self.run_id = run_id
        self.ops = [] if ops is None else ops
        self.ancestors = [] if ancestors is None else ancestors
        self.forget = [] if forget is None else forget
        #: ancestor rows of the touched paths before this apply, for ``filesync undo``
        self.previous = [] if previous is None else previous
        self.undo_dir = undo_dir

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Journal):
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name) for name in self.__slots__)

    __hash__ = None  # type: ignore[assignment]  # mutable: equal by value, not hashable

    def __repr__(self) -> str:
        return f"Journal({', '.join(f'{n}={getattr(self, n)!r}' for n in self.__slots__)})"

    def save(self, path: Path) -> None:
        """Write the journal durably (temp, fsync, rename, fsync dir) or not at all."""
        fields = {"run_id": self.run_id, "ops": [op._asdict() for op in self.ops],
                  "ancestors": self.ancestors, "forget": self.forget,
                  "previous": self.previous, "undo_dir": self.undo_dir}
        data = json.dumps(fields).encode("utf-8", "surrogateescape")
        write_atomic(path, data, "the apply journal")
        crash_point("journal-saved")

    @classmethod
    def load(cls, path: Path) -> Journal:
        try:
            raw = json.loads(path.read_bytes().decode("utf-8", "surrogateescape"))
            raw["ops"] = [HostOp(**op) for op in raw["ops"]]
            return cls(**raw)
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise FilesyncError(
                f"the apply journal {path} is unreadable ({type(exc).__name__}); move it "
                "away and rerun (the files it names may hold their old or new content)"
            ) from exc


def run_journal(tree: HostTree, journal: Journal) -> list[OpResult]:
    """Apply every op of ``journal`` in order and write the undo manifest."""
    results = []
    for op in journal.ops:
        crash_point("before-op")
        results.append(tree.apply(op))
    tree.flush()  # the new names on disk before the ops count as done
    crash_point("ops-done")
    if journal.undo_dir:
        _write_undo_manifest(Path(journal.undo_dir), results, journal.previous, tree.umask)
        crash_point("manifest-written")
    return results


def commit_journal(state: PairState, journal: Journal, results: list[OpResult]) -> None:
    """Record the ancestors of the ops that were done, then retire the journal."""
    done = {r.op.path for r in results if r.status == Status.OK}
    rows = [(r[0], Ancestor(*r[1:])) for r in journal.ancestors if r[0] in done]
    state.put_ancestors(rows)
    state.forget([p for p in journal.forget if p in done])
    state.journal_path.unlink(missing_ok=True)


def recover(state: PairState, local_root: Path) -> None:
    """Finish an apply that a crash interrupted, then drop stale staging dirs."""
    if state.journal_path.exists():
        journal = Journal.load(state.journal_path)
        tree = HostTree(local_root, Path(journal.undo_dir) if journal.undo_dir else None,
                        state.umask)
        try:
            results = run_journal(tree, journal)
        finally:
            tree.close()
        commit_journal(state, journal, results)
    if state.staging.exists():
        shutil.rmtree(state.staging, ignore_errors=True)


def _write_undo_manifest(
    undo_dir: Path, results: Iterable[OpResult], previous: list[list[Any]],
    umask: int | None,
) -> None:
    rows = [
        {"path": r.op.path, "kind": r.op.kind, "hash": r.op.hash,
         # A file: where a directory became a file, ``files/<path>`` is the directory
         # holding the kept files that were under it, not a kept old version.
         "kept": (undo_dir / "files" / r.op.path).is_file()}
        for r in results if r.status == Status.OK
    ]
    manifest = {"ops": rows, "previous": previous}
    try:
        make_dirs(undo_dir, umask)
    except OSError as exc:
        raise FilesyncError(
            f"cannot create {undo_dir}: {exc.strerror}; free space in the state dir and rerun"
        ) from exc
    data = json.dumps(manifest).encode("utf-8", "surrogateescape")
    write_atomic(undo_dir / "manifest.json", data, "the undo manifest")


def write_atomic(path: Path, data: bytes, what: str) -> None:
    """Temp file, every byte written, fsync, rename, fsync dir; a failure leaves no temp."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise FilesyncError(
            f"cannot write {what} {path}: {exc.strerror or exc}; free space in the state dir "
            "and rerun"
        ) from exc
    _fsync_dir(path.parent)


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, DIR_FLAGS)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
