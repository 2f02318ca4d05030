"""Transition: carry out a plan, re-checking each target, recording what was confirmed.

``transition(inputs, scans, planned)`` reads only its frozen arguments and returns a
``Transitioned``: what happened (confirmed transfers, conflicts saved, skips, failures),
which the engine folds into its report, with one ``Change`` (``filesync.sync.changes``)
per file, made when its side confirmed it. Order: stage what is still missing, save the
losing versions of conflicts, change the remote (one delete request, then one send stream
per ``UPLOAD_BATCH`` files, each recorded once confirmed), change the host (journaled,
deletes before writes), then record ancestors and caches. Nothing is recorded before it
is confirmed. ``remote_done``, if given, is awaited once the remote is changed and before
the host is: the last point at which the pass's endpoint is free for a request of its
own (the engine asks the seal's walk there, so that it runs while the host side works).
After uploads that placed a file it is awaited as soon as the last stream's reply is in,
before that stream is recorded (and no empty send makes the root: the stream did).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from itertools import compress
from operator import is_, ne
from pathlib import Path

from filesync.core.model import Listing, Skipped
from filesync.core.reconcile import Action, Direction, Kind, Version
from filesync.endpoint.contract import SendItem
from filesync.host.apply import HostOp, HostTree, OpResult
from filesync.host.journal import Journal, commit_journal, run_journal
from filesync.host.scan import RACY_NS, UNREAD, CacheRow, HashingReader, LocalScan
from filesync.host.state import Ancestor, ConflictRecord
from filesync.sync.changes import Change, ChangeAction, CountsChanges
from filesync.sync.inputs import PassInputs, Planned, Scans
from filesync.tree.dirfd import make_dirs
from filesync.tree.wire import SAFETY, Reason, Status


class Transitioned(CountsChanges):
    """What a transition did. Built up by the transition only, then handed back; its
    counters are counted from ``changes``.

    A plain class, not a dataclass: this module loads on every pass with something to
    do, and creating a dataclass costs ~0.5 ms, more than its generated methods save."""

    __slots__ = ("changes", "conflicts", "errors", "skipped")

    def __init__(self) -> None:
        self.conflicts: list[dict[str, str]] = []
        self.skipped: list[Skipped] = []
        self.errors: list[str] = []
        #: one per confirmed file, sorted by path once the transition is over
        self.changes: list[Change] = []


def _ends_in(action: Action, kind: Kind) -> bool:
    return action.kind is kind or (action.kind is Kind.CONFLICT and action.then is kind)


async def transition(inputs: PassInputs, scans: Scans, planned: Planned,
                     remote_done: Callable[[], Awaitable[None]] | None = None) -> Transitioned:
    """Carry out ``planned.actions``; returns what was confirmed, skipped or failed."""
    out = Transitioned()
    plan = await _ensure_staged(inputs, planned, out)
    conflicts = _save_conflicts(inputs, planned, plan, out)
    # Deletes first, on both sides: a name turned from a directory into a file is free
    # (the emptied directory pruned) when the file is written, so it converges in one pass.
    await _delete_remote(inputs, scans.remote, plan, out)
    read_rows, placed = await _upload(inputs, scans, plan, out, remote_done)
    if not placed:
        await _ensure_remote_root(inputs, scans)
        if remote_done is not None:
            await remote_done()
    _apply_host(inputs, scans.ancestors, scans.local, plan, out)
    _record(inputs, scans, plan)
    _update_conflict_table(inputs, planned, conflicts, plan, out)
    _update_caches(inputs, scans, plan, read_rows)
    out.changes.sort(key=_by_path)
    return out


async def _ensure_remote_root(inputs: PassInputs, scans: Scans) -> None:
    """A push or sync leaves the remote root in place even with nothing to upload (as
    rsync does): the next pull then finds an empty tree, not a missing one."""
    if inputs.opts.direction is not Direction.PULL and not scans.remote.exists:
        await inputs.endpoint.send(inputs.remote_root, [], 0)  # an empty send makes the root


def _by_path(change: Change) -> str:
    return change.path


async def _ensure_staged(
    inputs: PassInputs, planned: Planned, out: Transitioned
) -> list[Action]:
    """Fetch what downloads and conflict copies need but the scan did not read. A path
    whose remote version changed since the listing is dropped ("changed on the remote
    during the run"), and with a type conflict every step that carries it out."""
    sink, rv = inputs.sink, planned.remote_versions
    prior = inputs.state.conflicts()
    need: list[str] = []
    for a in planned.actions:
        if a.kind is Kind.DOWNLOAD:
            need.append(a.path)
        elif a.kind is Kind.CONFLICT and not _prior_copy(prior.get(a.path), remote_hash(a, rv)):
            need += _saved_paths(a)
    need = [p for p in need if p not in sink.staged]
    if need:
        await inputs.endpoint.fetch(inputs.remote_root, need, sink)
    asked = set(need)
    changed = {p for p in asked
               if (staged := sink.staged.get(p)) is None or staged.hash != rv[p].hash}
    dropped = set()
    kept = []
    for a in planned.actions:
        if a.kind in (Kind.DOWNLOAD, Kind.CONFLICT) and not changed.isdisjoint(
                _saved_paths(a) if a.kind is Kind.CONFLICT else (a.path,)):
            out.skipped.append(Skipped(a.path, "changed on the remote during the run; "
                                               "retried next run"))
            dropped.add(a.path)
            continue
        kept.append(a)
    return [a for a in kept if a.of is None or a.of not in dropped]


def _saved_paths(conflict: Action) -> tuple[str, ...]:
    """The remote files a conflict's saved copy holds: the file, or the directory's."""
    return conflict.clash.remote if conflict.clash is not None else (conflict.path,)


def remote_hash(conflict: Action, rv: Mapping[str, Version]) -> str | None:
    """The remote side of a conflict as its record keeps it."""
    if conflict.clash is not None:
        return conflict.clash.remote_hash
    version = rv.get(conflict.path)
    return version.hash if version is not None else None


def _prior_copy(record: ConflictRecord | None, remote: str | None) -> bool:
    return bool(
        record and remote and record.remote_hash == remote and record.saved_to
        and os.path.exists(record.saved_to)
    )


def _save_conflicts(
    inputs: PassInputs, planned: Planned, plan: list[Action], out: Transitioned
) -> list[ConflictRecord]:
    """Keep the remote version of every conflict under the state dir (a type conflict's
    directory whole), unless the copy an earlier run saved holds it still."""
    prior = inputs.state.conflicts()
    records = []
    for a in plan:
        if a.kind is not Kind.CONFLICT:
            continue
        rhash = remote_hash(a, planned.remote_versions)
        record = prior.get(a.path)
        copied = 0
        if record is not None and _prior_copy(record, rhash):
            saved = str(record.saved_to)
        else:
            for rel in _saved_paths(a):
                save_copy(inputs, rel)
                copied += inputs.sink.staged[rel].size
            saved = str((inputs.state.conflicts_dir / inputs.run_id / a.path).resolve())
        if a.clash is not None:
            lhash: str | None = a.clash.local_hash
        else:
            lv = planned.local_versions.get(a.path)
            lhash = lv.hash if lv else None
        records.append(ConflictRecord(a.path, lhash, rhash, saved))
        out.conflicts.append({"path": a.path, "saved_to": saved})
        if a.then is None:  # a push conflict goes on: its upload or delete is the change
            out.changes.append(Change(a.path, ChangeAction.CONFLICT, copied))
    return records


def save_copy(inputs: PassInputs, rel: str) -> Path:
    """Copy the staged remote version of ``rel`` into this run's ``conflicts/`` dir, with
    the file's own permission bits (a 0600 file is not made readable by others)."""
    staged = inputs.sink.staged[rel]
    dest = inputs.state.conflicts_dir / inputs.run_id / rel
    make_dirs(dest.parent, inputs.opts.umask)
    shutil.copyfile(staged.path, dest)  # the staged file is 0600: so is the copy, at first
    os.chmod(dest, staged.mode & 0o777)
    return dest.resolve()


#: Uploads per send request. What a request holds until the remote confirms it (readers,
#: outcomes, the decoded reply, ancestor rows: ~1 KB a file) is freed before the next is
#: sent, so a 100k-file push peaks at one batch's worth of it, and what a batch confirmed
#: is recorded before the next one starts. The remote keeps working across the boundary:
#: only the reply's round trip is paid per batch.
UPLOAD_BATCH = 4096


async def _upload(
    inputs: PassInputs, scans: Scans, plan: list[Action], out: Transitioned,
    remote_done: Callable[[], Awaitable[None]] | None,
) -> tuple[dict[str, CacheRow], bool]:
    """Send the uploads, ``UPLOAD_BATCH`` files per stream; returns the cache rows of
    files first read here, and whether a file was placed (the remote root exists then).
    If one was, ``remote_done`` was awaited as soon as the last stream's reply was in, so
    that the seal's walk runs while that stream is recorded too."""
    uploads = [a.path for a in plan if _ends_in(a, Kind.UPLOAD)]
    read_rows: dict[str, CacheRow] = {}
    if not uploads:
        return read_rows, False
    bar = inputs.opts.progress
    if bar is not None:
        bar.begin("upload", sum(scans.local.listing.entries[rel].size for rel in uploads))
    placed = False
    try:
        for start in range(0, len(uploads), UPLOAD_BATCH):
            last = start + UPLOAD_BATCH >= len(uploads)
            placed = await _upload_batch(
                inputs, scans, uploads[start:start + UPLOAD_BATCH], out, read_rows,
                remote_done if last else None, placed) or placed
    finally:
        if bar is not None:
            bar.end()
    return read_rows, placed


async def _upload_batch(inputs: PassInputs, scans: Scans, uploads: list[str],
                        out: Transitioned, read_rows: dict[str, CacheRow],
                        remote_done: Callable[[], Awaitable[None]] | None = None,
                        placed: bool = False) -> bool:
    """Send ``uploads`` in one stream and record what the remote confirmed; returns
    whether it placed a file. ``remote_done`` (the last stream's) is awaited once the
    reply is in, before the recording, if this or an earlier stream placed a file."""
    readers: dict[str, HashingReader] = {}
    local = scans.local
    rfiles = scans.remote.files()
    entries = local.listing.entries
    bar = inputs.opts.progress
    advance = bar.advance if bar else None
    # Plain strings: a pathlib join per file costs more than reading a small file.
    base = str(inputs.local_root).rstrip("/") + "/"
    shared = inputs.host_scans

    def items() -> Iterator[SendItem]:
        # Made while the stream runs: the remote starts on the first file at once.
        for rel in uploads:
            entry = entries[rel]
            reader = readers[rel] = HashingReader(base + rel, advance, entry.size) \
                if shared is None else shared.reader(inputs.local_root, base + rel, advance, entry)
            target = rfiles.get(rel)
            expect = (target.size, target.mtime_ns) if target else None
            yield SendItem(rel, entry.mode & 0o777, entry.mtime_ns, expect, reader)

    outcomes = await inputs.endpoint.send(inputs.remote_root, items(), len(uploads))
    placed_here = any(o.status == Status.OK for o in outcomes)
    if remote_done is not None and (placed or placed_here):
        await remote_done()
    rows = []
    modes: dict[int, int] = {}
    for o in outcomes:
        if o.status == Status.OK:
            r = readers[o.path]
            entry = entries[o.path]
            mode = entry.mode & 0o777
            if local.hashes[o.path].startswith(UNREAD) and local.cacheable(entry):
                # Read for the first time while sent: cache what was read.
                read_rows[o.path] = (entry.size, entry.mtime_ns, entry.ino, r.digest)
            # A row outlives the pass (the state keeps it): equal numbers are the entry's
            # own objects, not one more int each (~10 MB over a 100k-file push).
            size, mtime = entry.size, entry.mtime_ns
            rows.append((o.path, Ancestor(
                r.digest, size if r.size == size else r.size, modes.setdefault(mode, mode),
                size if o.size == size else o.size,
                mtime if o.mtime_ns == mtime else o.mtime_ns, inputs.now)))
            out.changes.append(Change(o.path, ChangeAction.UPLOAD, r.size))
        else:
            _failed(out, o.path, o.status, o.reason, "upload", o.code)
    inputs.state.put_ancestors(rows)
    return placed_here


def _failed(out: Transitioned, path: str, status: Status, reason: str, what: str,
            code: Reason | None) -> None:
    if status == Status.CHANGED:
        out.skipped.append(Skipped(path, f"{reason}; retried next run", code))
    elif code in SAFETY:
        out.skipped.append(Skipped(path, f"{what} refused: {reason}", code))
    else:
        out.skipped.append(Skipped(path, f"{what} failed: {reason}"))
        out.errors.append(f"{what} of {path} failed: {reason}")


async def _delete_remote(
    inputs: PassInputs, remote: Listing, plan: list[Action], out: Transitioned
) -> None:
    rfiles = remote.files()
    entries = [rfiles[a.path] for a in plan if _ends_in(a, Kind.DELETE_REMOTE) and a.path in rfiles]
    if not entries:
        return
    gone = []
    for o in await inputs.endpoint.delete(inputs.remote_root, entries):
        if o.status == Status.OK:
            gone.append(o.path)
            out.changes.append(Change(o.path, ChangeAction.DELETE_REMOTE))
        else:
            _failed(out, o.path, o.status, o.reason, "remote delete", o.code)
    inputs.state.forget(gone)


def host_journal(
    inputs: PassInputs, anc: Mapping[str, Ancestor], local: LocalScan, plan: Sequence[Action]
) -> Journal:
    """The journal of the host side of ``plan``: its writes and deletes, each re-checked
    against the stat the scan saw, with the ancestor rows to commit once done.

    Every delete comes before every write: a name the remote turned from a directory
    into a file is free (its last file deleted, the emptied directory pruned) by the
    time the file is written, so the swap converges in one pass, with no false conflict.
    """
    state, staged, now = inputs.state, inputs.sink.staged, inputs.now
    journal = Journal(inputs.run_id, undo_dir=str(state.undo_dir / inputs.run_id))
    for a in plan:
        entry = local.listing.entries.get(a.path)
        expect = [entry.size, entry.mtime_ns] if entry else None
        if a.kind is Kind.DOWNLOAD:
            s = staged[a.path]
            journal.ops.append(HostOp("write", a.path, expect, str(s.path), s.hash, s.mode,
                                      s.mtime_ns))
            journal.ancestors.append([a.path, s.hash, s.size, s.mode, s.size, s.mtime_ns, now])
        elif a.kind is Kind.DELETE_LOCAL:
            journal.ops.append(HostOp("delete", a.path, expect))
            journal.forget.append(a.path)
        else:
            continue
        old = anc.get(a.path)
        journal.previous.append([a.path, *(_row(old) if old else [])])
    journal.ops.sort(key=_writes_last)  # stable: each kind keeps the plan's path order
    return journal


def _writes_last(op: HostOp) -> bool:
    return op.kind == "write"


def _apply_host(
    inputs: PassInputs, anc: Mapping[str, Ancestor], local: LocalScan, plan: list[Action],
    out: Transitioned,
) -> None:
    journal = host_journal(inputs, anc, local, plan)
    if not journal.ops:
        return
    state = inputs.state
    if inputs.host_scans is not None:
        inputs.host_scans.changed(inputs.local_root)
    inputs.sink.flush()  # the staged files on disk before the journal names them
    journal.save(state.journal_path)
    tree = HostTree(inputs.local_root, Path(journal.undo_dir), inputs.opts.umask)
    try:
        results = run_journal(tree, journal)
    finally:
        tree.close()
    commit_journal(state, journal, results)
    _host_results(inputs, results, out)


def _row(a: Ancestor) -> list[object]:
    return [a.hash, a.size, a.mode, a.remote_size, a.remote_mtime_ns, a.synced_ns]


def _host_results(inputs: PassInputs, results: list[OpResult], out: Transitioned) -> None:
    staged = inputs.sink.staged
    for r in results:
        path = r.op.path
        if r.status == Status.OK:
            if r.op.kind == "write":
                out.changes.append(Change(path, ChangeAction.DOWNLOAD, staged[path].size))
            else:
                out.changes.append(Change(path, ChangeAction.DELETE_LOCAL))
        elif r.status == Status.CHANGED and r.op.kind == "write":
            # Edited on the host since the scan: keep it, save the remote version.
            saved = str(save_copy(inputs, path)) if path in staged else ""
            out.conflicts.append({"path": path, "saved_to": saved})
            out.changes.append(Change(path, ChangeAction.CONFLICT,
                                      staged[path].size if saved else 0))
        else:
            _failed(out, r.op.path, r.status, r.reason, "host " + r.op.kind, r.code)


def _record(inputs: PassInputs, scans: Scans, plan: list[Action]) -> None:
    local, anc, now = scans.local, scans.ancestors, inputs.now
    rfiles = scans.remote.files()
    rows = []
    planned = {a.path for a in plan}
    for a in plan:
        if a.kind is Kind.RECORD:
            le, re_ = local.listing.entries[a.path], rfiles[a.path]
            rows.append((a.path, Ancestor(local.hashes[a.path], le.size, le.mode & 0o777,
                                          re_.size, re_.mtime_ns, now)))
    # Fetched, unchanged files: remember their remote stat so they are not read again.
    for path, s in inputs.sink.staged.items():
        if path not in planned and path in anc and path in local.hashes:
            old = anc[path]
            if old.hash == s.hash:
                rows.append((path, Ancestor(old.hash, old.size, old.mode, s.size, s.mtime_ns, now)))
    inputs.state.put_ancestors(rows)
    inputs.state.forget([a.path for a in plan if a.kind is Kind.FORGET])


def _update_conflict_table(
    inputs: PassInputs, planned: Planned, records: list[ConflictRecord], plan: list[Action],
    out: Transitioned,
) -> None:
    """Conflicts left in place stay open; one whose losing side was replaced (a push's,
    a resolve's) is settled, unless a step of it was skipped."""
    open_paths = {a.path for a in plan if a.kind is Kind.CONFLICT and a.then is None}
    keep = [r for r in records if r.path in open_paths]
    skipped = {s.path for s in planned.skipped} | {s.path for s in out.skipped}
    halted = {a.of for a in plan if a.of is not None and a.path in skipped}
    resolved = {a.path for a in plan if a.path not in open_paths} - skipped - halted
    cleared = [
        c for c in inputs.state.conflicts()
        if c not in open_paths
        and (c in resolved or (c not in planned.full_conflicts and c not in skipped))
    ]
    inputs.state.set_conflicts(keep, cleared)


def _update_caches(
    inputs: PassInputs, scans: Scans, plan: list[Action], read_rows: dict[str, CacheRow]
) -> None:
    touched = {a.path for a in plan if a.kind in (Kind.DOWNLOAD, Kind.DELETE_LOCAL)}
    rows = scans.local.cache_rows
    carry = scans.carry
    if carry is not None and carry.carried is not None:
        # Rows differ from the cache's only where the pass read or moved a file, or a
        # path's inputs changed (``sync.carry``): only those are compared.
        again = carry.recompute | touched | {a.path for a in plan} | read_rows.keys()
        old = scans.old_cache
        upserts: dict[str, CacheRow] = {}
        gone: list[str] = []
        for p in again:
            row = None if p in touched else read_rows.get(p) or rows.get(p)
            if row is None:
                if p in old:
                    gone.append(p)
            elif old.get(p) != row:
                upserts[p] = row
        inputs.state.update_local_cache(upserts, gone)
        _put_remote_cache(inputs)
        return
    new: Mapping[str, CacheRow]
    if touched or (rows and read_rows):
        new = {k: v for k, v in rows.items() if k not in touched}
        new.update((k, v) for k, v in read_rows.items() if k not in touched)
    else:
        new = rows or read_rows  # no copy: one side is all there is (a first push: read_rows)
    old = scans.old_cache
    if not _same_objects(new, old):
        # Only what changed is written: C-level passes find it, not a Python loop per
        # row, which a warm pass over a large tree would pay (docs/benchmarks.md).
        changed = dict(compress(new.items(), map(ne, map(old.get, new), new.values()))) \
            if old else new
        inputs.state.update_local_cache(changed, old.keys() - new.keys())
    _put_remote_cache(inputs)


def _put_remote_cache(inputs: PassInputs) -> None:
    remote = [(path, s.size, s.mtime_ns, s.hash) for path, s in inputs.sink.staged.items()
              if s.mtime_ns < inputs.now - RACY_NS]
    if remote:  # an empty write would still take the database's write lock
        inputs.state.put_remote_cache(remote)


def _same_objects(new: Mapping[str, CacheRow], old: Mapping[str, CacheRow]) -> bool:
    """``new`` holds the very key and row objects of ``old``, in its order: equal without
    comparing a field (``scan_cached`` copies an untouched cache that way)."""
    return len(new) == len(old) and all(map(is_, new, old)) and all(
        map(is_, new.values(), old.values()))
