"""Planning a pass: scan both sides, learn the remote versions, fetch, reconcile.

Every step reads the frozen ``PassInputs`` and returns what it found; nothing is kept
in between but what the engine passes on. A path whose version is unknown this run
(unreadable, skipped, vanished while fetched) is left out of the plan entirely: absent
is never read as deleted. Most files of a large tree are unchanged on all three sides;
those are taken out first by the bulk filters of ``filesync.core.quiet``
(``unchanged_remote``, ``quiet_paths``), which hold exactly where ``decide()`` has nothing
to do, and only the rest is reconciled. A watched pass reuses the last pass's results of
those two where their inputs compare equal (``sync.memo``). A host walk the pair's seal
speaks for (``seal.host_digest``) is the ancestors' on the host side: its hashes are
theirs, the stat cache neither read nor applied.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Awaitable, Iterable, Mapping, Set
from itertools import chain, filterfalse
from operator import itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from filesync.core import deferred, offthread
from filesync.core.exclude import ExcludeRule
from filesync.core.lineage import Lineage
from filesync.core.model import Entry, Listing, Skipped
from filesync.core.quiet import quiet_paths, unchanged_remote
from filesync.core.reconcile import Direction, Kind, Version, dirs_of, reconcile
from filesync.core.record import Record
from filesync.errors import FilesyncError, SafetyRefusal
from filesync.host.scan import (
    RACY_NS,
    CacheRow,
    LocalScan,
    hash_needed,
    list_local,
    scan_cached,
)
from filesync.host.state import Ancestor, PairState
from filesync.sync import carry as carrying
from filesync.sync.carry import AllBut, Overlaid
from filesync.sync.inputs import PassInputs, Planned, Scans
from filesync.sync.memo import CachedScan
from filesync.tree.wire import Reason

if TYPE_CHECKING:
    from filesync.host.watched import WatchedTrees

#: A stat-cache row's hash (rows are ``(size, mtime_ns, ino, hash)``).
_ROW_HASH = itemgetter(3)


class RemoteVersions(NamedTuple):
    """The remote versions known without reading the remote, and what must be fetched.

    A named tuple, and ``Walk`` a ``Record``, not dataclasses: every run imports this
    module, and creating a dataclass costs ~1 ms of CPU (``filesync.core.record``)."""

    #: from the remote hash cache: (size, mtime) still as when the hash was taken
    known: Mapping[str, Version]
    #: unchanged since the last transfer: their version is the ancestor's
    same: Set[str]
    fetch: list[Entry]
    skipped: tuple[Skipped, ...]


def require_local_source(direction: Direction, local_root: Path) -> None:
    """A push or sync reads the host tree: a root that does not exist is a mistake (a
    typo, an unmounted disk), never an empty tree to sync. A pull creates it."""
    if direction is not Direction.PULL and not local_root.exists():
        raise FilesyncError(
            f"local root {local_root} does not exist, so there is nothing to "
            f"{direction.value}; check the path (or create the directory, or pull into it)"
        )


def require_remote_source(inputs: PassInputs, scans: Scans) -> None:
    """A first pull from a remote root that does not exist is a mistake (a typo), not an
    empty tree. Once the pair has state, the root guard speaks instead (exit 3)."""
    if inputs.opts.direction is Direction.PULL and not scans.remote.exists \
            and not scans.ancestors:
        raise FilesyncError(
            f"remote root {inputs.remote_root} does not exist, so there is nothing to pull; "
            "check the remote path (push creates it)"
        )


class Walk(Record):
    """A host walk of ``local_root`` under ``rule`` (through ``trees``, the owner's watched
    trees, if any) under way in a thread (``start_walk``), taken by ``scan``."""

    __slots__ = ("listing", "local_root", "rule", "started_ns", "thread", "trees")
    _fields = ("started_ns", "listing", "local_root", "rule", "trees", "thread")

    def __init__(self, started_ns: int, listing: asyncio.Future[Listing], local_root: Path,
                 rule: ExcludeRule, trees: WatchedTrees | None,
                 thread: concurrent.futures.Future[Listing]) -> None:
        self.started_ns = started_ns
        self.listing = listing
        self.local_root = local_root
        self.rule = rule
        self.trees = trees
        #: the thread's own future, done only once the thread is: ``listing`` is cancelled
        #: at once when a task awaiting it is, while its thread walks on
        self.thread = thread

    def fits(self, local_root: Path, rule: ExcludeRule, trees: WatchedTrees | None) -> bool:
        """Whether this is the walk a pass of ``local_root`` under ``rule`` would start."""
        return self.local_root == local_root and self.rule == rule and self.trees is trees

    async def join(self) -> None:
        """Wait until the walk's thread is done, whatever became of ``listing``, even if
        this task is cancelled meanwhile (``wait_out``): whoever started a walk joins it
        before it returns, so no walk outlives the pass or run that started it."""
        done = asyncio.wrap_future(self.thread)
        await wait_out(done)
        if not done.cancelled():
            done.exception()  # the walk's failure is its reader's to raise, or nobody's


def start_walk(local_root: Path, rule: ExcludeRule, trees: WatchedTrees | None) -> Walk:
    """Start the host walk (stat only) in a thread now, so that it overlaps ssh's login,
    the helper's start and its listing: the runner starts a job's first walk with the
    job, ``run_pass`` the walk of a pass it was given none for before the helper."""
    started_ns = time.time_ns()
    # Submitted at once (a task would start the thread only at the first await).
    thread = offthread.EXECUTOR.submit(list_local, local_root, rule, trees)
    listing = asyncio.wrap_future(thread)
    # A pass that fails before ``scan`` leaves it unread: that is no error of its own.
    listing.add_done_callback(lambda f: f.cancelled() or f.exception())
    return Walk(started_ns, listing, local_root, rule, trees, thread)


async def recover_host(inputs: PassInputs, walk: Walk | None) -> Walk | None:
    """Finish any interrupted apply (``host.journal.recover``) before anything is listed.

    Returns the host walk the pass goes on with: ``walk`` (started by ``start_walk``), or a
    new one when the recovery changed the host tree under it or none was started; None for
    a fan-out's pass, whose walks are shared (``HostScans``, told of the recovery)."""
    state, shared = inputs.state, inputs.host_scans
    if state.journal_path.exists():
        if shared is not None:
            shared.changed(inputs.local_root)  # recover is about to change the host tree
        if walk is not None:
            await walk.join()  # walked before the recovery: stale
            walk = None
    if state.journal_path.exists() or state.staging.exists():
        # Loaded here: the journal's apply code loads only when there is something to
        # recover or clear, never on a clean run.
        deferred.load("filesync.host.journal").recover(state, inputs.local_root)
    if shared is not None:
        return None
    return walk if walk is not None else start_walk(
        inputs.local_root, inputs.opts.rule, inputs.trees)


async def scan(inputs: PassInputs, walk: Walk | None = None,
               remote: Listing | None = None, sealed_host: str | None = None) -> Scans:
    """List both sides and hash what will be compared (after ``recover_host``).

    ``walk``: the host walk to use (one is started when None, unless the pass shares the
    walks of a fan-out); ``remote``: the remote listing, when the seal step already read
    it (``sync.seal.check``); ``sealed_host``: the host walk digest of the pair's seal
    when the seal may speak for this pass's host side (``sync.seal.host_digest``)."""
    state, opts = inputs.state, inputs.opts
    shared = inputs.host_scans
    # The host walk (stat only) runs in a thread while the state is read and the
    # remote lists; the stat cache is applied to it afterwards. A fan-out's passes share
    # one walk of the root (``HostScans``) instead.
    walking: Awaitable[Listing | tuple[Listing, int]]
    if shared is not None:
        started_ns = time.time_ns()
        walking = shared.listing(inputs.local_root, opts.rule, inputs.trees, started_ns)
    else:
        if walk is None:
            walk = start_walk(inputs.local_root, opts.rule, inputs.trees)
        started_ns, walking = walk.started_ns, walk.listing
    # The state's tables are read in a thread too, while this task waits for the remote
    # listing: a large pair's rows would otherwise come before it. Not the stat cache
    # when the seal speaks for the host walk (``seal.host_digest``).
    reading = offthread.start(_read_state, state,
                              None if walk is None or sealed_host is None else walk.thread,
                              sealed_host)
    try:
        if remote is None:
            remote = await inputs.endpoint.list_tree(inputs.remote_root, opts.rule)
    finally:
        try:
            await wait_out(reading)
            if not reading.cancelled():
                reading.exception()  # raised below, or superseded by what is unwinding
        finally:
            listed = await walking
    anc, old_cache, state_lineage = reading.result()
    if isinstance(listed, tuple):  # shared: judged against the shared walk's start
        listed, started_ns = listed
    carry = carrying.begin(
        inputs.memo,
        listed.lineage, remote.lineage, state_lineage)
    local = None
    if old_cache is None:  # the walk is the sealed one
        local = _sealed_scan(listed, anc, started_ns) if carry is None else None
        old_cache = state.local_cache() if local is None else dict(local.cache_rows)
    if local is None:
        local = (_scan_cached(inputs, listed, old_cache, started_ns) if carry is None
                 else _carried_scan(carry, listed, old_cache, started_ns))
    # (No unsafe name is in ``remote``: the endpoint contract keeps them in ``skipped``,
    # and ``tests/endpoint/test_contract.py`` holds both endpoints to it.)
    rfiles = remote.files()
    # Only files that will be compared with something are read now.
    (hash_needed if shared is None else shared.hash_needed)(
        local, inputs.local_root, lambda rel: rel in anc or rel in rfiles)
    return Scans(anc, local, remote, old_cache, remote.excluded + local.listing.excluded,
                 (*local.listing.skipped, *remote.skipped), carry)


def _read_state(state: PairState, walking: concurrent.futures.Future[Listing] | None,
                sealed_host: str | None
                ) -> tuple[dict[str, Ancestor], dict[str, CacheRow] | None, Lineage | None]:
    """The ancestors, the stat cache (None, unread, when the host walk ``walking`` has the
    digest ``sealed_host``: see ``seal.host_digest``) and the state's lineage."""
    ancestors = state.ancestors()
    # (A walk that failed is raised by ``scan``, its reader; the cache is read here.)
    sealed = walking is not None and walking.exception() is None \
        and walking.result().digest == sealed_host
    return ancestors, None if sealed else state.local_cache(), state.lineage()


def _sealed_scan(listed: Listing, anc: Mapping[str, Ancestor],
                 started_ns: int) -> LocalScan | None:
    """What ``scan_cached`` and ``hash_needed`` would find for a host walk the seal speaks
    for (``seal.host_digest``): each file's ancestor hash, from a stat cache row of its
    stat and that hash; none is read. None where the ancestors are not exactly the walk's
    files (never, for a walk the seal speaks for): the full scan is run then."""
    entries = listed.entries
    if entries.keys() != anc.keys():
        return None
    scan = LocalScan(listed, started_ns=started_ns)
    scan.hashes = {p: anc[p].hash for p in entries}
    scan.cache_rows = {p: (e.size, e.mtime_ns, e.ino, anc[p].hash)
                       for p, e in entries.items()}
    return scan


def _carried_scan(carry: carrying.Carry, listed: Listing,
                  cache: dict[str, CacheRow], started_ns: int) -> LocalScan:
    """``scan_cached``, run only on the paths whose inputs changed since the carried
    pass (all of them when nothing is carried)."""
    kept = carry.carried
    if kept is None:
        scan = scan_cached(listed, cache, started_ns)
    else:
        entries = listed.entries
        changed = {p: entries[p] for p in carry.recompute if p in entries}
        fresh = scan_cached(Listing(listed.root, True, changed), cache, started_ns) \
            if changed else LocalScan(listed)
        # The last pass's hits are the stat cache's rows as the state holds them now,
        # but where a path's inputs changed since (the state's series names every row
        # it wrote): read through from the cache, so a watch keeps no copy of them and
        # a single edit makes none.
        hits: Overlaid[CacheRow, str] = Overlaid(cache, _ROW_HASH)
        rows: Overlaid[CacheRow, CacheRow] = Overlaid(cache, _as_is)
        scan = LocalScan(listed, hits, rows, [], started_ns)
        # The last pass's misses were read by it (or left unread): their hashes and rows
        # are dropped, and they stay misses unless their inputs changed.
        misses = set(kept.misses)
        for p in chain(carry.recompute, kept.misses):
            scan.hashes.pop(p, None)
            scan.cache_rows.pop(p, None)
        misses.difference_update(carry.recompute)
        scan.hashes.update(fresh.hashes)
        scan.cache_rows.update(fresh.cache_rows)
        misses.update(fresh.misses)
        scan.misses = sorted(misses)
    carry.scanned(scan.misses)
    return scan


def _as_is(row: CacheRow) -> CacheRow:
    return row


def _carried_same(carry: carrying.Carry, anc: Mapping[str, Ancestor],
                  rfiles: dict[str, Entry]) -> Set[str]:
    """``unchanged_remote``, run only on the remote files whose inputs changed since
    the carried pass (all of them when nothing is carried)."""
    kept = carry.carried
    if kept is None:
        same = unchanged_remote(anc, rfiles, RACY_NS)
        carry.compared(set(filterfalse(same.__contains__, rfiles)))
        return same
    changed = {p: rfiles[p] for p in carry.recompute if p in rfiles}
    fresh = unchanged_remote(anc, changed, RACY_NS) if changed else set()
    rest = kept.rest
    rest.difference_update(carry.recompute)
    rest.update(p for p in changed if p not in fresh)
    # ``same`` is not carried (``memo.Carried``): it is every remote file outside
    # ``rest``, read through (``carry.AllBut``) rather than built.
    carry.compared(rest)
    return AllBut(rfiles, rest)


def _carried_quiet(carry: carrying.Carry, anc: Mapping[str, Ancestor], local: LocalScan,
                   rfiles: dict[str, Entry], same: Set[str]) -> tuple[Set[str], set[str]]:
    """``quiet_paths``, and the paths of the ancestors, host hashes and ``same`` that are
    not quiet, run only on the paths whose inputs changed since the carried pass."""
    kept = carry.carried
    hashes = local.hashes
    quiet: Set[str]
    if kept is None:
        quiet = quiet_paths(anc, hashes, local.listing.entries, rfiles, same)
        loud: set[str] = set()
        for side in (anc.keys(), hashes.keys(), same):
            if len(side) != len(quiet):
                loud |= side - quiet
    else:
        again = carry.recompute
        changed = {p: rfiles[p] for p in again if p in rfiles}
        fresh = (quiet_paths(anc, hashes, local.listing.entries, changed,
                             set(filter(same.__contains__, again)))
                 if changed else set())
        loud = kept.loud
        loud.difference_update(again)
        loud.update(p for p in again
                    if p not in fresh and (p in anc or p in hashes or p in same))
        # ``quiet`` is not carried (``memo.Carried``): it is every ancestor outside
        # ``loud``, since quiet paths all have one and an ancestor that is not quiet is
        # loud; read through (``carry.AllBut``) rather than built.
        quiet = AllBut(anc, loud)
    carry.planned(loud)
    return quiet, loud


async def wait_out(fut: asyncio.Future[Any]) -> None:
    """Wait until ``fut``, a thread's work, is done, even if this task is cancelled
    meanwhile (the cancellation is raised once it is done): the thread cannot be stopped,
    and the state database it reads is closed as the pass unwinds."""
    cancelled = False
    while not fut.done():
        try:
            await asyncio.wait([fut])
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError


def _scan_cached(inputs: PassInputs, listed: Listing,
                 cache: dict[str, tuple[int, int, int, str]], started_ns: int) -> LocalScan:
    """``scan_cached``, or for a watched pass with the listing and stat cache of the last
    one its result again (``sync.memo``), as a new scan its user may change."""
    memo = inputs.memo
    kept = memo.scan.get(listed.entries, cache) if memo is not None else None
    if kept is not None:
        scan = LocalScan(listed, started_ns=started_ns)
        scan.hashes, scan.misses = dict(kept.hashes), list(kept.misses)
        scan.cache_rows = dict(kept.cache_rows)
        return scan
    scan = scan_cached(listed, cache, started_ns)
    if memo is not None:
        memo.scan.put(CachedScan(dict(scan.hashes), tuple(scan.misses),
                                 dict(scan.cache_rows)), listed.entries, cache)
    return scan


def remote_versions(inputs: PassInputs, scans: Scans) -> RemoteVersions:
    """Versions known without reading the remote, and the candidates to fetch."""
    opts = inputs.opts
    anc, rfiles = scans.ancestors, scans.remote.files()
    cache = inputs.state.remote_cache()
    known: dict[str, Version] = {}
    fetch: list[Entry] = []
    skipped: list[Skipped] = []
    # Most files of a large tree are unchanged: the bulk filter takes those out, so
    # that the loop below sees only the rest. A watched pass takes over what the last
    # one found for every path whose inputs did not change (``sync.carry``), or, without
    # lineages, reuses its result when its ancestors and listing equal the last one's.
    carry = scans.carry
    memo = inputs.memo if carry is None else None
    kept = memo.same.get(anc, rfiles) if memo is not None else None
    same: Set[str]
    if carry is not None:
        same = _carried_same(carry, anc, rfiles)
    else:
        same = kept if kept is not None else unchanged_remote(anc, rfiles, RACY_NS)
    # (``same`` holds only listed paths: as many means all of them.)
    rest: Iterable[tuple[str, Entry]] = (
        ((rel, rfiles[rel]) for rel in carry.rest) if carry is not None
        else rfiles.items() if not same
        else () if len(same) == len(rfiles)
        else ((rel, rfiles[rel]) for rel in filterfalse(same.__contains__, rfiles))
    )
    local_entries = scans.local.listing.entries
    host_dirs: set[str] | None = None

    def in_the_way(rel: str) -> bool:
        """A remote file where the host has a directory, or under a host file: it is
        part of a type conflict, which a push saves before it replaces it."""
        nonlocal host_dirs
        parent = rel.rpartition("/")[0]
        while parent:
            if parent in local_entries:
                return True
            parent = parent.rpartition("/")[0]
        if host_dirs is None:  # only built when a push meets a remote-only file
            host_dirs = dirs_of(local_entries)
        return rel in host_dirs

    for rel, e in rest:
        mode = e.mode & 0o777
        if rel in cache and cache[rel][:2] == (e.size, e.mtime_ns):
            known[rel] = Version(cache[rel][2], mode)
        elif e.size > opts.max_file_size and opts.direction is not Direction.PUSH:
            skipped.append(Skipped.of(rel, Reason.TOO_LARGE))
            if opts.warn is not None:
                opts.warn(f"{rel} left out: {e.size} bytes is more than --max-file-size "
                          f"{opts.max_file_size}; raise --max-file-size to fetch it")
        elif opts.direction is Direction.PUSH and rel not in anc and rel not in local_entries \
                and not in_the_way(rel):
            continue  # remote-only and never pushed: push leaves it alone
        else:
            fetch.append(e)
    if memo is not None and kept is None:
        memo.same.put(frozenset(same), anc, rfiles)
    return RemoteVersions(known, same, fetch, tuple(skipped))


async def fetch(inputs: PassInputs, entries: list[Entry]) -> None:
    """Stage ``entries`` (a pull or sync is refused whole when over ``--max-pull-bytes``;
    a push fetches only what it must keep, never limited)."""
    opts, sink = inputs.opts, inputs.sink
    total = sum(e.size for e in entries)
    if total > opts.max_pull_bytes and opts.direction is not Direction.PUSH and not opts.force:
        raise SafetyRefusal(
            f"this run would fetch {total} bytes, more than --max-pull-bytes "
            f"{opts.max_pull_bytes}; raise the limit or exclude the large files"
        )
    if not entries:
        return
    bar = opts.progress
    if bar is not None:
        bar.begin("fetch", total)
        sink.progress = bar.advance
    try:
        await inputs.endpoint.fetch(inputs.remote_root, [e.path for e in entries], sink)
    finally:
        if bar is not None:
            bar.end()
            sink.progress = None


def plan(inputs: PassInputs, scans: Scans, versions: RemoteVersions) -> Planned:
    """Reconcile every path that is not quietly in sync on all three sides."""
    staged, failed = inputs.sink.staged, inputs.sink.failed_paths
    skipped = [*scans.skipped, *versions.skipped]
    rv = dict(versions.known)
    for e in versions.fetch:
        s = staged.get(e.path)
        if s is None:
            reason = failed.get(e.path, "vanished")
            skipped.append(Skipped(e.path, f"remote: {reason}; retried next run"))
            continue
        rv[e.path] = Version(s.hash, s.mode)
    anc, local = scans.ancestors, scans.local
    entries, hashes = local.listing.entries, local.hashes
    same, rfiles = versions.same, scans.remote.files()
    carry = scans.carry
    memo = inputs.memo if carry is None else None
    kept = memo.quiet.get(same, anc, hashes, entries) if memo is not None else None
    quiet: Set[str]
    loud: set[str] | None = None
    if carry is not None:
        quiet, loud = _carried_quiet(carry, anc, local, rfiles, same)
    elif kept is not None:
        quiet = kept
    else:
        quiet = quiet_paths(anc, hashes, entries, rfiles, same)
        if memo is not None:
            memo.quiet.put(frozenset(quiet), same, anc, hashes, entries)
    # A path whose version is unknown this run is left out entirely; so is all
    # under a skipped dir (unreadable, or now a symlink): absent is not deleted.
    unknown = {s.path for s in skipped}
    # Remote files neither unchanged nor with a version: skipped or left alone.
    unknown |= (_left_out(rfiles, same, rv) if carry is None
                else set(filterfalse(rv.__contains__, carry.rest)))
    unknown |= _under_skipped(skipped, anc.keys(), hashes.keys(), rv.keys())
    # Every path any side knows, but the quiet ones: ``quiet`` is a subset of
    # ``same``, ``anc`` and ``hashes`` (``quiet_paths`` only keeps paths found in all
    # three), so a side holding exactly as many paths holds nothing else; a no-op
    # pass over a large tree then builds no large set here.
    paths: set[str] = set()
    if loud is not None:
        paths |= loud
    else:
        for side in (anc.keys(), hashes.keys(), same):
            if len(side) != len(quiet):
                paths |= side - quiet
    # (Both by membership tests of ``quiet`` and ``same``: a carried pass's are views
    # of the whole tree, ``carry.AllBut``, which only these tests read in O(1).)
    paths.update(filterfalse(quiet.__contains__, rv))
    paths -= unknown
    for p in filter(same.__contains__, paths):
        rv[p] = Version(anc[p].hash, anc[p].mode)
    lv = {p: Version(hashes[p], entries[p].mode & 0o777) for p in paths if p in hashes}
    av = {p: Version(anc[p].hash, anc[p].mode) for p in paths if p in anc}
    rv = {p: v for p, v in rv.items() if p in paths}
    actions = reconcile(av, lv, rv, inputs.opts.direction)
    conflicts = {a.path for a in actions if a.kind is Kind.CONFLICT}
    in_sync = not paths and not unknown and not skipped \
        and len(quiet) == len(anc) == len(rfiles) == len(entries)
    all_acted = not unknown and not skipped and {a.path for a in actions} == paths
    return Planned(actions, lv, rv, conflicts, tuple(skipped), in_sync, all_acted)


def _under_skipped(skipped: list[Skipped], *sides: Iterable[str]) -> set[str]:
    """Paths of ``sides`` inside a skipped dir, each appended to ``skipped``: they are
    neither synced nor deleted. The sides are only joined when something was skipped."""
    why = {s.path.rstrip("/"): s for s in skipped}
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
            skipped.append(Skipped.of(p, Reason.SYMLINK_IN_PATH))
        else:
            reason = f"inside {parent}, which was skipped: {skip.reason}"
            skipped.append(Skipped(p, reason, skip.code))
        inside.add(p)
    return inside


def _left_out(rfiles: dict[str, Entry], same: Set[str], rv: dict[str, Version]) -> set[str]:
    """Remote files neither unchanged nor given a version this run."""
    return set(filterfalse(rv.__contains__, filterfalse(same.__contains__, rfiles)))


__all__ = ["RemoteVersions", "Walk", "fetch", "plan", "recover_host", "remote_versions",
           "require_local_source", "require_remote_source", "scan", "start_walk"]
