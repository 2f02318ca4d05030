"""The request loop the remote helper runs (``serve``), one root per request.

It answers list/fetch/send/delete requests framed as in ``filesync.tree.wire``, and
ends at ``bye`` or end of input.
"""

from __future__ import annotations

import operator
import os
import select
import stat
import sys
import time

from filesync.tree.bounded import Bounded
from filesync.tree.channel import Channel
from filesync.tree.dirfd import (
    TEMP_PREFIX,
    TEMP_SUFFIX,
    Batch,
    Dirs,
    TempFile,
    batch_descriptors,
    delete_file,
)
from filesync.tree.ignore import Matcher
from filesync.tree.paths import home_dir, resolve_root, split_rel
from filesync.tree.walk import walk
from filesync.tree.watch import WatchedTree
from filesync.tree.watchdog import Watchdog, stall_point
from filesync.tree.wire import (
    CHUNK,
    END_OK,
    PROTOCOL,
    ROW_PATH,
    BadRequest,
    Op,
    Reason,
    Status,
    decode_json,
    file_header,
    is_count,
    listing_digest,
    listing_payload,
    reason_of,
    reason_text,
    split_whole,
)

#: ``typing`` is for the type checker only: the remote helper starts without importing it.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import IO, Any

#: The generation of a helper's first listing (``Server.generation`` counts from 0).
FIRST_GENERATION = 1
#: A listing row's path (``wire.ROW_PATH``), as a C-level getter.
ROW_KEY = operator.itemgetter(ROW_PATH)

#: How many (root, rule) listings one helper remembers for delta replies.
MAX_REMEMBERED = 4
#: ``wait``: the longest it blocks, and how long a burst of events is waited out at most.
MAX_WAIT = 300.0
MAX_SETTLE = 1.0


class Remembered:
    """A listing as sent, generation ``gen``: the base of the next delta, and what
    ``op_seal`` compares a walk against."""

    __slots__ = ("excluded", "gen", "rows", "skipped")

    def __init__(self, gen: int, rows: dict[str, list[Any]], skipped: list[list[str]],
                 excluded: int) -> None:
        self.gen = gen
        self.rows = rows
        self.skipped = skipped
        self.excluded = excluded


def listing_key(root: str, req: dict[str, Any]) -> str:
    """What a listing of ``root`` under a request's rule is remembered by: the root, the
    names and the rules, as they came (``repr`` of JSON values, which tells them apart as
    JSON text would)."""
    return repr([root, req["names"], req["rules"]])


def listing_reply(root: str, entries: list[list[Any]], skipped: list[list[str]],
                  excluded: int) -> dict[str, Any]:
    """The reply to a listing of an existing directory, before its generation: one
    builder, so that ``op_seal`` digests the bytes ``op_list`` would send."""
    return {"root": root, "exists": True, "is_dir": True, "entries": entries,
            "skipped": skipped, "excluded": excluded}


class Server:
    """Answers list/fetch/send/delete requests for one root."""

    def __init__(self, chan: Channel) -> None:
        self.chan = chan
        self.counter = 0
        #: temp names are this, a counter and ``TEMP_SUFFIX`` (the pid: see ``is_temp_name``)
        self.temp_prefix = f"{TEMP_PREFIX}{os.getpid()}."
        #: listings remembered for delta replies and seals: key -> ``Remembered``
        self.listings: Bounded[str, Remembered] = Bounded(MAX_REMEMBERED)
        #: per root, what ``send`` and ``delete`` made of each path since its last
        #: listing: its new row, or None for gone (``op_seal``)
        self.written: dict[str, dict[str, list[Any] | None]] = {}
        #: Trees kept current by inotify (``"watch": true``), with the generation sent last.
        self.watched: Bounded[str, tuple[int, WatchedTree]] = Bounded(
            MAX_REMEMBERED, lambda held: held[1].close())
        self.generation = 0
        self.cwd = os.getcwd()
        home = home_dir()
        self.home = home if home.startswith("/") else self.cwd

    def hello(self) -> dict[str, Any]:
        return {"hello": PROTOCOL, "cwd": self.cwd, "home": self.home, "pid": os.getpid()}

    def resolve(self, root: str) -> str:
        return resolve_root(root, self.cwd, self.home)

    def root_fd(self, root: str, create: bool) -> int:
        path = self.resolve(root)
        if create:
            os.makedirs(path, exist_ok=True)
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))

    def op_list(self, req: dict[str, Any]) -> None:
        """List a root: a full walk and stat every time.

        With ``"delta": true`` the listing is also remembered (per root and rule), and
        when ``since`` names the generation remembered last, only the rows that differ
        from it are sent (``entries``: new or changed, ``removed``: gone) with
        ``base``; the client applies them to its copy of that generation. Only the
        encoding and transfer are saved: the walk is as fresh as a full listing's.
        With ``"watch": true`` as well, the root is kept as a ``WatchedTree`` and only the
        directories inotify reported since are listed again (see ``_list_watched``).
        """
        root = self.resolve(req["root"])
        reply: dict[str, Any] = {"root": root, "exists": os.path.lexists(root)}
        reply["is_dir"] = os.path.isdir(root)
        stall_point("list")
        # The walk below sees everything written so far: ``op_seal`` counts from here.
        self.written.pop(root, None)
        key = listing_key(root, req)
        remembered = self.listings.pop(key)
        watch = req.get("watch") is True and req.get("delta") is True
        if reply["is_dir"] and watch and self._list_watched(key, root, req, reply):
            return
        if reply["is_dir"]:
            matcher = Matcher(req["names"], req["rules"])
            entries, skipped, excluded = walk(root, matcher)
            reply = listing_reply(root, entries, skipped, excluded)
            if req.get("delta") is True:
                since = req.get("since")
                rows: dict[str, list[Any]] | None = None
                if remembered is not None and since == remembered.gen and is_count(since):
                    before = remembered.rows
                    rows = {row[0]: row for row in entries}
                    reply["entries"] = [row for row in entries if before.get(row[0]) != row]
                    reply["removed"] = [rel for rel in before if rel not in rows]
                    reply["base"] = since
                self.generation += 1  # a new helper's first listing: ``FIRST_GENERATION``
                reply["gen"] = self.generation
                self.chan.write(b"Z", listing_payload(reply), True)
                # Remembered after the reply went out: a first listing is not delayed.
                if rows is None:
                    rows = {row[0]: row for row in entries}
                self.listings.put(key, Remembered(self.generation, rows, skipped, excluded))
                return
        elif not reply["exists"] and req.get("delta") is True:
            # Remembered as empty: a send that creates the root can still be sealed
            # (``op_seal``), and the next listing is a delta against nothing.
            self.generation += 1
            reply["gen"] = self.generation
            self.chan.write(b"Z", listing_payload(reply), True)
            self.listings.put(key, Remembered(self.generation, {}, [], 0))
            return
        self.chan.write(b"Z", listing_payload(reply), True)

    def op_seal(self, req: dict[str, Any]) -> None:
        """The digest a fresh helper's first listing of the root would have, if a walk
        now finds the root exactly as listing ``since`` left it plus what this helper
        wrote and deleted there since (``self.written``): every row, skip and exclusion
        count equal. Else ``""``. Nothing is remembered and no generation is used: the
        client's delta base stays that listing."""
        root = self.resolve(req["root"])
        key = listing_key(root, req)
        remembered = self.listings.get(key)
        digest = ""
        if remembered is not None and req.get("since") == remembered.gen \
                and os.path.isdir(root):
            expect = dict(remembered.rows)
            for rel, row in self.written.get(root, {}).items():
                if row is None:
                    expect.pop(rel, None)
                else:
                    expect[rel] = row
            entries, skipped, excluded = walk(root, Matcher(req["names"], req["rules"]))
            # Compared in C-level passes over the rows: no per-row Python frame.
            if excluded == remembered.excluded and skipped == remembered.skipped \
                    and len(entries) == len(expect) \
                    and all(map(operator.eq, entries, map(expect.get, map(ROW_KEY, entries)))):
                reply = listing_reply(root, entries, skipped, excluded)
                reply["gen"] = FIRST_GENERATION
                digest = listing_digest(b"Z", listing_payload(reply))
        self.chan.send_json({"digest": digest})

    def _list_watched(self, key: str, root: str, req: dict[str, Any],
                      reply: dict[str, Any]) -> bool:
        """Answer a listing from the root's ``WatchedTree``; False if it cannot be watched.

        The delta comes from the directories inotify reported, not from comparing whole
        listings; a quiet tree is answered without a walk.
        """
        held = self.watched.pop(key)
        tree = held[1] if held is not None else None
        if tree is None:
            matcher = Matcher(req["names"], req["rules"])
            tree = WatchedTree.create(root, matcher)
            if tree is None:
                return False
        try:
            entries, skipped, excluded, delta = tree.refresh()
        except OSError:  # out of watches, say: this root is walked from now on
            tree.close()
            return False
        reply.update(entries=entries, skipped=skipped, excluded=excluded)
        since = req.get("since")
        if delta is not None and held is not None and since == held[0] and is_count(since):
            reply.update(entries=delta[0], removed=delta[1], base=since)
        self.generation += 1
        reply["gen"] = self.generation
        self.chan.write(b"Z", listing_payload(reply), True)
        self.watched.put(key, (self.generation, tree))
        return True

    def op_wait(self, req: dict[str, Any]) -> None:
        """Block until a watched root changes, the client sends anything, or ``timeout``.

        ``roots``: the ``{"root", "names", "rules"}`` of watched listings (``"watch":
        true`` listings made them). The reply is ``{"changed": bool, "watched": n}``,
        ``watched`` counting the roots that are watched here; unless all are, the
        reply comes at once (the client polls). After the first event it waits for
        ``settle`` seconds without one (at most ``MAX_SETTLE``), so a burst of writes is
        one reply; the events are kept for
        the next listing, which lists again only those directories. Any byte from the
        client (its ``wake``, or its next request) ends the wait at once, so the client
        never waits for a reply to reach its helper, and an idle wait costs no CPU: it
        sleeps in ``select``.
        """
        trees = []
        for item in req["roots"]:
            key = listing_key(self.resolve(item["root"]), item)
            held = self.watched.get(key)
            if held is not None and held[1].ifd >= 0:
                trees.append(held[1])
        timeout = min(max(float(req.get("timeout", 0)), 0.0), MAX_WAIT)
        settle = min(max(float(req.get("settle", 0)), 0.0), MAX_SETTLE)
        inp = _input_fd(self.chan.inp)
        changed = False
        # A root not watched here is the client's to poll: it is told so at once.
        if trees and inp is not None and len(trees) == len(req["roots"]):
            by_fd = {tree.ifd: tree for tree in trees}
            deadline = time.monotonic() + timeout
            while not changed:
                left = deadline - time.monotonic()
                if left <= 0 or _buffered(self.chan.inp):
                    break
                ready, _, _ = select.select([*by_fd, inp], [], [], left)
                changed = _absorb(ready, by_fd)
                if inp in ready:
                    break
            until = time.monotonic() + MAX_SETTLE
            while changed and (left := until - time.monotonic()) > 0:
                ready, _, _ = select.select([*by_fd, inp], [], [], min(settle, left))
                if inp in ready or not _absorb(ready, by_fd):
                    break
        self.chan.send_json({"changed": changed, "watched": len(trees)})

    def op_exists(self, req: dict[str, Any]) -> None:
        """Whether any of ``paths`` exists, symlinks followed (``[ -e ]``); the client's
        self-sync probe, answered by this process instead of a shell of its own."""
        paths = req["paths"]
        if not (isinstance(paths, list) and all(isinstance(p, str) for p in paths)):
            raise TypeError("paths")
        self.chan.send_json({"found": any(os.path.exists(p) for p in paths)})

    def op_fetch(self, req: dict[str, Any]) -> None:
        rfd = self.root_fd(req["root"], False)
        dirs = Dirs(rfd)
        try:
            for rel in req["paths"]:
                self._send_one(dirs, rel)
        finally:
            dirs.close()
            os.close(rfd)
        self.chan.send_json({"done": True})

    def _send_one(self, dirs: Dirs, rel: str) -> None:
        stall_point("fetch")
        try:
            parts = split_rel(rel)
            pfd, _ = dirs.parent(parts, False)
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=pfd)
        except (OSError, ValueError) as exc:
            code, detail = reason_of(exc)
            self.chan.send_json({"path": rel, "error": code, "detail": detail}, b"H", False)
            return
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                self.chan.send_json({"path": rel, "error": Reason.NOT_REGULAR}, b"H", False)
                return
            head = {"path": rel, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                    "mode": st.st_mode & 0o7777}
            self.chan.send_json(head, b"H", False)
            # Read one byte past the announced size, so that a small file costs one
            # read and an end-of-file read, without a 1 MiB buffer each.
            left = st.st_size
            while chunk := os.read(fd, min(CHUNK, left + 1) if left >= 0 else CHUNK):
                left -= len(chunk)
                self.chan.write(b"D", chunk)
            after = os.fstat(fd)
            torn = (after.st_size, after.st_mtime_ns) != (st.st_size, st.st_mtime_ns)
            end = {"ok": False, "error": Reason.TORN} if torn else {"ok": True}
            self.chan.send_json(end, b"E", False)
        finally:
            os.close(fd)

    def op_send(self, req: dict[str, Any]) -> None:
        results: list[list[Any]] = []
        try:
            rfd, error = self.root_fd(req["root"], True), None
        except OSError as exc:
            # Keep consuming the stream so that the protocol stays in step.
            rfd, error = -1, reason_of(exc)
        dirs = Dirs(rfd)
        # Committed together (``Batch``): the rows are sent once every file is durable.
        batch = Batch()
        try:
            for _ in range(req["count"]):
                frame = self.chan.read_frame()
                if frame is None:
                    raise EOFError("stream ended mid-send")
                kind, payload = frame
                if kind == b"W":
                    rel, mode, mtime_ns, expect, data = split_whole(payload)
                    sink = TempFile(dirs, rel, self._temp_name(), error)
                    sink.write(data)
                    batch.add(sink, mode, mtime_ns, expect)
                elif kind == b"H":
                    self._receive_one(batch, dirs, decode_json(kind, payload), error)
                else:  # protocol 1's ``F``, say: a client of another version
                    raise BadRequest(f"{kind!r} frame where a file was due")
        finally:
            # what arrived whole is committed even if the stream broke, as one at a time
            results = batch.finish()
            dirs.close()
            if rfd >= 0:
                os.close(rfd)
            self._wrote(req["root"], {row[0]: row for row in batch.placed})
        self.chan.send_json({"results": results}, b"Z")

    def _receive_one(self, batch: Batch, dirs: Dirs, head: dict[str, Any],
                     error: tuple[Reason, str] | None) -> None:
        rel, mode, mtime_ns, expect = file_header(head)
        sink = TempFile(dirs, rel, self._temp_name(), error)
        read_frame = self.chan.read_frame
        while True:
            frame = read_frame()
            if frame is None:
                sink.abort()
                raise EOFError("stream ended mid-file")
            kind, payload = frame
            if kind == b"D":
                sink.write(payload)
                continue
            if kind == b"E" and payload in END_OK:
                batch.add(sink, mode, mtime_ns, expect)
                return
            try:
                end = decode_json(kind, payload) if kind == b"E" else None
            except BadRequest:
                end = None
            if end is None:
                sink.abort()
                raise BadRequest("expected a D or E frame inside a file")
            if not end.get("ok"):
                sink.abort()
                batch.put([rel, Status.ERROR, Reason.OS_ERROR,
                           str(end.get("error", "aborted by client"))])
                return
            batch.add(sink, mode, mtime_ns, expect)
            return

    def _temp_name(self) -> str:
        self.counter += 1
        return f"{self.temp_prefix}{self.counter}{TEMP_SUFFIX}"

    def op_delete(self, req: dict[str, Any]) -> None:
        results: list[list[Any]] = []
        rfd = self.root_fd(req["root"], False)
        try:
            for rel, size, mtime_ns in req["files"]:
                results.append(delete_file(rfd, rel, [size, mtime_ns]))
        finally:
            os.close(rfd)
            self._wrote(req["root"], {row[0]: None for row in results if row[1] == Status.OK})
        self.chan.send_json({"results": results}, b"Z")

    def _wrote(self, root: str, rows: dict[str, list[Any] | None]) -> None:
        """Note what a send or delete made of ``rows``' paths under ``root``."""
        if rows:
            self.written.setdefault(self.resolve(root), {}).update(rows)


def serve(inp: IO[bytes], out: IO[bytes], watchdog: bool = False) -> None:
    """Answer requests until ``bye`` or end of input; ``watchdog``: run a ``Watchdog``
    (keepalives, exit when the client is gone) on the streams' descriptors."""
    chan = Channel(inp, out)
    server = Server(chan)
    dog = Watchdog(chan, inp.fileno(), out.fileno()) if watchdog else None
    ops: dict[str, Callable[[dict[str, Any]], None]] = {
        Op.LIST.value: server.op_list,
        Op.FETCH.value: server.op_fetch,
        Op.SEND.value: server.op_send,
        Op.DELETE.value: server.op_delete,
        Op.WAIT.value: server.op_wait,
        Op.EXISTS.value: server.op_exists,
        Op.SEAL.value: server.op_seal,
    }
    chan.send_json(server.hello())
    if dog is not None:  # after the hello: a client that saw the thread saw the hello
        dog.start()
    while True:
        try:
            frame = chan.read_json()
        except BadRequest as exc:
            chan.send_json({"error": f"bad request: {exc}"})
            return  # the framing itself is not trusted any more
        if frame is None:
            return
        req = frame[1]
        op = req.get("op")
        if op == Op.BYE:
            chan.send_json({"bye": True})
            return
        if op == Op.WAKE:  # ends a ``wait`` (done by its arrival); nothing to answer
            continue
        if op == Op.KEEPALIVE:
            every = req.get("every")
            if dog is not None and isinstance(every, int | float) and every > 0:
                dog.pace(float(every))
            continue
        handler = ops.get(op) if isinstance(op, str) else None
        if handler is None:
            chan.send_json({"error": f"unknown op {str(op)[:100]!r}"})
            continue
        if dog is not None:
            dog.begin()
        try:
            handler(req)
        except OSError as exc:
            chan.send_json({"error": reason_text(exc), "errno": exc.errno or 0})
        except EOFError:
            return
        except Exception as exc:  # a malformed request: answer once, then stop
            chan.send_json({"error": f"bad request: {type(exc).__name__}"})
            return
        finally:
            if dog is not None:
                dog.end()


def _absorb(ready: list[int], by_fd: dict[int, WatchedTree]) -> bool:
    """Read the events of the ready watched trees; True if any was ready."""
    trees = [by_fd[fd] for fd in ready if fd in by_fd]
    for tree in trees:
        tree.absorb()
    return bool(trees)


def _input_fd(inp: IO[bytes]) -> int | None:
    try:
        return inp.fileno()
    except (OSError, ValueError, AttributeError):
        return None


def _buffered(inp: IO[bytes]) -> bool:
    """Whether the client's next bytes were already read into ``inp``'s buffer (where
    ``select`` cannot see them)."""
    peek = getattr(inp, "peek", None)
    if peek is None:
        return False
    fd = inp.fileno()
    os.set_blocking(fd, False)
    try:
        return bool(peek(1))
    except OSError:
        return False
    finally:
        os.set_blocking(fd, True)


def _widen_pipes() -> None:
    """Grow stdin and stdout to 1 MiB where they are pipes (Linux): a whole data frame
    then moves in one system call, not sixteen. Best effort: another OS, an older
    Python, or a user over the kernel's pipe budget keeps the default."""
    try:
        import fcntl
    except ImportError:
        return
    setsize = getattr(fcntl, "F_SETPIPE_SZ", 1031 if sys.platform == "linux" else None)
    if setsize is None:
        return
    for fd in (0, 1):
        try:
            fcntl.fcntl(fd, setsize, 1 << 20)
        except OSError:  # over the user's pipe budget: the default size stays
            pass


def _reserve_descriptors(count: int) -> None:
    """Grow this process's descriptor table to hold ``count`` descriptors now, while it has
    one thread. Linux grows the table of a process whose threads share it only after an
    RCU grace period (``synchronize_rcu``: 5-20 ms here per doubling), and an upload's
    batch (``dirfd.Batch``) would cross three or four doublings of it; with one thread it
    grows at once. Best effort: without ``fcntl`` the table grows as it fills."""
    try:
        import fcntl
    except ImportError:
        return
    try:
        # The lowest free descriptor from ``count - 1`` up: nothing open is touched.
        os.close(fcntl.fcntl(0, getattr(fcntl, "F_DUPFD_CLOEXEC", fcntl.F_DUPFD), count - 1))
    except OSError:
        pass


def main() -> None:
    """The remote helper's entry point: serve stdin/stdout until ``bye`` or end of input,
    then end the process at once. Every reply is out and every file closed by then; the
    interpreter's teardown (freeing the listings a session remembers, ~40 ms for 100k
    files) would only keep the client waiting for the channel to close."""
    try:
        _widen_pipes()
        _reserve_descriptors(batch_descriptors())  # before ``serve`` starts a thread
        serve(sys.stdin.buffer, sys.stdout.buffer, watchdog=True)
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        pass  # the client went away: nothing is left to answer
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
    os._exit(0)


if __name__ == "__main__":
    main()
