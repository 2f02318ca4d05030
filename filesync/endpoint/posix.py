"""The POSIX fallback for remotes without python3: ``sh``, ``find`` and ``tar`` only.

``PosixEndpoint`` implements the ``filesync.endpoint.contract.Endpoint`` contract (no
code shared with ``HelperEndpoint``) by running one short shell script per operation
(one exec, no per-file round trip) instead of the python3 helper. What it needs on the
remote, detected once by ``start``:

- ``tar`` that reads a file list (``-T``; GNU tar, bsdtar and busybox do), ideally
  with ``--no-recursion``;
- ``find`` with ``-maxdepth`` (GNU, BSD, busybox): GNU find's ``-printf`` gives
  nanosecond mtimes; without it every listed path goes through ``stat`` (GNU/busybox
  ``stat -c`` or BSD ``stat -f``) and mtimes have whole seconds;
- ``mv`` that takes ``-T`` (GNU coreutils, busybox; without it uploads are refused,
  see ``filesync.endpoint.posix_scripts``), ``env pwd -P``, ``rm``, ``mkdir``,
  ``rmdir``, ``cat``, ``tr``, ``tail``, ``sort`` and, if present, ``xargs -0``
  (else one ``stat`` per file where a batch would do).

A missing tool is one error line naming it and the fix (python3 is preferred).

Guarantees, per operation:

- ``list_tree``: level by level, one ``find DIR... -maxdepth 1`` command per depth
  over every directory kept at the previous depth. Which child directories are listed
  next is decided here by the one exclusion rule (``ExcludeRule``, gitignore patterns
  and default names alike), so an excluded directory is never opened and nothing
  under it is read (the default names are also pruned by ``find`` itself, which only
  saves their records). A directory swapped for a symlink between two levels is not
  followed and is reported ``path-raced``. Symlinks and special files are reported as
  skipped; hard-linked files too.
- ``fetch``: one ``tar -c`` stream, parsed here with ``tarfile`` in stream mode and
  never extracted: only regular-file members named exactly like a requested path
  are handed to the sink, each once. Links, devices, directories, ``..``, absolute
  and unexpected names are refused. A member whose size/mtime differs from the
  listing, or whose file changed while tar read it (checked after the stream), is
  reported failed, so the run retries it next time.
- ``send``: one tar stream built here is extracted by the remote ``tar -x`` into
  temp names in the root (``.filesync.<pid>.<n>.tmp``, which every listing skips and
  removes once their run is gone), then each is renamed over its target by ``mv -T``
  from the target's verified parent, only if the target is still as listed (the check
  runs in ``sh`` right before the rename); mode and mtime come from the tar header.
  Missing parent directories are created with the default mode; existing ones are
  never chmodded. A file tar could not write whole (a full disk) fails alone; a stream
  that did not arrive whole commits nothing.
- ``delete``: ``rm -f`` only of files still as listed, then ``rmdir`` of the
  directories it left empty (never the root). An empty ``send`` makes the root.
- Round trips: one command per operation, except listings: one per directory depth
  of the tree (plus one past the deepest, which finds no directory); ``send`` reads the
  parent-directory verdicts before it streams (one exchange in the same command); a
  listing that finds temp files of gone runs removes them with one more command, as
  the helper's walk does. A ``fetch`` of paths this endpoint has not listed stats them
  in the same command right before ``tar`` reads them, so their headers carry the
  remote's exact mtime (a tar header has whole seconds) and they are checked against
  that stat as against a listing.
- Paths with a symlinked parent directory are refused, as by the helper. Nothing is
  written, created or removed outside the root even while the remote swaps
  directories and symlinks: how, and the one limit (a directory moved out while in
  use), is argued in ``filesync.endpoint.posix_scripts``.

Modules: ``posix_scripts`` (the shell code, and ``PlainCommands``: the operations that
are one plain command, the self-sync check's ``any_exists`` among them), ``posix_parse``
(reading its output), ``posix_tar`` (the tar streams), this one (the endpoint).
"""

from __future__ import annotations

import asyncio
import contextlib
import posixpath
import secrets
import tempfile
from collections.abc import Iterable, Sequence
from typing import Any

from filesync.core.exclude import ExcludeRule
from filesync.core.model import FILE, Entry, Listing, Skipped, filter_unsafe
from filesync.endpoint.contract import FetchSink, Outcome, SendItem
from filesync.endpoint.posix_parse import (
    Lines,
    Listed,
    Record,
    build_listing,
    missing_tools_error,
    parse_records,
    result_reason,
    stat_lines,
    statuses,
    tar_errors,
    trailer,
)
from filesync.endpoint.posix_scripts import (
    CLEAN_OP,
    DELETE_OP,
    FETCH_OP,
    GNU_FIND,
    LIST_OP,
    PROBE,
    SEND_OP,
    STAT_C,
    STAT_F,
    PlainCommands,
    Tools,
    level_input,
    script,
)
from filesync.endpoint.posix_tar import CHUNK, Bridge, TarFetch, header
from filesync.errors import ConnectionLost, TransportError
from filesync.transport.base import Conduit, RemoteProcess
from filesync.tree.paths import resolve_root, unsafe_reason
from filesync.tree.wire import Reason, Status, describe

__all__ = ["GNU_FIND", "STAT_C", "STAT_F", "PosixEndpoint", "TarFetch", "Tools"]

_SPOOL_MEMORY = 8 << 20
_RECORD = 10240


class PosixEndpoint(PlainCommands):
    """The ``Endpoint`` of a remote without python3: one shell script per operation."""

    def __init__(self, conduit: Conduit, hello: dict[str, str], tools: Tools) -> None:
        self.conduit = conduit
        self.hello = hello
        self.tools = tools
        #: accepted for the contract's sake: every listing here is a full ``find``
        self.watch = False
        #: nothing streams between operations, so nothing can break: kept for the contract
        self.broken = False
        self._listed: dict[str, dict[str, Listed]] = {}
        self._stale: dict[str, list[str]] = {}
        self._running: set[RemoteProcess] = set()

    @classmethod
    async def start(cls, conduit: Conduit, *, tools: Tools | None = None) -> PosixEndpoint:
        """Probe the remote's tools in one command; ``TransportError`` naming what is missing.

        ``tools`` overrides what is detected (tests use it to force a flavour).
        """
        proc = await conduit.start(PROBE)
        await proc.write_eof()
        out = Lines(proc)
        text = (await out.rest()).decode("utf-8", "surrogateescape")
        await proc.wait()
        facts: dict[str, list[str]] = {}
        for line in text.splitlines():
            key, sep, value = line.partition("=")
            if sep:
                facts.setdefault(key, []).append(value)
        if "end" not in facts or "cwd" not in facts:
            err = (await proc.read_stderr()).decode(errors="replace").strip().splitlines()
            tail = err[-1] if err else text.strip()[:200]
            raise TransportError(
                f"the remote shell did not answer the POSIX fallback's probe: {tail or 'no output'}"
            )
        problem = missing_tools_error(facts)
        if problem is not None:
            raise TransportError(problem)
        if tools is None:
            flavour = (GNU_FIND if "findprintf" in facts
                       else STAT_C if facts["stat"][0] == "c" else STAT_F)
            tools = Tools(flavour, "tarnorec" in facts, "xargs0" in facts,
                          "tarnounquote" in facts, facts["tar"][0], "mvT" in facts)
        hello = {"cwd": facts["cwd"][0], "home": facts.get("home", [""])[0]}
        return cls(conduit, hello, tools)

    def resolve_root(self, path: str) -> str:
        """``path`` resolved against the remote's home and working directory (probed)."""
        cwd = self.hello["cwd"] if self.hello["cwd"].startswith("/") else "/"
        home = self.hello["home"] if self.hello["home"].startswith("/") else cwd
        return resolve_root(path, cwd, home)

    async def prefetch_list(self, root: str, rule: ExcludeRule) -> None:
        """Nothing: every listing is its own ``find``, started when it is asked for."""

    # -- plumbing ---------------------------------------------------------------------

    async def _start(self, text: str) -> tuple[RemoteProcess, asyncio.Task[bytes]]:
        proc = await self.conduit.start(text)
        self._running.add(proc)
        # stderr is drained all along: a chatty command must never block on a full pipe.
        return proc, asyncio.create_task(proc.read_stderr())

    def _abandon(self, proc: RemoteProcess, *tasks: asyncio.Future[Any]) -> None:
        """Stop a command that failed midway, and the tasks reading or feeding it."""
        for task in tasks:
            task.cancel()
        proc.kill()
        self._running.discard(proc)

    async def _finish(self, proc: RemoteProcess, err: asyncio.Task[bytes]) -> str:
        """Wait for the command's end; its stderr's last line."""
        try:
            await proc.wait()
            lines = (await err).decode("utf-8", "replace").strip().splitlines()
        finally:
            self._running.discard(proc)
        return lines[-1] if lines else ""

    def _broken(self, what: str, stderr: str) -> TransportError:
        detail = f": {stderr}" if stderr else ""
        return TransportError(
            f"the remote shell failed during {what} (POSIX fallback){detail}; rerun, "
            "or install python3 there"
        )

    def _token(self, root: str, rel: str, size: int, mtime_ns: int) -> str:
        """The listing's stat token for ``rel`` if it still describes (size, mtime_ns).

        A path not listed (or listed otherwise) gets the token GNU find's ``%T@`` prints
        for that size and mtime; where the remote prints whole seconds only, a token no
        stat prints, so the remote check says "changed" rather than guess.
        """
        listed = self._listed.get(root, {}).get(rel)
        if listed is not None and (listed.size, listed.mtime_ns) == (size, mtime_ns):
            return listed.token
        if self.tools.flavour == GNU_FIND and mtime_ns >= 0:
            return f"{size} {mtime_ns // 10**9}.{mtime_ns % 10**9:09d}0"
        return "?"

    # -- operations -------------------------------------------------------------------

    async def list_tree_unless(self, root: str, rule: ExcludeRule, known: str) -> Listing | None:
        """Always lists: its levels come from several commands, with no one reply to digest."""
        return await self.list_tree(root, rule)

    async def seal_digest(self, root: str, rule: ExcludeRule) -> str:
        """Its listings carry no digest: nothing to seal with."""
        return ""

    async def list_tree(self, root: str, rule: ExcludeRule) -> Listing:
        """List regular files under ``root`` level by level (see the module doc): a child
        directory is listed at the next depth only if ``rule`` does not exclude it."""
        matcher = rule.matcher()
        records: list[Record] = []
        stderr_parts: list[str] = []
        raced: list[str] = []
        level = [""]
        while level:
            status, recs, stderr_text = await self._list_level(root, rule, level)
            if status in ("N", "M") and level == [""]:
                if status == "N":
                    raise TransportError(
                        f"remote root {root} is not a directory; give a directory path")
                return Listing(root, False)
            if status != "D":
                raise self._broken("the listing", stderr_text.strip()[-200:])
            stderr_parts.append(stderr_text)
            starts = set(level)
            level = []
            for rec in recs:
                if rec.rel in starts:
                    if rec.kind != "d" and rec.rel:
                        raced.append(rec.rel)
                    continue
                records.append(rec)
                if rec.kind == "d" and not matcher.matches(rec.rel, True):
                    level.append(rec.rel)
        listing = self._listing(root, rule, records, "".join(stderr_parts))
        listing.skipped += [Skipped.of(rel, Reason.PATH_RACED) for rel in raced]
        filter_unsafe(listing)  # an unsafe name is never an entry
        if self._stale.get(root):
            await self._clean(root, self._stale.pop(root))
        return listing

    async def _list_level(self, root: str, rule: ExcludeRule, dirs: list[str]
                          ) -> tuple[str, list[Record], str]:
        """One ``LIST_OP`` over ``dirs``: (status, records, stderr)."""
        proc, err = await self._start(script(self.tools, root, LIST_OP, rule.dir_names))
        # Written while the output is read: neither side may block on a full pipe.
        writer = asyncio.create_task(self._feed(proc, level_input(dirs)))
        try:
            out = Lines(proc)
            status = await out.line()
            data = await out.rest() if status == "D" else b""
            await writer
        except BaseException:
            self._abandon(proc, err, writer)
            raise
        stderr_text = ""
        try:
            await proc.wait()
            stderr_text = (await err).decode("utf-8", "surrogateescape")
        finally:
            self._running.discard(proc)
        records = parse_records(data, self.tools.flavour) if status == "D" else []
        return status or "", records, stderr_text

    @staticmethod
    async def _feed(proc: RemoteProcess, data: bytes) -> None:
        await proc.write(data)
        await proc.write_eof()

    async def _clean(self, root: str, stale: list[str]) -> None:
        """Remove temp files left by filesync runs that are gone, as the helper's walk does.

        Only ever run after a cut connection left some (one more command, then).
        """
        proc, err = await self._start(script(self.tools, root, CLEAN_OP))
        try:
            await proc.write("".join(
                f"{posixpath.dirname(rel) or '.'}\t{posixpath.basename(rel)}\n" for rel in stale
            ).encode("utf-8", "surrogateescape"))
            await proc.write_eof()
            await Lines(proc).rest()
        except BaseException:
            self._abandon(proc, err)
            raise
        await self._finish(proc, err)

    def _listing(self, root: str, rule: ExcludeRule, records: list[Record],
                 stderr_text: str) -> Listing:
        """The listing of ``records`` (and find's complaints); remembers what was listed."""
        listing, self._listed[root], self._stale[root] = build_listing(
            root, rule, records, stderr_text)
        return listing

    async def fetch(self, root: str, paths: Sequence[str], sink: FetchSink) -> None:
        """Stream ``paths`` into ``sink`` through one remote ``tar -c``; see the module doc."""
        wanted: dict[str, Listed | None] = {}
        for rel in dict.fromkeys(paths):
            if unsafe_reason(rel) is not None:
                sink.failed(rel, describe(Reason.UNSAFE_PATH))
            else:
                wanted[rel] = self._listed.get(root, {}).get(rel)
        if not wanted:
            return
        nonce = secrets.token_hex(16).encode()
        # Unlisted paths are stat'ed by the same command right before tar reads them: the
        # header then has the remote's exact mtime (a tar header has whole seconds), and
        # the file is checked against that stat as against a listing.
        unlisted = None in wanted.values()
        proc, err = await self._start(script(self.tools, root, FETCH_OP))
        try:
            request = nonce + (b"\n1\n" if unlisted else b"\n0\n") + "".join(
                f"./{rel}\n" for rel in wanted).encode("utf-8", "surrogateescape")
            await proc.write(request)
            await proc.write_eof()
            head = Lines(proc)
            pre: list[str] = []
            while (line := await head.line()) != f"{nonce.decode()} pre":
                if line is None:
                    raise ConnectionLost("the remote fetch ended before its tar stream "
                                         "(connection lost?); rerun")
                pre.append(line)
            for rel, stat in stat_lines("\n".join(pre), self.tools.flavour).items():
                if rel in wanted and wanted[rel] is None:
                    wanted[rel] = Listed(*stat)
            parser = TarFetch(wanted, sink)
            bridge = Bridge(proc, asyncio.get_running_loop(), bytes(head.buf))
            await bridge.feed(parser)
            rest = Lines(proc)
            region = bridge.tail + await rest.rest()
        except BaseException:
            self._abandon(proc, err)
            raise
        stderr_line = await self._finish(proc, err)
        end = trailer(region, nonce)
        if end is None:
            raise ConnectionLost(
                "the remote tar stream ended without its trailer (connection lost?); "
                "rerun to continue, nothing was half-applied"
                if not stderr_line else f"remote fetch failed: {stderr_line}; rerun"
            )
        _code, lines = end
        errors = tar_errors([ln[2:] for ln in lines if ln.startswith("E ")])
        post = stat_lines("\n".join(lines), self.tools.flavour)
        parser.finish(post, errors)

    async def send(self, root: str, items: Iterable[SendItem],
                   count: int | None = None) -> list[Outcome]:
        """Upload ``items`` in one tar stream; each is renamed into place only if unchanged.

        (``count`` is not needed here: every item is numbered as it comes.)"""
        results: dict[int, Outcome] = {}
        numbered: list[tuple[int, SendItem, str]] = []
        total = 0
        for i, item in enumerate(items, 1):
            total = i
            if unsafe_reason(item.path) is not None:
                results[i] = _failed(item.path, Reason.UNSAFE_PATH)
            elif not self.tools.mv_t:
                results[i] = _failed(item.path, Reason.OS_ERROR, _NO_MV_T)
            else:
                exp = "-" if item.expect is None else self._token(root, item.path, *item.expect)
                numbered.append((i, item, exp))
        if numbered:
            results.update(await self._upload(root, numbered))
        elif total == 0:
            await self._make_root(root)
        return [results[i] for i in range(1, total + 1)]

    async def _upload(
        self, root: str, numbered: list[tuple[int, SendItem, str]]
    ) -> dict[int, Outcome]:
        head = f"{len(numbered)}\n"
        head += "".join(f"{exp}\t./{item.path}\n" for _i, item, exp in numbered)
        proc, err = await self._start(script(self.tools, root, SEND_OP))
        out = Lines(proc)
        # Written while the verdicts are read: neither side may block on a full pipe.
        writer = asyncio.create_task(proc.write(head.encode("utf-8", "surrogateescape")))
        try:
            refused: dict[int, str] = {}
            pid = ""
            while (line := await out.line()) is not None:
                if line.startswith("V "):
                    _v, num, reason = line.split(" ", 2)
                    refused[int(num)] = reason
                elif line.startswith(("READY ", "ROOTERR ")):
                    pid = line
                    break
            await writer
            if not pid.startswith("READY "):
                await proc.write_eof()
                await out.rest()
                stderr_line = await self._finish(proc, err)
                if pid.startswith("ROOTERR "):
                    detail = pid[len("ROOTERR "):] or "cannot create the remote root"
                    return {i: _failed(item.path, Reason.OS_ERROR, detail)
                            for i, item, _e in numbered}
                raise self._broken("an upload", stderr_line)
            remote_pid = pid.split(" ", 1)[1]
            if not remote_pid.isdigit():
                raise self._broken("an upload", f"unexpected answer {pid[:40]!r}")
            sent, local_errors = await self._stream(proc, remote_pid, numbered, refused)
            await proc.write_eof()
            lines = (await out.rest()).decode("utf-8", "surrogateescape").splitlines()
        except BaseException:
            self._abandon(proc, err, writer)
            raise
        stderr_line = await self._finish(proc, err)
        return self._send_results(numbered, refused, local_errors, sent, lines, remote_pid,
                                  stderr_line)

    async def _stream(self, proc: RemoteProcess, pid: str,
                      numbered: list[tuple[int, SendItem, str]], refused: dict[int, str]
                      ) -> tuple[dict[int, int], dict[int, str]]:
        """Write the tar stream: the manifest, each file under its temp name, the end mark,
        every member a single name in the root (see ``posix_scripts``, point 2).

        The manifest lists every file that is about to follow; a file whose local read
        fails is left out of the stream and comes back "missing" (its error is kept here).
        """
        sent: dict[int, int] = {}
        local_errors: dict[int, str] = {}
        total = 0

        async def put(data: bytes) -> None:
            nonlocal total
            total += len(data)
            await proc.write(data)

        todo = [(i, item, exp) for i, item, exp in numbered if i not in refused]
        manifest = "".join(
            f"{i}\t{exp}\t{posixpath.dirname(item.path) or '.'}\t{posixpath.basename(item.path)}\n"
            for i, item, exp in todo) + "END\n"
        data = manifest.encode("utf-8", "surrogateescape")
        await put(header(_temp(pid, 0), len(data), 0o600, 0) + data
                  + b"\0" * (-len(data) % 512))
        for i, item, _exp in todo:
            with tempfile.SpooledTemporaryFile(max_size=_SPOOL_MEMORY) as spool:
                try:
                    for chunk in item.chunks():
                        spool.write(chunk)
                except OSError as exc:
                    local_errors[i] = f"local read failed: {exc.strerror or exc}"
                    continue
                size = spool.tell()
                spool.seek(0)
                await put(header(_temp(pid, i), size, item.mode, item.mtime_ns))
                while chunk := spool.read(CHUNK):
                    await put(chunk)
                await put(b"\0" * (-size % 512))
            sent[i] = size
        end = header(_temp(pid, len(numbered) + 1), 0, 0o600, 0)
        end += b"\0" * 1024  # end-of-archive, then padding to whole tar records
        await put(end + b"\0" * (-(total + len(end)) % _RECORD))
        return sent, local_errors

    def _send_results(self, numbered: list[tuple[int, SendItem, str]], refused: dict[int, str],
                      local_errors: dict[int, str], sent: dict[int, int], lines: list[str],
                      pid: str, stderr_line: str) -> dict[int, Outcome]:
        status = statuses(lines)
        tar_lines = [ln[2:] for ln in lines if ln.startswith("E ")]
        aborted, done = "ABORT" in lines, "DONE" in lines
        if not aborted and not done:
            raise ConnectionLost(
                "the remote upload ended without its results (connection lost?); "
                "rerun to continue, nothing was half-applied"
                if not stderr_line else f"remote upload failed: {stderr_line}; rerun"
            )
        not_written = tar_errors(tar_lines)
        stats = stat_lines("\n".join(lines), self.tools.flavour)
        out: dict[int, Outcome] = {}
        for i, item, _exp in numbered:
            temp = _temp(pid, i)
            if i in refused:
                out[i] = _failed(item.path, *result_reason(refused[i]))
            elif i in local_errors:
                out[i] = _failed(item.path, Reason.OS_ERROR, local_errors[i])
            elif aborted:
                causes = [ln for ln in tar_lines if "previous errors" not in ln]
                why = causes[0] if causes else "stream cut short"
                out[i] = _failed(item.path, Reason.OS_ERROR,
                                 f"remote tar did not get the whole stream ({why})")
            else:
                state, reason = status.get(i, ("missing", ""))
                if state == Status.OK:
                    size, mtime_ns, _tok = stats.get(temp, (sent.get(i, 0), 0, ""))
                    out[i] = Outcome(item.path, Status.OK, size, mtime_ns)
                elif state == Status.CHANGED:
                    out[i] = Outcome(item.path, Status.CHANGED, reason=describe(Reason.CHANGED),
                                     code=Reason.CHANGED)
                elif state == Status.ERROR:
                    out[i] = _failed(item.path, *result_reason(reason or "os rename failed"))
                else:
                    code, text = not_written.get(temp, (Reason.OS_ERROR,
                                                        "not written on the remote"))
                    out[i] = _failed(item.path, code, text)
        return out

    async def delete(self, root: str, files: Sequence[Entry]) -> list[Outcome]:
        """Delete files that are still as listed; others come back ``changed``."""
        files = [e for e in files if e.kind == FILE]
        results: dict[int, Outcome] = {}
        asked: list[tuple[int, Entry]] = []
        for i, e in enumerate(files, 1):
            if unsafe_reason(e.path) is not None:
                results[i] = _failed(e.path, Reason.UNSAFE_PATH)
            else:
                asked.append((i, e))
        if asked:
            request = "".join(
                f"{self._token(root, e.path, e.size, e.mtime_ns)}\t"
                f"{posixpath.dirname(e.path) or '.'}\t{posixpath.basename(e.path)}\n"
                for _i, e in asked
            ).encode("utf-8", "surrogateescape")
            proc, err = await self._start(script(self.tools, root, DELETE_OP))

            async def feed() -> None:
                await proc.write(request)
                await proc.write_eof()

            # Written while the answers are read: neither side may block on a full pipe.
            writer = asyncio.create_task(feed())
            try:
                lines = (await Lines(proc).rest()).decode("utf-8", "surrogateescape")
                await writer
            except BaseException:
                self._abandon(proc, err, writer)
                raise
            stderr_line = await self._finish(proc, err)
            results.update(self._delete_results(asked, lines.splitlines(), stderr_line))
        return [results[i] for i in range(1, len(files) + 1)]

    def _delete_results(self, asked: list[tuple[int, Entry]], lines: list[str],
                        stderr_line: str) -> dict[int, Outcome]:
        if "GONE" in lines:
            return {i: Outcome(e.path, Status.OK) for i, e in asked}
        if "NOTDIR" in lines:
            return {i: _failed(e.path, Reason.OS_ERROR, "the remote root is not a directory")
                    for i, e in asked}
        if "DONE" not in lines:
            raise ConnectionLost(
                "the remote delete ended without its results (connection lost?); rerun"
                if not stderr_line else f"remote delete failed: {stderr_line}; rerun"
            )
        status = statuses(lines)
        out: dict[int, Outcome] = {}
        for i, e in asked:
            state, reason = status.get(i, (Status.ERROR, "os no answer from the remote"))
            if state == Status.OK:
                out[i] = Outcome(e.path, Status.OK)
            elif state == Status.CHANGED:
                out[i] = Outcome(e.path, Status.CHANGED, reason=describe(Reason.CHANGED),
                                 code=Reason.CHANGED)
            else:
                out[i] = _failed(e.path, *result_reason(reason or "os not removed"))
        return out

    async def close(self) -> None:
        """Stop any command still running (an operation was interrupted); never raises."""
        for proc in list(self._running):
            with contextlib.suppress(Exception):
                proc.kill()
        self._running.clear()


_NO_MV_T = ("the remote's mv has no -T (it could move a file into a directory swapped in "
            "meanwhile); install python3 there (preferred) or GNU coreutils")


def _failed(path: str, code: Reason, detail: str = "") -> Outcome:
    """An ``error`` outcome for ``code``, its text derived from it (and ``detail``)."""
    return Outcome(path, Status.ERROR, reason=describe(code, detail), code=code)


def _temp(pid: str, n: int) -> str:
    """The name of this run's ``n``-th temp file, a single name in the root."""
    return f".filesync.{pid}.{n}.tmp"
