"""One pass over one pair: scan both sides, reconcile, then transition.

The transition re-checks every target against the scan before touching it: the
remote helper refuses to replace or delete a file whose size or mtime moved, and
the host apply does the same through the journal. Whatever was not confirmed is
not recorded, so the next run picks it up again.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from filesync.core.exclude import ExcludeRule
from filesync.core.model import Entry, Listing, Skipped
from filesync.core.reconcile import Action, Direction, Kind, Version, reconcile
from filesync.endpoint.connect import drop_session, session_for
from filesync.endpoint.contract import Endpoint, FetchHeader, FetchSink, Outcome, SendItem
from filesync.errors import FilesyncError, SafetyRefusal
from filesync.host.apply import HostTree, Journal, OpResult, run_journal
from filesync.host.scan import (
    RACY_NS,
    HashingReader,
    LocalScan,
    filter_unsafe,
    hash_needed,
    list_local,
    new_hasher,
    scan_cached,
)
from filesync.host.state import Ancestor, ConflictRecord, PairState
from filesync.sync.progress import Progress
from filesync.transport.base import Conduit
from filesync.tree.wire import Reason

MASS_DELETE_MIN = 20


@dataclass
class Options:
    """How one pass runs. Defaults are the CLI's defaults."""

    direction: Direction
    rule: ExcludeRule = field(default_factory=ExcludeRule.build)
    state_dir: Path = Path("~/.local/state/filesync")
    dry_run: bool = False
    force: bool = False
    lock_timeout: float = 0.0
    max_file_size: int = 1 << 30
    max_pull_bytes: int = 2 << 30
    log: Callable[[str], None] | None = None
    progress: Progress | None = None
    #: Keep both trees watched (inotify) between passes of this process, so that a pass
    #: lists again only the directories that changed: for callers that run many passes
    #: on one open connection (the agent, terminal backends). A full walk still happens
    #: on the first pass, after any directory-level change, and every few minutes.
    watch: bool = False


@dataclass
class Report:
    """What a pass did (or, dry-run, would do)."""

    uploaded: int = 0
    downloaded: int = 0
    deleted_local: int = 0
    deleted_remote: int = 0
    conflicts: list[dict[str, str]] = field(default_factory=list)
    excluded: int = 0
    skipped: list[Skipped] = field(default_factory=list)
    bytes_sent: int = 0
    bytes_received: int = 0
    seconds: float = 0.0
    plan: list[Action] = field(default_factory=list)
    open_conflicts: list[ConflictRecord] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "uploaded": self.uploaded,
            "downloaded": self.downloaded,
            "deleted_local": self.deleted_local,
            "deleted_remote": self.deleted_remote,
            "conflicts": self.conflicts,
            "excluded": self.excluded,
            "skipped": [{"path": s.path, "reason": s.reason} for s in self.skipped],
            "bytes_sent": self.bytes_sent,
            "bytes_received": self.bytes_received,
            "seconds": round(self.seconds, 4),
        }


@dataclass(slots=True)
class Staged:
    """A fetched remote file, whole and fsynced under the staging dir."""

    path: Path
    hash: str
    size: int
    mode: int
    mtime_ns: int


class StagingSink(FetchSink):
    """Writes fetched files into the staging dir, hashing while writing."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.staged: dict[str, Staged] = {}
        self.failed_paths: dict[str, str] = {}
        self._n = 0
        self._fd = -1
        self._hasher = new_hasher()
        self._file = Path()
        self.progress: Callable[[int], None] | None = None

    def begin(self, head: FetchHeader) -> Callable[[bytes], None]:
        if self._n == 0:
            # Created lazily: recovery empties the staging area at the start of a run.
            self.dir.mkdir(parents=True, exist_ok=True)
        self._n += 1
        self._file = self.dir / f"{self._n}"
        self._fd = os.open(self._file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        self._hasher = new_hasher()
        return self._write

    def _write(self, data: bytes) -> None:
        if self.progress is not None:
            self.progress(len(data))
        self._hasher.update(data)
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]

    def end(self, head: FetchHeader, ok: bool, reason: str) -> None:
        if ok:
            os.fsync(self._fd)
        os.close(self._fd)
        if not ok:
            os.unlink(self._file)
            self.failed(head.path, reason)
            return
        digest = str(self._hasher.hexdigest())
        self.staged[head.path] = Staged(self._file, digest, head.size, head.mode & 0o777,
                                        head.mtime_ns)

    def failed(self, path: str, reason: str) -> None:
        """``path`` is not whole; a copy staged before (a torn read found later) is dropped."""
        self.failed_paths[path] = reason
        staged = self.staged.pop(path, None)
        if staged is not None:
            staged.path.unlink(missing_ok=True)


class Pass:
    """One pass of one pair, holding its lock for its whole duration."""

    def __init__(
        self,
        session: Endpoint,
        state: PairState,
        local_root: Path,
        remote_root: str,
        opts: Options,
    ) -> None:
        self.session = session
        self.state = state
        self.local_root = local_root
        self.remote_root = remote_root
        self.opts = opts
        self.run_id = f"{time.time_ns():020d}-{os.getpid()}"
        self.report = Report()
        self.sink = StagingSink(state.staging / self.run_id)
        self.now = time.time_ns()
        self.local_v: dict[str, Version] = {}
        self.remote_v: dict[str, Version] = {}
        self.ancestors: dict[str, Ancestor] = {}
        self.full_conflicts: set[str] = set()
        self.remote_same: set[str] = set()
        self.old_cache: dict[str, tuple[int, int, int, str]] = {}

    def log(self, message: str) -> None:
        if self.opts.log is not None:
            self.opts.log(message)

    # -- scan -------------------------------------------------------------------

    async def scan(self) -> tuple[dict[str, Ancestor], LocalScan, Listing]:
        recover(self.state, self.local_root)
        # The host walk (stat only) runs in a thread while the state is read and the
        # remote lists; the stat cache is applied to it afterwards.
        started_ns = time.time_ns()
        # Submitted at once (a task would start the thread only at the first await).
        walking = asyncio.get_running_loop().run_in_executor(
            None, list_local, self.local_root, self.opts.rule, self.opts.watch)
        try:
            anc = self.state.ancestors()
            self.old_cache = self.state.local_cache()
            remote = await self.session.list_tree(self.remote_root, self.opts.rule)
        finally:
            listed = await walking
        local = scan_cached(listed, self.old_cache, started_ns)
        filter_unsafe(remote)
        rfiles = remote.files()
        # Only files that will be compared with something are read now.
        hash_needed(local, self.local_root, lambda rel: rel in anc or rel in rfiles)
        self.report.excluded = remote.excluded + local.listing.excluded
        self.report.skipped += local.listing.skipped + remote.skipped
        return anc, local, remote

    def guard_roots(self, anc: dict[str, Ancestor], local: Listing, remote: Listing) -> None:
        """Refuse when a whole side looks reset while the ancestor says it held files."""
        if not anc or self.opts.force:
            return
        d = self.opts.direction
        if d is not Direction.PUSH and not remote.files():
            raise SafetyRefusal(
                f"remote root {self.remote_root} is missing or empty but {len(anc)} files were "
                "synced before; if it was emptied on purpose, rerun with --force"
            )
        if d is not Direction.PULL and not local.files():
            raise SafetyRefusal(
                f"local root {self.local_root} is missing or empty but {len(anc)} files were "
                "synced before (unmounted disk?); if it was emptied on purpose, rerun with --force"
            )

    # -- remote versions --------------------------------------------------------

    def remote_versions(
        self, anc: dict[str, Ancestor], local: LocalScan, remote: Listing
    ) -> tuple[dict[str, Version], list[Entry]]:
        """Versions known without reading the remote, and the candidates to fetch.

        Files whose stat still matches the ancestor go to ``self.remote_same`` (their
        version is the ancestor's) without building anything per file.
        """
        cache = self.state.remote_cache()
        known: dict[str, Version] = {}
        fetch: list[Entry] = []
        same = self.remote_same
        rfiles = remote.files()
        # Most files of a large tree are unchanged: find those with C-level passes (in
        # listing order, which keeps memory access sequential), then give only the
        # rest to the loop below, which decides exactly as it would for every file.
        unchanged = _unchanged_remote(anc, rfiles) if _FAST else set()
        same |= unchanged
        # (``unchanged`` holds only listed paths: as many means all of them.)
        rest: Iterable[tuple[str, Entry]] = (
            rfiles.items() if not unchanged
            else () if len(unchanged) == len(rfiles)
            else ((rel, rfiles[rel]) for rel in _not_in(rfiles, unchanged))
        )
        for rel, e in rest:
            mode = e.mode & 0o777
            a = anc.get(rel)
            if a is not None and e.size == a.remote_size and e.mtime_ns == a.remote_mtime_ns \
                    and mode == a.mode and a.remote_mtime_ns < a.synced_ns - RACY_NS:
                same.add(rel)
            elif rel in cache and cache[rel][:2] == (e.size, e.mtime_ns):
                known[rel] = Version(cache[rel][2], mode)
            elif e.size > self.opts.max_file_size:
                self.report.skipped.append(Skipped(rel, "larger than --max-file-size"))
            elif self.opts.direction is Direction.PUSH and a is None and (
                rel not in local.listing.entries
            ):
                continue  # remote-only and never pushed: push leaves it alone
            else:
                fetch.append(e)
        return known, fetch

    async def fetch(self, entries: list[Entry]) -> None:
        total = sum(e.size for e in entries)
        if total > self.opts.max_pull_bytes and not self.opts.force:
            raise SafetyRefusal(
                f"this run would fetch {total} bytes, more than --max-pull-bytes "
                f"{self.opts.max_pull_bytes}; raise the limit or exclude the large files"
            )
        if not entries:
            return
        bar = self.opts.progress
        if bar is not None:
            bar.begin("fetch", total)
            self.sink.progress = bar.advance
        try:
            await self.session.fetch(self.remote_root, [e.path for e in entries], self.sink)
        finally:
            if bar is not None:
                bar.end()
                self.sink.progress = None

    # -- plan -------------------------------------------------------------------

    def plan(
        self, anc: dict[str, Ancestor], local: LocalScan, remote: Listing,
        known: dict[str, Version], fetched: Iterable[Entry],
    ) -> list[Action]:
        """Reconcile every path that is not quietly in sync on all three sides."""
        rv = dict(known)
        for e in fetched:
            staged = self.sink.staged.get(e.path)
            if staged is None:
                reason = self.sink.failed_paths.get(e.path, "vanished")
                self.report.skipped.append(Skipped(e.path, f"remote: {reason}; retried next run"))
                continue
            rv[e.path] = Version(staged.hash, staged.mode)
        entries, hashes = local.listing.entries, local.hashes
        same, rfiles = self.remote_same, remote.files()
        quiet = _quiet(anc, local, rfiles, same) if _FAST else {
            p for p in same
            if hashes.get(p) == anc[p].hash and entries[p].mode & 0o777 == anc[p].mode
        }
        # A path whose version is unknown this run is left out entirely; so is all
        # under a skipped dir (unreadable, or now a symlink): absent is not deleted.
        unknown = {s.path for s in self.report.skipped}
        # Remote files neither unchanged nor with a version: skipped or left alone.
        unknown |= _left_out(rfiles, same, rv)
        unknown |= self._under_skipped(anc.keys(), hashes.keys(), rv.keys())
        # Every path any side knows, but the quiet ones: ``quiet`` is a subset of
        # ``same``, ``anc`` and ``hashes`` (``_quiet`` only keeps paths found in all
        # three), so a side holding exactly as many paths holds nothing else; a no-op
        # pass over a large tree then builds no large set here.
        paths: set[str] = set()
        for side in (anc.keys(), hashes.keys(), same):
            if len(side) != len(quiet):
                paths |= side - quiet
        paths |= rv.keys() - quiet
        paths -= unknown
        for p in paths & same:
            rv[p] = Version(anc[p].hash, anc[p].mode)
        lv = {p: Version(hashes[p], entries[p].mode & 0o777) for p in paths if p in hashes}
        av = {p: Version(anc[p].hash, anc[p].mode) for p in paths if p in anc}
        rv = {p: v for p, v in rv.items() if p in paths}
        self.local_v, self.remote_v, self.ancestors = lv, rv, anc
        plan = reconcile(av, lv, rv, self.opts.direction)
        self.full_conflicts = {a.path for a in plan if a.kind is Kind.CONFLICT}
        return plan

    def _under_skipped(self, *sides: Iterable[str]) -> set[str]:
        """Paths of ``sides`` inside a skipped dir, each reported: they are neither synced
        nor deleted. The sides are only joined when something was skipped."""
        why = {s.path.rstrip("/"): s for s in self.report.skipped}
        if not why:
            return set()
        inside: set[str] = set()
        for p in sorted(set().union(*sides)):
            parent, cut = p, p.rfind("/")
            while cut > 0:  # walk up the parents: O(depth), whatever the number of skips
                parent = parent[:cut]
                if parent in why:
                    break
                cut = parent.rfind("/")
            else:
                continue
            skip = why[parent]
            if skip.code in (Reason.SYMLINK, Reason.SYMLINK_IN_PATH):
                self.report.skipped.append(Skipped.of(p, Reason.SYMLINK_IN_PATH))
            else:
                reason = f"inside {parent}, which was skipped: {skip.reason}"
                self.report.skipped.append(Skipped(p, reason, skip.code))
            inside.add(p)
        return inside

    def guard_deletions(self, plan: list[Action], anc: dict[str, Ancestor]) -> None:
        deletes = sum(
            1 for a in plan
            if Kind.DELETE_LOCAL in (a.kind, a.then) or Kind.DELETE_REMOTE in (a.kind, a.then)
        )
        if deletes > MASS_DELETE_MIN and deletes * 2 > len(anc) and not self.opts.force:
            raise SafetyRefusal(
                f"this run would delete {deletes} of {len(anc)} tracked files; "
                "check both roots, then rerun with --force if that is intended"
            )


#: The fast paths of ``Pass.remote_versions`` and ``Pass.plan``; off, every path goes
#: through the plain per-file code (the tests run both ways and compare the plans).
_FAST = True


def _unchanged_remote(anc: dict[str, Ancestor], rfiles: dict[str, Entry]) -> set[str]:
    """The remote files that ``Pass.remote_versions``'s per-file test puts in
    ``remote_same``: size, mtime and permission bits as the last transfer left them,
    recorded more than ``RACY_NS`` after that mtime.

    The same test, cheaper: fields by index (a named tuple's attribute is a descriptor
    call), no other branch. This is memory-bound (~300 ns a file on a cold 100k-file
    tree), which is also why C-level ``map``/``compress`` passes lost to it: each pass
    fetches the same scattered objects again.
    """
    get, racy = anc.get, RACY_NS
    # Entry: path, kind, size, mtime_ns, mode, ino.
    # Ancestor: hash, size, mode, remote_size, remote_mtime_ns, synced_ns.
    return {
        rel for rel, e in rfiles.items()
        if (a := get(rel)) is not None and e[2] == a[3] and e[3] == a[4]
        and e[4] & 0o777 == a[2] and a[4] < a[5] - racy
    }


def _quiet(
    anc: dict[str, Ancestor], local: LocalScan, rfiles: dict[str, Entry], same: set[str]
) -> set[str]:
    """The paths of ``same`` whose host file has the ancestor's hash and permission bits:
    in sync on all three sides (``Pass.plan`` leaves them out)."""
    # In remote-listing order when that covers them all: sequential reads of the
    # listing's memory (iterating the set itself jumps around the heap, ~2x slower).
    keys: list[str] | set[str] = list(filter(same.__contains__, rfiles))
    if len(keys) != len(same):
        keys = same
    hashes, entries = local.hashes.get, local.listing.entries
    return {p for p in keys if hashes(p) == (a := anc[p])[0] and entries[p][4] & 0o777 == a[2]}


def _left_out(rfiles: dict[str, Entry], same: set[str], rv: dict[str, Version]) -> set[str]:
    """Remote files neither unchanged nor given a version this run."""
    from itertools import filterfalse

    return set(filterfalse(rv.__contains__, filterfalse(same.__contains__, rfiles)))


def _not_in(paths: Iterable[str], unchanged: set[str]) -> Iterable[str]:
    from itertools import filterfalse

    return filterfalse(unchanged.__contains__, paths)


async def run_pass(
    conduit: Conduit,
    local_root: Path,
    remote_path: str,
    opts: Options,
    plan_filter: Callable[[list[Action]], list[Action]] | None = None,
) -> Report:
    """Run one pass; see ``filesync.sync.transition`` for how the plan is carried out."""
    from filesync.sync.transition import transition

    started = time.monotonic()
    sent0, recv0 = conduit.bytes_sent, conduit.bytes_received
    # The first listing rides behind the helper's source: no round trip is waited for.
    session = await session_for(conduit, opts.log, (remote_path, opts.rule), opts.watch)
    ok = False
    try:
        remote_root = session.resolve_root(remote_path)
        # The helper walks while the state is opened and the host is walked.
        await session.prefetch_list(remote_root, opts.rule)
        state = PairState.open(
            opts.state_dir, str(local_root), conduit.identity, remote_root,
            lock_timeout=opts.lock_timeout,
        )
        try:
            p = Pass(session, state, local_root, remote_root, opts)
            try:
                anc, local, remote = await p.scan()
                p.guard_roots(anc, local.listing, remote)
                known, candidates = p.remote_versions(anc, local, remote)
                await p.fetch(candidates)
                plan = p.plan(anc, local, remote, known, candidates)
                if plan_filter is not None:
                    plan = plan_filter(plan)
                p.guard_deletions(plan, anc)
                p.report.plan = plan
                if not opts.dry_run:
                    await transition(p, anc, local, remote, plan)
                p.report.open_conflicts = list(state.conflicts().values())
                ok = True
            finally:
                shutil.rmtree(p.sink.dir, ignore_errors=True)
        finally:
            state.close()
    finally:
        if not ok:
            # A pass that failed may have left the stream mid-request: never reuse it.
            await drop_session(conduit, polite=False)
    p.report.bytes_sent = conduit.bytes_sent - sent0
    p.report.bytes_received = conduit.bytes_received - recv0
    p.report.seconds = time.monotonic() - started
    if p.report.errors:
        raise TransferFailed(p.report)
    return p.report


class TransferFailed(FilesyncError):
    """Some transfers failed; the confirmed ones are recorded, the rest retried next run."""

    def __init__(self, report: Report) -> None:
        first = report.errors[0]
        more = f" (and {len(report.errors) - 1} more)" if len(report.errors) > 1 else ""
        super().__init__(f"{first}{more}; fix the cause and rerun, nothing was half-applied")
        self.report = report


# One helper per conduit, kept between passes: a warm pass pays no helper start-up.
def recover(state: PairState, local_root: Path) -> None:
    """Finish an apply that a crash interrupted, then drop stale staging dirs."""
    if state.journal_path.exists():
        journal = Journal.load(state.journal_path)
        tree = HostTree(local_root, Path(journal.undo_dir) if journal.undo_dir else None)
        try:
            results = run_journal(tree, journal)
        finally:
            tree.close()
        commit_journal(state, journal, results)
    if state.staging.exists():
        shutil.rmtree(state.staging, ignore_errors=True)


def commit_journal(state: PairState, journal: Journal, results: list[OpResult]) -> None:
    """Record the ancestors of the ops that were done, then retire the journal."""
    done = {r.op.path for r in results if r.status == "done"}
    rows = [(r[0], Ancestor(*r[1:])) for r in journal.ancestors if r[0] in done]
    state.put_ancestors(rows)
    state.forget([p for p in journal.forget if p in done])
    state.journal_path.unlink(missing_ok=True)


__all__ = ["HashingReader", "Options", "Outcome", "Pass", "Report", "SendItem", "run_pass"]
