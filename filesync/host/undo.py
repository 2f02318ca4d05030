"""Undo on the host: put back the files the last pull replaced or deleted.

A file is restored only if it still holds what the pull wrote (an edit made since
is never overwritten), and a file the pull deleted only while its name is still free.
The ancestor rows go back to what they were before the pull, so the next pull offers
the same remote changes again. The undo of a run is consumed: its directory is removed.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from filesync.errors import FilesyncError
from filesync.host.apply import HostOp, HostTree
from filesync.host.journal import recover
from filesync.host.scan import hash_file
from filesync.host.state import Ancestor, PairState
from filesync.tree.dirfd import make_dirs
from filesync.tree.wire import Status


def undo_in(state: PairState, local_root: Path) -> list[str]:
    """Undo the last pull recorded in ``state``; returns the restored paths."""
    recover(state, local_root)
    run = _latest(state)
    manifest = json.loads((run / "manifest.json").read_text(encoding="utf-8"))
    scratch = state.staging / "undo"
    make_dirs(scratch, state.umask)
    tree = HostTree(local_root, None, state.umask)
    restored: list[str] = []
    try:
        # Last op first: a directory the pull replaced by a file (its files deleted,
        # then the file written) comes back as it was, the file removed first.
        for row in reversed(manifest["ops"]):
            op = _undo_op(row, run, local_root, scratch)
            if op is not None and tree.apply(op).status == Status.OK:
                restored.append(row["path"])
    finally:
        tree.close()
        shutil.rmtree(scratch, ignore_errors=True)
        state.drop_staging_if_empty()
    _restore_ancestors(state, manifest["previous"], set(restored))
    shutil.rmtree(run, ignore_errors=True)
    return restored


def _latest(state: PairState) -> Path:
    runs = (
        sorted(d for d in state.undo_dir.glob("*/manifest.json")) if state.undo_dir.exists() else []
    )
    if not runs:
        raise FilesyncError(
            "nothing to undo for this pair; undo restores the host files of the last pull"
        )
    return runs[-1].parent


def _undo_op(row: dict[str, Any], run: Path, local_root: Path, scratch: Path) -> HostOp | None:
    target = local_root / row["path"]
    kept = run / "files" / row["path"]
    try:
        st = os.lstat(target)
        current = hash_file(target)
        expect: list[int] | None = [st.st_size, st.st_mtime_ns]
    except FileNotFoundError:
        current, expect = None, None
    if row["kind"] == "write" and current != row["hash"]:
        return None  # edited since the pull: leave it
    if row["kind"] == "delete" and current is not None:
        return None
    if not row["kept"]:
        return HostOp("delete", row["path"], expect)
    copy = scratch / str(len(os.listdir(scratch)))
    shutil.copy2(kept, copy)
    kst = os.stat(kept)
    return HostOp(
        "write", row["path"], expect, str(copy), None, kst.st_mode & 0o777, kst.st_mtime_ns
    )


def _restore_ancestors(state: PairState, previous: list[list[Any]], restored: set[str]) -> None:
    rows = [(r[0], Ancestor(*r[1:])) for r in previous if r[0] in restored and len(r) > 1]
    state.put_ancestors(rows)
    state.forget([r[0] for r in previous if r[0] in restored and len(r) == 1])
