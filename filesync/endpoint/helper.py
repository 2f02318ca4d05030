"""The client side of the remote helper protocol, over any conduit.

``HelperEndpoint.start`` launches the helper (``python3 -c``, its source fed on
stdin) in one remote process and keeps it for the whole run: listing, fetching,
sending and deleting are requests on that one stream, with no per-file round trip.

The shell that starts it first names its pid (``filesync.endpoint.silent``), so that a
remote that goes silent, the helper or something posing as python3 that never says
hello, is killed with its process group: nothing of it is left running on the remote.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from filesync.core.exclude import ExcludeRule
from filesync.core.faults import crash_point
from filesync.core.lineage import Series
from filesync.core.model import FILE, Entry, Listing, Skipped, filter_unsafe
from filesync.endpoint.contract import FetchHeader, FetchSink, Outcome, SendItem, call_sink
from filesync.endpoint.listings import DeltaBase, EarlyListing, list_request, wire_key
from filesync.endpoint.silent import kill_remote, named, no_hello, pid_line
from filesync.endpoint.upload_stream import write_stream
from filesync.errors import ConnectionLost, RemoteSilent, TransportError
from filesync.transport.base import Conduit, RemoteProcess
from filesync.tree.bounded import Bounded
from filesync.tree.bundle import MIN_PYTHON, NO_PYTHON, OLD_PYTHON, bootstrap_command, payload
from filesync.tree.paths import all_safe, resolve_root
from filesync.tree.wire import (
    HEADER,
    PROTOCOL,
    REPLY_KINDS,
    BadRequest,
    Op,
    Reason,
    Status,
    decode_json,
    describe,
    encode_json,
    fetch_header,
    frame,
    frame_head,
    is_count,
    listing_digest,
    listing_row,
    ok_sent,
    parse_reason,
    result_row,
    skipped_row,
)

#: How long ``close`` waits for the helper's goodbye before killing it.
CLOSE_TIMEOUT = 10.0
#: How long a remote that answered with something else than the helper's hello may go
#: on talking before it is killed (the error message quotes what it said).
START_TIMEOUT = 5.0
_GARBAGE = "remote helper sent garbage ({}); check the remote's python3, then rerun"
#: A keepalive frame's header (``K``, empty): the helper is at work.
KEEPALIVE_FRAME = HEADER.pack(b"K", 0)


class NoPython(TransportError):
    """The remote has no python3 the helper runs on: the caller may fall back to the POSIX
    path. ``why`` says which (no python3, or its version), for the fallback's log line."""

    def __init__(self, message: str, why: str = "remote has no python3") -> None:
        super().__init__(message)
        self.why = why


class HelperEndpoint:
    """One helper process on the remote side, serving one root."""

    def __init__(self, conduit: Conduit, proc: RemoteProcess, hello: dict[str, Any]) -> None:
        self.conduit = conduit
        self.proc = proc
        self.hello = hello
        #: the remote process's pid, as its starting shell named it
        self.pid: int | None = None
        #: set once the stream can no longer be trusted; ``close`` then kills at once
        self.broken = False
        #: the listing request sent ahead (``start(list_first=...)``, ``prefetch_list``)
        #: whose reply is untaken; read (or taken from ``_kept``) under ``_early_read`` only
        self._early: EarlyListing | None = None
        self._kept: tuple[bytes, bytes] | None = None  # read ahead by ``any_exists``
        self._early_read = asyncio.Lock()
        #: the last listing received per (root, rule), the base of the next delta reply
        self._bases: Bounded[tuple[str, str], DeltaBase] = Bounded(MAX_BASES)
        #: ask the helper to keep listed roots watched (inotify), so that a later listing
        #: lists again only what changed; for sessions that outlive one pass
        self.watch = False

    @classmethod
    async def start(
        cls, conduit: Conduit, *, list_first: tuple[str, ExcludeRule] | None = None,
        watch: bool = False,
    ) -> HelperEndpoint:
        """Start the helper; raise ``TransportError`` if the remote can't run it.

        ``list_first=(path, rule)`` sends the listing request of ``path`` (as the user
        wrote it: ``~/x``, relative or absolute) right behind the helper's source,
        without waiting for its hello: the helper starts walking at once. The reply is
        read by the first ``list_tree`` call whose root is ``resolve_root(path)`` with
        the same rule (any other request first reads and drops it). ``watch``: see the
        attribute.
        """
        proc = await conduit.start(named(bootstrap_command()))
        first_request = b""
        early: EarlyListing | None = None
        if list_first is not None:
            path, rule = list_first
            early = EarlyListing(path, rule.wire(), resolved=False)
            req = list_request(path, early.wire, None)
            if watch:
                req["watch"] = True
            first_request = frame(b"J", encode_json(req))
        first_request = _keepalive_request(conduit) + first_request
        write_error: ConnectionLost | None = None
        pid: int | None = None
        try:
            try:
                await proc.write(payload() + first_request)
            except ConnectionLost as exc:
                # Ended before it took the helper (no python3 exits at once): read what it
                # said.
                write_error = exc
            pid, first = await pid_line(proc)
            if pid is not None:
                first = await proc.read(1)
        except RemoteSilent as exc:
            await kill_remote(conduit, pid)
            raise no_hello(conduit) from exc
        if first == b"J" and write_error is not None:
            raise write_error
        if first != b"J":
            # Not the helper's hello: close its input so a waiting process ends, read what
            # it says (bounded in size and time: a chatty or stuck remote must not hang us).
            await proc.write_eof()
            try:
                rest = first + await asyncio.wait_for(_drain(proc, 1 << 16), START_TIMEOUT)
                err_text = await asyncio.wait_for(proc.read_stderr(), START_TIMEOUT)
            except (TimeoutError, TransportError):
                rest, err_text = first, b""
            finally:
                proc.kill()
            if rest.startswith(NO_PYTHON):
                raise NoPython(
                    "the remote has no python3; install python3 there "
                    "(the POSIX fallback needs tar and find)"
                )
            if rest.startswith(OLD_PYTHON):
                version = _text(rest[len(OLD_PYTHON):].decode(errors="replace"))[:20]
                need = ".".join(map(str, MIN_PYTHON))
                raise NoPython(
                    f"the remote's python3 is {version}, older than the helper needs "
                    f"({need}); install python3 {need} or newer there (the POSIX fallback "
                    "needs tar and find)",
                    why=f"remote's python3 is {version} (the helper needs {need})",
                )
            err = err_text.decode(errors="replace").strip().splitlines()
            if write_error is not None and not rest and not err:
                raise write_error  # it said nothing: the connection itself went
            # What the remote said on stderr names the cause best (python3 failing, say),
            # even when it also stopped reading the helper's source.
            tail = _text(err[-1] if err else rest.decode(errors="replace"))[:200]
            raise TransportError(
                f"the remote helper did not start: {tail or 'no output'}; check that the "
                "remote's shell startup files print nothing and that python3 runs there"
            )
        session = cls(conduit, proc, {})
        session.pid = pid
        try:
            hello = await session._payload(first)
            if not isinstance(hello.get("hello"), int) or not isinstance(hello.get("cwd"), str):
                raise session._garbage("no valid hello")
            if hello["hello"] != PROTOCOL:  # its frames would be misread, or refused midway
                raise TransportError(f"the remote helper speaks protocol {hello['hello']}, "
                                     f"this filesync {PROTOCOL}; run one version on both ends")
        except RemoteSilent as exc:
            await kill_remote(conduit, pid)
            raise no_hello(conduit) from exc
        except BaseException:
            proc.kill()
            raise
        session.hello = hello
        session._early = early
        session.watch = watch
        return session

    def resolve_root(self, path: str) -> str:
        """The absolute remote root for ``path``, resolved as the helper resolves it.

        ``~`` and ``~/...`` are relative to the remote's home (from the hello), other
        relative paths to the remote's working directory (the home over SSH).
        """
        cwd = self.hello.get("cwd")
        cwd = cwd if isinstance(cwd, str) and cwd.startswith("/") else "/"
        home = self.hello.get("home")
        home = home if isinstance(home, str) and home.startswith("/") else cwd
        return resolve_root(path, cwd, home)

    # -- framing ------------------------------------------------------------------

    async def _request(self, obj: dict[str, Any]) -> None:
        await self._settle()
        await self.proc.write(frame(b"J", encode_json(obj)))

    async def _settle(self) -> None:
        """Read and drop the reply to an early listing nobody asked for."""
        if self._early is not None:
            await self._early_reply()

    async def _early_reply(self) -> tuple[bytes, bytes]:
        """Take the early listing's reply frame: kept by ``any_exists``, or read now."""
        async with self._early_read:
            got, self._kept, self._early = self._kept, None, None
            return got if got is not None else await self._frame()

    def _garbage(self, what: str) -> TransportError:
        """The error for a stream that broke the protocol; the session is unusable after."""
        self.broken = True
        return TransportError(_GARBAGE.format(what))

    async def _frame(self) -> tuple[bytes, bytes]:
        head = await self.proc.readexactly(HEADER.size)
        while head == KEEPALIVE_FRAME:  # a keepalive: the helper is at work
            head = await self.proc.readexactly(HEADER.size)
        return await self._body(head)

    async def _body(self, head: bytes, kinds: bytes = REPLY_KINDS) -> tuple[bytes, bytes]:
        try:
            kind, length = frame_head(head, kinds)
        except BadRequest as exc:
            raise self._garbage(str(exc)) from None
        return kind, await self.proc.readexactly(length)

    async def _payload(self, kind_byte: bytes) -> dict[str, Any]:
        head = kind_byte + await self.proc.readexactly(HEADER.size - 1)
        return self._decode(*await self._body(head, b"J"))

    def _decode(self, kind: bytes, payload: bytes) -> dict[str, Any]:
        try:
            return decode_json(kind, payload)
        except BadRequest as exc:
            raise self._garbage(str(exc)) from None

    async def _reply(self) -> dict[str, Any]:
        kind, payload = await self._frame()
        return self._reply_of(kind, payload)

    def _reply_of(self, kind: bytes, payload: bytes) -> dict[str, Any]:
        if kind not in (b"J", b"Z"):
            raise self._garbage(f"{kind!r} frame where a reply was due")
        obj = self._decode(kind, payload)
        if "error" in obj:
            raise TransportError(f"remote: {_text(obj['error'])}")
        return obj

    # -- operations -------------------------------------------------------------

    async def prefetch_list(self, root: str, rule: ExcludeRule) -> None:
        """Send the listing request of ``root`` now; ``list_tree(root, rule)`` reads it.

        The helper walks while the caller does other work (opens its state, walks the
        host). Does nothing when a listing request is already pending.
        """
        if self._early is not None:
            return
        wire = rule.wire()
        await self._request(self._list_request(root, wire))
        self._early = EarlyListing(root, wire, resolved=True)

    def _list_request(self, root: str, wire: dict[str, Any]) -> dict[str, Any]:
        base = self._bases.get((root, wire_key(wire)))
        req = list_request(root, wire, base.gen if base is not None else None)
        if self.watch:
            req["watch"] = True
        return req

    async def list_tree(self, root: str, rule: ExcludeRule) -> Listing:
        """List regular files under ``root``, pruned on the remote by ``rule``.

        Within one session the helper answers with the rows that changed since the
        listing it sent last for the same root and rule (a delta, see
        ``helper.Server.op_list``), applied here to a copy of that listing: the result
        is the full listing, as fresh as the walk it came from. A full listing's
        ``digest`` is that of the reply's bytes.
        """
        listing = await self._list(root, rule, "")
        assert listing is not None  # (only a known digest gives None)
        return listing

    async def list_tree_unless(self, root: str, rule: ExcludeRule, known: str) -> Listing | None:
        """``list_tree``, or None when its reply is byte for byte the reply whose listing
        had the digest ``known``: then nothing of it is decoded."""
        return await self._list(root, rule, known)

    async def _list(self, root: str, rule: ExcludeRule, known: str) -> Listing | None:
        wire = rule.wire()
        frame: tuple[bytes, bytes] | None = None
        if (early := self._early) is not None:
            got = await self._early_reply()
            if early.answers(root, wire, self.resolve_root):
                frame = got
        if frame is None:
            await self._request(self._list_request(root, wire))
            frame = await self._frame()
        kind, payload = frame
        digest = listing_digest(kind, payload)
        key = (root, wire_key(wire))
        if known and digest == known:
            self._bases.pop(key)  # the helper's generation is not kept here: no delta
            return None
        reply = self._reply_of(kind, payload)
        entries, skipped = reply.get("entries", []), reply.get("skipped", [])
        if not (
            isinstance(reply.get("root"), str) and isinstance(entries, list)
            and isinstance(skipped, list) and is_count(reply.get("excluded", 0))
        ):
            raise self._garbage("malformed listing")
        base = self._bases.pop(key)
        listing = Listing(reply["root"], bool(reply.get("exists")),
                          digest="" if "base" in reply else digest)
        if reply.get("exists") and not reply.get("is_dir"):
            raise TransportError(
                f"remote root {reply['root']} is not a directory; give a directory path"
            )
        # Regular files, and the rows that are skipped (hard links, other kinds).
        files: dict[str, Entry] = {}
        odd: dict[str, Skipped] = {}
        came: list[str] | None = None  # the names a delta brought in
        series = Series()  # a full listing: nothing known of what changed
        if "base" in reply:
            removed = reply.get("removed")
            if (base is None or type(reply["base"]) is not int or reply["base"] != base.gen
                    or type(removed) is not list):
                raise self._garbage("delta listing against a listing never received")
            # The base was taken out (``pop``): updated in place, it becomes the next.
            files, odd = base.files, base.odd
            came = [] if base.safe else None
            series = base.series
            for rel in removed:
                if type(rel) is not str or (
                    files.pop(rel, None) is None and odd.pop(rel, None) is None
                ):
                    raise self._garbage("delta listing removes an unknown path")
        # The base outlives the pass: a mode is one object for all its rows (a tree
        # holds a handful of modes, the decoder makes one int per row), and a path
        # already in the base keeps its key's string, not a second one.
        modes: dict[int, int] = {}
        # A delta's series names every row it brought in.
        named: list[str] | None = [] if "base" in reply else None
        for at, row in enumerate(entries):
            # Each row list is dropped once read: the memory of rows read is taken up
            # again by the entries made from them, instead of new pages that a long
            # watch would hold on to after the rows are gone.
            entries[at] = None
            if not listing_row(row):
                raise self._garbage("malformed listing entry")
            # The declared layout (``wire.ROW_PATH`` ... ``ROW_NLINK``), unpacked at once.
            rel, kind, size, mtime_ns, mode, ino, nlink = row
            del row
            if kind == FILE and nlink <= 1:
                old = files.get(rel)
                if old is not None:
                    rel = old.path
                if named is not None:
                    named.append(rel)
                files[rel] = Entry(rel, kind, size, mtime_ns, modes.setdefault(mode, mode), ino)
                odd.pop(rel, None)
                if came is not None:
                    came.append(rel)
                continue
            odd[rel] = Skipped.of(rel, Reason.NOT_REGULAR if kind != FILE else Reason.HARD_LINK)
            files.pop(rel, None)
            if named is not None:
                named.append(rel)
        # Unsafe names stay in the base (a later delta may remove them) and are filtered
        # from the listing handed out; a delta to a base that was all safe only needs
        # the names it brought in checked.
        safe = all_safe(came) if came is not None else all_safe(files.keys())
        if named is not None:
            series.advance([*reply["removed"], *named])
        listing.lineage = series.now()
        gen = reply.get("gen")
        if type(gen) is int and gen >= 0:
            # Kept as received: the listing handed out is a copy its user may change.
            self._bases.put(key, DeltaBase(gen, files, odd, safe, series))
        listing.entries = dict(files)
        listing.skipped.extend(odd.values())
        for row in skipped:
            if not skipped_row(row):
                raise self._garbage("malformed listing entry")
            rel, code, detail = row
            listing.skipped.append(Skipped.of(rel, parse_reason(code), _text(detail)))
        listing.excluded = int(reply.get("excluded", 0))
        # The contract keeps unsafe names out of entries, so no caller can forget to.
        if not safe:
            filter_unsafe(listing)
        return listing

    async def seal_digest(self, root: str, rule: ExcludeRule) -> str:
        """The contract's: the helper walks ``root`` and compares it with the listing
        this endpoint last received of it (the delta base), updated with what the helper
        wrote and deleted since (``helper.Server.op_seal``)."""
        wire = rule.wire()
        base = self._bases.get((root, wire_key(wire)))
        if base is None:
            return ""
        await self._request({"op": Op.SEAL.value, "root": root, **wire, "since": base.gen})
        digest = (await self._reply()).get("digest")
        if not isinstance(digest, str):
            raise self._garbage("malformed seal reply")
        return digest

    async def any_exists(self, paths: Sequence[str]) -> bool:
        """The contract's; asked of the helper itself (no other remote process). Behind
        a pending early listing, whose reply comes first and is kept for its reader."""
        request = frame(b"J", encode_json({"op": Op.EXISTS.value, "paths": list(paths)}))
        try:
            async with self._early_read:
                await self.proc.write(request)
                if self._early is not None and self._kept is None:
                    self._kept = await self._frame()
                found = (await self._reply()).get("found")
        except asyncio.CancelledError:
            self.broken = True  # a reply may be left on the stream, out of step
            raise
        if not isinstance(found, bool):
            raise self._garbage("malformed exists reply")
        return found

    async def fetch(self, root: str, paths: Sequence[str], sink: FetchSink) -> None:
        """Stream ``paths`` into ``sink``; torn or vanished files are reported to it.

        Only the requested paths are accepted, each once (a path asked twice is asked
        for once); a file whose bytes do not add up to its announced size counts as torn.
        A sink that cannot write (a full disk) ends the run with a ``FilesyncError``.
        """
        paths = list(dict.fromkeys(paths))
        await self._request({"op": Op.FETCH.value, "root": root, "paths": paths})
        pending = Counter(paths)
        while True:
            kind, payload = await self._frame()
            if kind == b"D" or kind == b"E":
                raise self._garbage(f"{kind!r} frame outside a file")
            obj = self._decode(kind, payload)
            if kind != b"H":
                if "error" in obj:
                    raise TransportError(f"remote: {_text(obj['error'])}")
                if pending.total():
                    # The helper answers every path: a missing one means a broken stream.
                    raise self._garbage(f"fetch ended without {pending.total()} files")
                return
            path = obj.get("path")
            if not isinstance(path, str) or pending[path] <= 0:
                raise self._garbage("a file that was not asked for")
            pending[path] -= 1
            if "error" in obj:
                code = parse_reason(obj["error"])
                sink.failed(path, describe(code, _text(obj.get("detail", ""))))
                continue
            fields = fetch_header(obj)
            if fields is None:
                raise self._garbage("malformed file header")
            await self._receive(FetchHeader(path, *fields), sink)

    async def _receive(self, head: FetchHeader, sink: FetchSink) -> None:
        write = call_sink(sink.begin, head)
        received = 0
        while True:
            kind, payload = await self._frame()
            if kind == b"D":
                received += len(payload)
                if received <= head.size:  # past it the file grew while read: torn
                    call_sink(write, payload, path=head.path)
                continue
            if kind != b"E":
                raise self._garbage(f"{kind!r} frame inside a file")
            end = self._decode(kind, payload)
            ok = end.get("ok") is True and received == head.size
            reason = (describe(parse_reason(end.get("error")), _text(end.get("detail", "")))
                      if end.get("ok") is not True else "" if ok else describe(Reason.TORN))
            call_sink(sink.end, head, ok, reason, path=head.path)
            crash_point("staged")
            return

    async def send(self, root: str, items: Iterable[SendItem],
                   count: int | None = None) -> list[Outcome]:
        """Upload ``items`` in one stream (``upload_stream``); each is renamed into place
        only if unchanged. ``items`` may be a generator if ``count`` says how many it
        yields: the first file is then on its way while the rest are still being made.
        """
        if count is None:
            items = list(items)
            count = len(items)
        await self._settle()
        paths = await write_stream(self.proc.write, root, items, count)
        return self._outcomes(await self._reply(), paths)

    async def delete(self, root: str, files: Sequence[Entry]) -> list[Outcome]:
        """Delete files that are still as listed; others come back ``changed``."""
        files = [e for e in files if e.kind == FILE]
        req = [[e.path, e.size, e.mtime_ns] for e in files]
        await self._request({"op": Op.DELETE.value, "root": root, "files": req})
        return self._outcomes(await self._reply(), [e.path for e in files])

    def _outcomes(self, reply: dict[str, Any], paths: list[str]) -> list[Outcome]:
        """One outcome per requested path, in order, or the stream is garbage."""
        rows = reply.get("results")
        if not isinstance(rows, list) or len(rows) != len(paths):
            raise self._garbage("malformed results")
        out: list[Outcome] = []
        add = out.append
        ok = Status.OK
        for row, path in zip(rows, paths, strict=True):
            if ok_sent(row, path):  # the common row, checked inline; anything else in full
                add(Outcome(path, ok, row[2], row[3]))
                continue
            outcome = _outcome(row)
            if outcome is None or outcome.path != path:
                raise self._garbage("malformed results")
            add(outcome)
        return out

    async def close(self) -> None:
        """Ask the helper to exit and wait for it (killing it if it does not); never raises.

        A session whose stream broke the protocol is killed at once: a hostile or
        garbled remote gets no chance to keep the run waiting.
        """
        if self.broken:
            self.proc.kill()
            await self._end_silent()
            return
        try:
            await asyncio.wait_for(self._goodbye(), CLOSE_TIMEOUT)
        except Exception:
            self.proc.kill()

    async def _end_silent(self) -> None:
        """Kill a helper that went silent (``filesync.endpoint.silent.kill_remote``), by
        the pid its starting shell named, else by the one in its hello."""
        if getattr(self.proc, "silent", False):
            pid = self.hello.get("pid")
            await kill_remote(self.conduit, self.pid if self.pid is not None else
                              pid if type(pid) is int else None)

    async def _goodbye(self) -> None:
        await self._request({"op": Op.BYE.value})
        await self._reply()
        await self.proc.write_eof()
        await self.proc.wait()


#: Listings kept per session as delta bases (one per root and rule in use).
MAX_BASES = 4


def _keepalive_request(conduit: Conduit) -> bytes:
    """The request that sets the helper's keepalive pace well inside ``conduit``'s idle
    deadline (``filesync.endpoint.idle``); none for a conduit without one."""
    idle = getattr(conduit, "idle", None)
    if not isinstance(idle, float):
        return b""
    return frame(b"J", encode_json({"op": Op.KEEPALIVE.value, "every": idle / 4}))


def _text(value: object) -> str:
    """A remote-supplied message made safe for one line of a terminal (no control chars)."""
    text = " ".join(str(value).split())[:300]
    return "".join(c if c.isprintable() else "?" for c in text)


def _outcome(row: object) -> Outcome | None:
    """A result row other than the common one, in full; None if it has no such layout."""
    parsed = result_row(row)
    if parsed is None:
        return None
    path, status, rest = parsed
    if status is Status.OK:
        return Outcome(path, status, *rest)
    code = parse_reason(rest[0])
    return Outcome(path, status, reason=describe(code, _text(rest[1])), code=code)


async def _drain(proc: RemoteProcess, limit: int) -> bytes:
    """Read stdout to its end, keeping at most ``limit`` bytes."""
    chunks: list[bytes] = []
    kept = 0
    while chunk := await proc.read(1 << 16):
        if kept < limit:
            chunks.append(chunk)
            kept += len(chunk)
    return b"".join(chunks)[:limit]

__all__ = ["ConnectionLost", "FetchHeader", "FetchSink", "HelperEndpoint", "Outcome", "SendItem"]
