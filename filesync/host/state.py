"""Persistent per-pair state in SQLite: the ancestor, caches, conflicts, the seal, the lock.

One directory per (local root, remote identity, remote root) pair under the state
dir, holding ``state.db``, ``lock``, ``staging/`` (only while a run stages, or after
one was interrupted), ``conflicts/`` and ``undo/``.
The ancestor row of a path is written only after the transfer it describes was
confirmed, so a crash at any point leaves a state the next run can reconcile from.
The seal (``Seal``) is dropped by every write of the state: it only ever describes the
state as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import NamedTuple

import xxhash

from filesync.core.lineage import Lineage, Series
from filesync.errors import FilesyncError, LockBusy
from filesync.tree.bounded import Bounded
from filesync.tree.dirfd import create_file, make_dirs
from filesync.tree.paths import expand_user

_SCHEMA = """
CREATE TABLE IF NOT EXISTS ancestor(
    path TEXT PRIMARY KEY, hash TEXT NOT NULL, size INTEGER NOT NULL, mode INTEGER NOT NULL,
    remote_size INTEGER NOT NULL, remote_mtime_ns INTEGER NOT NULL, synced_ns INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS local_cache(
    path TEXT PRIMARY KEY, size INTEGER, mtime_ns INTEGER, ino INTEGER, hash TEXT);
CREATE TABLE IF NOT EXISTS remote_cache(
    path TEXT PRIMARY KEY, size INTEGER, mtime_ns INTEGER, hash TEXT);
CREATE TABLE IF NOT EXISTS conflicts(
    path TEXT PRIMARY KEY, local_hash TEXT, remote_hash TEXT, saved_to TEXT,
    created_ns INTEGER);
CREATE TABLE IF NOT EXISTS seal(
    one INTEGER PRIMARY KEY CHECK (one = 1), fingerprint TEXT NOT NULL,
    host TEXT NOT NULL, remote TEXT NOT NULL, excluded INTEGER NOT NULL);
"""


class Ancestor(NamedTuple):
    """What both sides held after the last confirmed transfer of one path.

    A named tuple, not a dataclass: a 100k-file tree loads 100k of these per run.
    """

    hash: str
    size: int
    mode: int
    remote_size: int
    remote_mtime_ns: int
    synced_ns: int


class Seal(NamedTuple):
    """A pass found the pair in sync on all three sides, from these two listings.

    ``host`` and ``remote`` are the listings' digests (``Listing.digest``),
    ``fingerprint`` what else the pass's decisions depended on (``sync.seal``),
    ``excluded`` the excluded count it reported. Any later write of the state drops it.
    """

    fingerprint: str
    host: str
    remote: str
    excluded: int


class ConflictRecord(NamedTuple):
    """An open conflict: the two sides' hashes, and where the remote version was saved."""

    path: str
    local_hash: str | None
    remote_hash: str | None
    saved_to: str | None


class _Pooled:
    """An open state database kept between runs of one process, with what it last read.

    A warm pass (the library API on an open connection) then neither reconnects nor
    re-reads the ancestor and cache tables: the copies are kept in step with every
    write made through ``PairState``, and dropped as soon as SQLite's ``data_version``
    says another connection (another process, a test, ``sqlite3`` by hand) wrote.

    A plain class (and ``ConflictRecord`` a named tuple), not a dataclass: every run
    imports this module, and creating a dataclass compiles its methods from source,
    ~0.6 ms of CPU each.
    """

    __slots__ = (
        "ancestors",
        "conn",
        "data_version",
        "file_id",
        "key",
        "local",
        "pid",
        "remote",
        "series",
    )

    def __init__(self, key: str, conn: sqlite3.Connection, file_id: tuple[int, int],
                 pid: int, data_version: int) -> None:
        self.key = key
        self.conn = conn
        self.file_id = file_id
        self.pid = pid
        self.data_version = data_version
        self.ancestors: dict[str, Ancestor] | None = None
        self.local: dict[str, tuple[int, int, int, str]] | None = None
        self.remote: dict[str, tuple[int, int, str]] | None = None
        #: the paths whose ancestor or stat-cache row this process wrote, while the
        #: copies are kept (``filesync.core.lineage``); a new series whenever they are
        #: dropped
        self.series = Series()

    def forget_reads(self) -> None:
        self.ancestors = self.local = self.remote = None
        self.series = Series()


#: Idle databases kept open at most (each holds three descriptors: db, wal, shm).
POOL_MAX = 4


class StatePool:
    """Idle state databases of one owner (``filesync.sync.warm.WarmState``), by path, with
    what each last read: the owner's next pass of a pair neither reconnects nor re-reads.

    An entry is taken out while a ``PairState`` uses it, so two states never share one
    (the pair lock already keeps them apart); beyond ``max_open`` the oldest is closed.
    ``close`` closes every idle database (SQLite checkpoints its WAL on the last close).
    """

    def __init__(self, max_open: int = POOL_MAX) -> None:
        self._idle: Bounded[str, _Pooled] = Bounded(max_open, lambda old: _close_own(old))

    def __len__(self) -> int:
        return len(self._idle)

    def take(self, path: Path) -> _Pooled | None:
        """The idle connection to ``path`` if it is still that file, with its reads if
        valid."""
        pooled = self._idle.pop(str(path))
        if pooled is None:
            return None
        if pooled.pid != os.getpid():
            return None  # inherited over fork: never used (nor closed) in the child
        if _file_id(path) != pooled.file_id:
            pooled.conn.close()  # the state dir was removed or replaced meanwhile
            return None
        version = _data_version(pooled.conn)
        if version != pooled.data_version:
            pooled.forget_reads()
            pooled.data_version = version
        return pooled

    def give_back(self, pooled: _Pooled) -> None:
        self._idle.put(pooled.key, pooled)

    def close(self) -> None:
        for pooled in self._idle.drain():
            _close_own(pooled)


def _data_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA data_version").fetchone()[0])


def _file_id(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _close_own(pooled: _Pooled) -> None:
    if pooled.pid == os.getpid():  # one inherited over fork is the parent's to close
        with contextlib.suppress(sqlite3.Error):
            pooled.conn.close()


def default_state_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$FILESYNC_STATE_DIR``, else ``$XDG_STATE_HOME/filesync``, else ``~/.local/state``,
    read from ``env`` (None: the process's environment)."""
    values = os.environ if env is None else env
    explicit = values.get("FILESYNC_STATE_DIR")
    if explicit:
        return Path(expand_user(explicit, env))
    xdg = values.get("XDG_STATE_HOME") or expand_user("~/.local/state", env)
    return Path(xdg) / "filesync"


def pair_key(local_root: str, remote_identity: str, remote_root: str) -> str:
    """A stable directory name for one pair."""
    # JSON keeps the three fields apart whatever characters they hold.
    raw = json.dumps([local_root, remote_identity, remote_root]).encode(
        "utf-8", "surrogateescape"
    )
    return xxhash.xxh3_64_hexdigest(raw)


class PairState:
    """The state of one pair, held under its lock for the lifetime of a run."""

    def __init__(self, directory: Path, pool: StatePool | None = None) -> None:
        self.dir = directory
        self.staging = directory / "staging"
        self.conflicts_dir = directory / "conflicts"
        self.undo_dir = directory / "undo"
        self.journal_path = directory / "journal.json"
        self._lock_fd = -1
        self.db: sqlite3.Connection | None = None
        self._mem: _Pooled | None = None
        #: where the database goes back to on close (None: closed, nothing kept)
        self._pool = pool
        self._keep = pool is not None
        #: the umask of what this pass creates on the host (see ``open``)
        self.umask: int | None = None

    @classmethod
    def open(
        cls,
        state_dir: Path,
        local_root: str,
        remote_identity: str,
        remote_root: str,
        *,
        lock_timeout: float = 0.0,
        pool: StatePool | None = None,
        lock_option: str = "pass --lock-timeout SECONDS",
        umask: int | None = None,
    ) -> PairState:
        """Open (creating) the pair's state and take its lock, or raise ``LockBusy``.

        ``pool``: where the database goes back to on close, its tables read (and written)
        kept in memory for the pool owner's next pass of the pair (see ``_Pooled``); None
        (a one-shot run, which would pay ~30 MB for a 100k-file pair's copies it never
        uses) closes it and keeps nothing. ``umask``: what the directories and files it
        creates (and the host tree's, ``umask`` of the pass) are made with, exactly; None:
        the process's umask.
        """
        directory = state_dir / "pairs" / pair_key(local_root, remote_identity, remote_root)
        try:
            make_dirs(directory, umask, 0o700)
        except OSError as exc:
            raise FilesyncError(
                f"cannot create state dir {directory}: {exc.strerror}; "
                "pass --state-dir or set FILESYNC_STATE_DIR to a writable dir"
            ) from exc
        state = cls(directory, pool)
        state.umask = umask
        try:
            state._lock(lock_timeout, lock_option)
            if umask is not None:
                # sqlite makes a database 0o644 less the process's umask (its WAL files
                # take the database's mode), write_text 0o666 less it: made here instead.
                create_file(directory / "state.db", 0o644, umask)
                create_file(directory / "pair.json", 0o666, umask)
            state._connect()
            info = {"local": local_root, "remote": remote_identity, "remote_root": remote_root}
            (directory / "pair.json").write_text(json.dumps(info, indent=1), encoding="utf-8")
        except BaseException:
            state.close()  # a failed open (disk full) must not keep the pair locked
            raise
        return state

    def _lock(self, timeout: float, option: str) -> None:
        fd = os.open(self.dir / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                    os.close(fd)
                    raise LockBusy(
                        f"another filesync run (pid {holder}) is syncing this pair; "
                        f"wait for it to finish or {option}"
                    ) from None
                time.sleep(0.05)
        self._lock_fd = fd  # held from here on: close() releases it whatever fails next
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)

    def _connect(self) -> None:
        path = self.dir / "state.db"
        pooled = self._pool.take(path) if self._pool is not None else None
        if pooled is None:
            # Usable from whichever thread runs the next pass: one user at a time.
            db = sqlite3.connect(path, isolation_level=None, timeout=30,
                                 check_same_thread=False)
            try:
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=NORMAL")
                db.executescript(_SCHEMA)
                file_id = _file_id(path)
                if file_id is None:
                    raise FilesyncError(f"state database {path} vanished while opened")
                pooled = _Pooled(str(path), db, file_id, os.getpid(), _data_version(db))
            except BaseException:
                db.close()
                raise
        self.db = pooled.conn
        self._mem = pooled

    def close(self) -> None:
        """Release the database (back to the pool, if any, open for the next run) and the
        lock.

        Safe to call twice.
        """
        if self.db is not None:
            db, pooled = self.db, self._mem
            self.db = self._mem = None
            if self._pool is not None and pooled is not None and not db.in_transaction:
                # An idle connection keeps no page cache (up to 2 MB of a large pair's
                # pages): the next pass reads what it needs again.
                with contextlib.suppress(sqlite3.Error):
                    db.execute("PRAGMA shrink_memory")
                self._pool.give_back(pooled)
            else:
                db.close()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def drop_staging_if_empty(self) -> None:
        """Remove ``staging/`` once a run emptied it (its own run dir removed), so that a
        clean run leaves nothing for the next run's recovery (``plan.recover_host``) to
        clear: that recovery loads the journal code whenever ``staging/`` exists.

        ``staging/`` is this pair's, and the pair's lock (held by the caller) keeps any
        other run out of it: what is still in it is a crashed run's, left for the
        recovery (a non-empty dir is never removed). A clean-up never fails the run: a
        dir it cannot remove is the next recovery's to clear."""
        with contextlib.suppress(OSError):
            os.rmdir(self.staging)

    @property
    def conn(self) -> sqlite3.Connection:
        assert self.db is not None, "state is closed"
        return self.db

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One atomic write: all of it lands, or none of it.

        What it writes is not known here: the kept copies of the tables are dropped.
        """
        with self._write() as conn:
            if self._mem is not None:
                self._mem.forget_reads()
            yield conn

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """A transaction of this class's own writers, which update the kept copies
        themselves once it committed; a failed one drops them."""
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Whatever this writes, the seal no longer describes the state.
            conn.execute("DELETE FROM seal")
            yield conn
            conn.execute("COMMIT")
        except BaseException:
            if self._mem is not None:
                self._mem.forget_reads()
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def lineage(self) -> Lineage | None:
        """The version of the kept ancestor and stat-cache copies, as last read or
        written; None when they are not kept (nothing is known about their changes)."""
        mem = self._mem
        if mem is None or mem.ancestors is None or mem.local is None:
            return None
        return mem.series.now()

    def _wrote(self, paths: Iterable[str]) -> None:
        if self._mem is not None:
            self._mem.series.advance(paths)

    # -- ancestor ---------------------------------------------------------------

    def ancestors(self) -> dict[str, Ancestor]:
        conn, mem = self.conn, self._mem
        if mem is not None and mem.ancestors is not None:
            return dict(mem.ancestors)
        rows = conn.execute(
            "SELECT path, hash, size, mode, remote_size, remote_mtime_ns, synced_ns FROM ancestor"
        ).fetchall()
        make = Ancestor._make
        result = {r[0]: make(r[1:]) for r in rows}
        if mem is not None and self._keep:
            mem.ancestors = result
            return dict(result)
        return result

    def put_ancestors(self, rows: Iterable[tuple[str, Ancestor]]) -> None:
        rows = list(rows)
        with self._write() as conn:
            # A generator, not a list of parameter tuples: a batch's rows are not copied.
            conn.executemany("INSERT OR REPLACE INTO ancestor VALUES (?,?,?,?,?,?,?)",
                             ((p, *a) for p, a in rows))
        kept = self._mem.ancestors if self._mem is not None else None
        if kept is not None:
            kept.update(rows)
        self._wrote(p for p, _a in rows)

    def forget(self, paths: Iterable[str]) -> None:
        paths = list(paths)
        with self._write() as conn:
            conn.executemany("DELETE FROM ancestor WHERE path=?", [(p,) for p in paths])
        kept = self._mem.ancestors if self._mem is not None else None
        if kept is not None:
            for p in paths:
                kept.pop(p, None)
        self._wrote(paths)

    # -- caches -----------------------------------------------------------------

    def local_cache(self) -> dict[str, tuple[int, int, int, str]]:
        conn, mem = self.conn, self._mem
        if mem is not None and mem.local is not None:
            return dict(mem.local)
        rows = conn.execute("SELECT path, size, mtime_ns, ino, hash FROM local_cache")
        result: dict[str, tuple[int, int, int, str]] = {r[0]: r[1:] for r in rows.fetchall()}
        if mem is not None and self._keep:
            mem.local = result
            return dict(result)
        return result

    def replace_local_cache(self, rows: Iterable[tuple[str, int, int, int, str]]) -> None:
        rows = list(rows)
        with self._write() as conn:
            conn.execute("DELETE FROM local_cache")
            conn.executemany("INSERT INTO local_cache VALUES (?,?,?,?,?)", rows)
        if self._mem is not None:
            self._mem.series = Series()  # every row: nothing to name path by path
            if self._keep:
                self._mem.local = {r[0]: (r[1], r[2], r[3], r[4]) for r in rows}

    def update_local_cache(
        self, upserts: Mapping[str, tuple[int, int, int, str]], deletes: Iterable[str]
    ) -> None:
        """Write only what changed (``path -> (size, mtime_ns, ino, hash)``): a no-op run
        of 100k files writes nothing. The rows themselves are kept, not copies."""
        gone = [(p,) for p in deletes]
        if not upserts and not gone:
            return
        with self._write() as conn:
            conn.executemany("DELETE FROM local_cache WHERE path=?", gone)
            conn.executemany("INSERT OR REPLACE INTO local_cache VALUES (?,?,?,?,?)",
                             ((p, *r) for p, r in upserts.items()))
        kept = self._mem.local if self._mem is not None else None
        if kept is not None:
            for (p,) in gone:
                kept.pop(p, None)
            kept.update(upserts)
        self._wrote([*upserts, *(p for (p,) in gone)])

    def remote_cache(self) -> dict[str, tuple[int, int, str]]:
        conn, mem = self.conn, self._mem
        if mem is not None and mem.remote is not None:
            return dict(mem.remote)
        rows = conn.execute("SELECT path, size, mtime_ns, hash FROM remote_cache")
        result = {r[0]: (r[1], r[2], r[3]) for r in rows}
        if mem is not None and self._keep:
            mem.remote = result
            return dict(result)
        return result

    def put_remote_cache(self, rows: Iterable[tuple[str, int, int, str]]) -> None:
        rows = list(rows)
        with self._write() as conn:
            conn.executemany("INSERT OR REPLACE INTO remote_cache VALUES (?,?,?,?)", rows)
        kept = self._mem.remote if self._mem is not None else None
        if kept is not None:
            kept.update((r[0], (r[1], r[2], r[3])) for r in rows)

    # -- seal ---------------------------------------------------------------------

    def seal(self) -> Seal | None:
        """The seal of the last pass, if nothing was written to the state since."""
        row = self.conn.execute(
            "SELECT fingerprint, host, remote, excluded FROM seal").fetchone()
        return Seal._make(row) if row is not None else None

    def put_seal(self, seal: Seal) -> None:
        """Record ``seal``; the pass's last write (every write drops it)."""
        with self._write() as conn:
            conn.execute("INSERT INTO seal VALUES (1,?,?,?,?)", (*seal,))

    # -- conflicts ----------------------------------------------------------------

    def conflicts(self) -> dict[str, ConflictRecord]:
        rows = self.conn.execute("SELECT path, local_hash, remote_hash, saved_to FROM conflicts")
        return {r[0]: ConflictRecord(*r) for r in rows}

    def set_conflicts(self, records: Iterable[ConflictRecord], cleared: Iterable[str]) -> None:
        with self._write() as conn:  # the conflicts table is not kept in memory
            conn.executemany("DELETE FROM conflicts WHERE path=?", [(p,) for p in cleared])
            conn.executemany(
                "INSERT OR REPLACE INTO conflicts VALUES (?,?,?,?,?)",
                [(c.path, c.local_hash, c.remote_hash, c.saved_to, time.time_ns())
                 for c in records],
            )


async def open_pair(state_dir: Path, local_root: str, remote_identity: str, remote_root: str,
                    *, lock_timeout: float, lock_option: str, pool: StatePool | None = None,
                    log: Callable[[str], None] | None = None,
                    umask: int | None = None) -> PairState:
    """``PairState.open`` for code on an event loop: the wait of up to ``lock_timeout``
    seconds for another run of the pair (another session, thread or process) sleeps on
    the loop instead of blocking it; ``log`` is told once when the wait begins."""
    deadline = time.monotonic() + lock_timeout
    waiting = False
    while True:
        try:
            return PairState.open(state_dir, local_root, remote_identity, remote_root,
                                  pool=pool, lock_option=lock_option, umask=umask)
        except LockBusy:
            if time.monotonic() >= deadline:
                raise
        if not waiting and log is not None:
            log(f"another filesync run is syncing this pair: waiting up to "
                f"{lock_timeout:g} s for it")
        waiting = True
        await asyncio.sleep(0.05)
