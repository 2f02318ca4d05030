"""Transition: carry out a plan, re-checking each target, recording what was confirmed.

Order: stage what is still missing, save the losing versions of conflicts, change
the remote (one send stream, one delete request), change the host (journaled),
then record ancestors and caches. Nothing is recorded before it is confirmed.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from itertools import compress
from operator import is_, ne
from pathlib import Path
from typing import TYPE_CHECKING

from filesync.core.model import Listing, Skipped
from filesync.core.reconcile import Action, Kind, Version
from filesync.endpoint.contract import SendItem
from filesync.host.apply import HostOp, HostTree, Journal, OpResult, run_journal
from filesync.host.scan import RACY_NS, UNREAD, CacheRow, HashingReader, LocalScan
from filesync.host.state import Ancestor, ConflictRecord
from filesync.sync.engine import commit_journal
from filesync.tree.wire import SAFETY, Reason

if TYPE_CHECKING:
    from filesync.sync.engine import Pass

UNDO_KEEP = 5


def _ends_in(action: Action, kind: Kind) -> bool:
    return action.kind is kind or (action.kind is Kind.CONFLICT and action.then is kind)


async def transition(
    p: Pass, anc: dict[str, Ancestor], local: LocalScan, remote: Listing, plan: list[Action]
) -> None:
    plan = await _ensure_staged(p, plan)
    conflicts = _save_conflicts(p, plan)
    await _upload(p, local, remote, plan)
    await _delete_remote(p, remote, plan)
    _apply_host(p, anc, local, plan)
    _record(p, local, remote, plan)
    _update_conflict_table(p, conflicts, plan)
    _update_caches(p, local, plan)


async def _ensure_staged(p: Pass, plan: list[Action]) -> list[Action]:
    """Fetch what downloads and conflict copies need but the scan did not read."""
    prior = p.state.conflicts()
    need = []
    for a in plan:
        if a.path in p.sink.staged:
            continue
        saved = _prior_copy(prior.get(a.path), p.remote_v.get(a.path))
        if a.kind is Kind.DOWNLOAD or (a.kind is Kind.CONFLICT and not saved):
            need.append(a.path)
    if need:
        await p.session.fetch(p.remote_root, need, p.sink)
    kept = []
    for a in plan:
        staged = p.sink.staged.get(a.path)
        if a.path in need and (staged is None or staged.hash != p.remote_v[a.path].hash):
            p.report.skipped.append(Skipped(a.path, "changed on the remote during the run; "
                                                    "retried next run"))
            continue
        kept.append(a)
    return kept


def _prior_copy(record: ConflictRecord | None, remote: Version | None) -> bool:
    return bool(
        record and remote and record.remote_hash == remote.hash and record.saved_to
        and os.path.exists(record.saved_to)
    )


def _save_conflicts(p: Pass, plan: list[Action]) -> list[ConflictRecord]:
    """Keep the remote version of every conflict under the state dir."""
    prior = p.state.conflicts()
    records = []
    for a in plan:
        if a.kind is not Kind.CONFLICT:
            continue
        rv = p.remote_v[a.path]
        record = prior.get(a.path)
        if record is not None and _prior_copy(record, rv):
            saved = str(record.saved_to)
        else:
            saved = str(_save_copy(p, a.path))
        lv = p.local_v.get(a.path)
        records.append(ConflictRecord(a.path, lv.hash if lv else None, rv.hash, saved))
        p.report.conflicts.append({"path": a.path, "saved_to": saved})
    return records


def _save_copy(p: Pass, rel: str) -> Path:
    dest = p.state.conflicts_dir / p.run_id / rel
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(p.sink.staged[rel].path, dest)
    return dest.resolve()


async def _upload(p: Pass, local: LocalScan, remote: Listing, plan: list[Action]) -> None:
    uploads = [a.path for a in plan if _ends_in(a, Kind.UPLOAD)]
    if not uploads:
        return
    readers: dict[str, HashingReader] = {}
    rfiles = remote.files()
    entries = local.listing.entries
    bar = p.opts.progress
    advance = bar.advance if bar else None
    # Plain strings: a pathlib join per file costs more than reading a small file.
    base = str(p.local_root).rstrip("/") + "/"

    def items() -> Iterator[SendItem]:
        # Made while the stream runs: the remote starts on the first file at once.
        for rel in uploads:
            entry = entries[rel]
            reader = readers[rel] = HashingReader(base + rel, advance, entry.size)
            target = rfiles.get(rel)
            expect = (target.size, target.mtime_ns) if target else None
            yield SendItem(rel, entry.mode & 0o777, entry.mtime_ns, expect, reader)

    if bar is not None:
        bar.begin("upload", sum(entries[rel].size for rel in uploads))
    try:
        outcomes = await p.session.send(p.remote_root, items(), len(uploads))
    finally:
        if bar is not None:
            bar.end()
    rows = []
    for out in outcomes:
        if out.status == "ok":
            r = readers[out.path]
            entry = local.listing.entries[out.path]
            mode = entry.mode & 0o777
            if local.hashes[out.path].startswith(UNREAD) and local.cacheable(entry):
                # Read for the first time while sent: cache what was read.
                local.cache_rows[out.path] = (entry.size, entry.mtime_ns, entry.ino, r.digest)
            rows.append((out.path, Ancestor(r.digest, r.size, mode, out.size, out.mtime_ns, p.now)))
            p.report.uploaded += 1
        else:
            _failed(p, out.path, out.status, out.reason, "upload", out.code)
    p.state.put_ancestors(rows)


def _failed(p: Pass, path: str, status: str, reason: str, what: str,
            code: Reason | None) -> None:
    if status == "changed":
        p.report.skipped.append(Skipped(path, f"{reason}; retried next run", code))
    elif code in SAFETY:
        p.report.skipped.append(Skipped(path, f"{what} refused: {reason}", code))
    else:
        p.report.skipped.append(Skipped(path, f"{what} failed: {reason}"))
        p.report.errors.append(f"{what} of {path} failed: {reason}")


async def _delete_remote(p: Pass, remote: Listing, plan: list[Action]) -> None:
    rfiles = remote.files()
    entries = [rfiles[a.path] for a in plan if _ends_in(a, Kind.DELETE_REMOTE) and a.path in rfiles]
    if not entries:
        return
    gone = []
    for out in await p.session.delete(p.remote_root, entries):
        if out.status == "ok":
            gone.append(out.path)
            p.report.deleted_remote += 1
        else:
            _failed(p, out.path, out.status, out.reason, "remote delete", out.code)
    p.state.forget(gone)


def _apply_host(p: Pass, anc: dict[str, Ancestor], local: LocalScan, plan: list[Action]) -> None:
    journal = Journal(p.run_id, undo_dir=str(p.state.undo_dir / p.run_id))
    for a in plan:
        entry = local.listing.entries.get(a.path)
        expect = [entry.size, entry.mtime_ns] if entry else None
        if a.kind is Kind.DOWNLOAD:
            s = p.sink.staged[a.path]
            journal.ops.append(HostOp("write", a.path, expect, str(s.path), s.hash, s.mode,
                                      s.mtime_ns))
            journal.ancestors.append(
                [a.path, s.hash, s.size, s.mode, s.size, s.mtime_ns, p.now])
        elif a.kind is Kind.DELETE_LOCAL:
            journal.ops.append(HostOp("delete", a.path, expect))
            journal.forget.append(a.path)
        else:
            continue
        old = anc.get(a.path)
        journal.previous.append([a.path, *(_row(old) if old else [])])
    if not journal.ops:
        return
    journal.save(p.state.journal_path)
    tree = HostTree(p.local_root, Path(journal.undo_dir))
    try:
        results = run_journal(tree, journal)
    finally:
        tree.close()
    commit_journal(p.state, journal, results)
    _host_results(p, results)
    _prune_undo(p.state.undo_dir)


def _row(a: Ancestor) -> list[object]:
    return [a.hash, a.size, a.mode, a.remote_size, a.remote_mtime_ns, a.synced_ns]


def _host_results(p: Pass, results: list[OpResult]) -> None:
    for r in results:
        if r.status == "done":
            if r.op.kind == "write":
                p.report.downloaded += 1
            else:
                p.report.deleted_local += 1
        elif r.status == "changed" and r.op.kind == "write":
            # Edited on the host since the scan: keep it, save the remote version.
            saved = str(_save_copy(p, r.op.path)) if r.op.path in p.sink.staged else ""
            p.report.conflicts.append({"path": r.op.path, "saved_to": saved})
        else:
            _failed(p, r.op.path, r.status, r.reason, "host " + r.op.kind, r.code)


def _prune_undo(undo_dir: Path) -> None:
    runs = sorted(d for d in undo_dir.iterdir() if d.is_dir()) if undo_dir.exists() else []
    for old in runs[:-UNDO_KEEP]:
        shutil.rmtree(old, ignore_errors=True)


def _record(p: Pass, local: LocalScan, remote: Listing, plan: list[Action]) -> None:
    rfiles = remote.files()
    rows = []
    planned = {a.path for a in plan}
    for a in plan:
        if a.kind is Kind.RECORD:
            le, re_ = local.listing.entries[a.path], rfiles[a.path]
            rows.append((a.path, Ancestor(local.hashes[a.path], le.size, le.mode & 0o777,
                                          re_.size, re_.mtime_ns, p.now)))
    # Fetched, unchanged files: remember their remote stat so they are not read again.
    for path, s in p.sink.staged.items():
        if path not in planned and path in p.ancestors and path in local.hashes:
            old = p.ancestors[path]
            if old.hash == s.hash:
                rows.append(
                    (path, Ancestor(old.hash, old.size, old.mode, s.size, s.mtime_ns, p.now)))
    p.state.put_ancestors(rows)
    p.state.forget([a.path for a in plan if a.kind is Kind.FORGET])


def _update_conflict_table(p: Pass, records: list[ConflictRecord], plan: list[Action]) -> None:
    from filesync.core.reconcile import Direction

    keep = records if p.opts.direction is not Direction.PUSH else []
    open_paths = {r.path for r in keep}
    skipped = {s.path for s in p.report.skipped}
    resolved = {a.path for a in plan if a.kind is not Kind.CONFLICT}
    cleared = [
        c for c in p.state.conflicts()
        if c not in open_paths
        and (c in resolved or (c not in p.full_conflicts and c not in skipped))
    ]
    p.state.set_conflicts(keep, cleared)


def _update_caches(p: Pass, local: LocalScan, plan: list[Action]) -> None:
    touched = {a.path for a in plan if a.kind in (Kind.DOWNLOAD, Kind.DELETE_LOCAL)}
    rows = local.cache_rows
    new = {k: v for k, v in rows.items() if k not in touched} if touched else rows
    old = p.old_cache
    if not _same_objects(new, old):
        # Only what changed is written: C-level passes find it (a Python loop over a
        # 100k-file cache took ~40 ms).
        changed = compress(new.items(), map(ne, map(old.get, new), new.values()))
        p.state.update_local_cache([(k, *v) for k, v in changed], old.keys() - new.keys())
    remote = [(path, s.size, s.mtime_ns, s.hash) for path, s in p.sink.staged.items()
              if s.mtime_ns < p.now - RACY_NS]
    if remote:  # an empty write would still take the database's write lock
        p.state.put_remote_cache(remote)


def _same_objects(new: dict[str, CacheRow], old: dict[str, CacheRow]) -> bool:
    """``new`` holds the very key and row objects of ``old``, in its order: equal without
    comparing a field (``scan_cached`` copies an untouched cache that way)."""
    return len(new) == len(old) and all(map(is_, new, old)) and all(
        map(is_, new.values(), old.values()))
