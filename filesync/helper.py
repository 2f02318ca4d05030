"""The filesync remote helper: stdlib only, sent to the remote over stdin.

This module is both imported by the local side (``Matcher`` and ``walk`` are the
one exclusion algorithm and the one tree walk, used for the host tree too) and
executed on the remote side by ``python3 -c`` with its source fed on stdin, where
``serve`` answers requests of the framed protocol below on stdin/stdout.

Frames: one kind byte, a 4-byte big-endian length, the payload.
``J`` JSON object, ``Z`` zlib-compressed JSON object, ``H`` per-file header (JSON),
``D`` raw data chunk, ``E`` end of one file (JSON).

Guarantees of the remote side:
- nothing outside the root is read or written: every path is opened component by
  component with ``O_NOFOLLOW`` relative to the root's descriptor;
- a replaced file is written to a temp name in its directory, fsynced and renamed,
  and only if it still has the size and mtime the client saw (else "changed");
- existing directories are never chmodded; created ones get the default mode.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
import struct
import sys
import zlib
from collections.abc import Callable
from typing import IO, Any

PROTOCOL = 1
CHUNK = 1 << 20
TEMP_PREFIX = ".filesync."
TEMP_SUFFIX = ".tmp"
_TEMP_RE = re.compile(r"^\.filesync\.(\d+)\.\d+\.tmp$")
_HEADER = struct.Struct(">cI")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class Matcher:
    """The exclusion rule: directory names pruned at any depth plus gitignore regexes.

    ``patterns`` are ``(regex, include)`` pairs compiled by pathspec's GitIgnoreSpec;
    ``matches`` applies the same priority rule as pathspec's GitIgnoreSpec backend.
    """

    def __init__(self, names: list[str], patterns: list[tuple[str, bool]]) -> None:
        self.names = frozenset(names)
        self.patterns = [(re.compile(rx), include) for rx, include in patterns]

    def matches(self, rel: str, is_dir: bool) -> bool:
        """True if ``rel`` itself (not its parents) is excluded."""
        if is_dir and rel.rsplit("/", 1)[-1] in self.names:
            return True
        if not self.patterns:
            return False
        target = rel + "/" if is_dir else rel
        result = False
        priority = 0
        for regex, include in self.patterns:
            match = regex.match(target)
            if match is None:
                continue
            dir_mark = any(v for k, v in match.groupdict().items() if k.startswith("ps_d"))
            this = 1 if dir_mark else 2
            if (include and dir_mark) or this >= priority:
                result, priority = include, this
        return result

    def excluded(self, rel: str, is_dir: bool) -> bool:
        """True if ``rel`` or any of its parent directories is excluded."""
        parts = rel.split("/")
        for i in range(1, len(parts)):
            if self.matches("/".join(parts[:i]), True):
                return True
        return self.matches(rel, is_dir)


def is_temp_name(name: str) -> bool:
    """True for filesync's own in-flight temp files, which are never synced."""
    return _TEMP_RE.match(name) is not None


def _stale_temp(name: str) -> bool:
    match = _TEMP_RE.match(name)
    if match is None:
        return False
    try:
        os.kill(int(match.group(1)), 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def walk(root: str, matcher: Matcher) -> tuple[list[list[Any]], list[list[str]], int]:
    """List regular files under ``root``, pruning excluded dirs before descending.

    Returns ``(entries, skipped, excluded)``: entries are
    ``[rel, "f", size, mtime_ns, mode, ino, nlink]``; skipped are ``[rel, reason]``
    for symlinks and special files; ``excluded`` counts pruned paths. Stale temp
    files of dead filesync processes are removed on the way.
    """
    entries: list[list[Any]] = []
    skipped: list[list[str]] = []
    excluded = 0
    stack = [(root, "")]
    while stack:
        path, prefix = stack.pop()
        try:
            it = os.scandir(path)
        except OSError as exc:
            skipped.append([prefix.rstrip("/") or ".", f"unreadable directory: {exc.strerror}"])
            continue
        with it:
            for entry in it:
                rel = prefix + entry.name
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                mode = st.st_mode
                if stat.S_ISDIR(mode):
                    if matcher.matches(rel, True):
                        excluded += 1
                    else:
                        stack.append((entry.path, rel + "/"))
                elif matcher.matches(rel, False):
                    excluded += 1
                elif stat.S_ISREG(mode):
                    if is_temp_name(entry.name):
                        if _stale_temp(entry.name):
                            _unlink_quiet(entry.path)
                        continue
                    entries.append(
                        [rel, "f", st.st_size, st.st_mtime_ns, mode & 0o7777, st.st_ino,
                         st.st_nlink]
                    )
                elif stat.S_ISLNK(mode):
                    skipped.append([rel, "symlink (not followed)"])
                else:
                    skipped.append([rel, "special file (fifo, socket or device)"])
    return entries, skipped, excluded


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _unlink_quiet(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def split_rel(rel: str) -> list[str]:
    """Split a relative POSIX path, refusing anything that could leave the root."""
    if not rel or "\0" in rel or rel.startswith("/"):
        raise ValueError("unsafe path")
    parts = rel.split("/")
    for part in parts:
        if part in ("", ".", ".."):
            raise ValueError("unsafe path")
    return parts


def open_parent(root_fd: int, parts: list[str], create: bool) -> int:
    """Open the directory holding ``parts[-1]`` without following any symlink."""
    fd = os.dup(root_fd)
    try:
        for part in parts[:-1]:
            try:
                nfd = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o777, dir_fd=fd)
                nfd = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except NotADirectoryError:
                # Linux says ENOTDIR for O_DIRECTORY|O_NOFOLLOW on a symlink: name it.
                st = _stat_at(fd, part)
                if st is not None and stat.S_ISLNK(st.st_mode):
                    raise OSError(errno.ELOOP, "symlink in path", part) from None
                raise
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


def _stat_at(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def unchanged(st: os.stat_result | None, expect: list[int] | None) -> bool:
    """True if the target is as the client saw it: absent, or a file of that size/mtime."""
    if expect is None:
        return st is None
    if st is None or not stat.S_ISREG(st.st_mode):
        return False
    return st.st_size == expect[0] and st.st_mtime_ns == expect[1]


#: Reasons that mean "refused for safety", not "failed": the path is skipped.
SAFETY_REASONS = frozenset(
    {"unsafe path", "symlink in path (not followed)", "a parent is not a directory"}
)


def _reason(exc: BaseException) -> str:
    if not isinstance(exc, OSError):
        return "unsafe path"
    if exc.errno == errno.ELOOP:
        return "symlink in path (not followed)"
    if exc.errno == errno.ENOTDIR:
        return "a parent is not a directory"
    return exc.strerror or str(exc)


class BadRequest(Exception):
    """The client sent something this helper cannot parse: the stream is not trusted."""


class Channel:
    """Framed I/O over a pair of binary streams."""

    def __init__(self, inp: IO[bytes], out: IO[bytes]) -> None:
        self.inp = inp
        self.out = out

    def read_frame(self) -> tuple[bytes, bytes] | None:
        head = self.inp.read(_HEADER.size)
        if len(head) < _HEADER.size:
            return None
        kind, length = _HEADER.unpack(head)
        payload = self.inp.read(length)
        if len(payload) < length:
            return None
        return kind, payload

    def read_json(self) -> tuple[bytes, dict[str, Any]] | None:
        """The next frame decoded as a JSON object (``{}`` for ``D``); ``None`` at EOF.

        Raises ``BadRequest`` for a payload that is not a (compressed) JSON object.
        """
        frame = self.read_frame()
        if frame is None:
            return None
        kind, payload = frame
        if kind == b"D":
            return kind, {}
        try:
            if kind == b"Z":
                payload = zlib.decompress(payload)
            obj = json.loads(payload.decode("utf-8", "surrogateescape"))
        except (ValueError, zlib.error, RecursionError) as exc:
            raise BadRequest(f"undecodable {kind!r} frame") from exc
        if not isinstance(obj, dict):
            raise BadRequest(f"{kind!r} frame is not a JSON object")
        return kind, obj

    def write(self, kind: bytes, payload: bytes) -> None:
        self.out.write(_HEADER.pack(kind, len(payload)))
        self.out.write(payload)

    def send_json(self, obj: dict[str, Any], kind: bytes = b"J") -> None:
        data = json.dumps(obj, separators=(",", ":")).encode("utf-8", "surrogateescape")
        if kind == b"Z":
            data = zlib.compress(data, 6)
        self.write(kind, data)
        self.out.flush()


class Server:
    """Answers list/fetch/send/delete requests for one root."""

    def __init__(self, chan: Channel) -> None:
        self.chan = chan
        self.counter = 0

    def root_fd(self, root: str, create: bool) -> int:
        path = os.path.abspath(os.path.expanduser(root))
        if create:
            os.makedirs(path, exist_ok=True)
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))

    def op_list(self, req: dict[str, Any]) -> None:
        root = os.path.abspath(os.path.expanduser(req["root"]))
        reply: dict[str, Any] = {"root": root, "exists": os.path.lexists(root)}
        reply["is_dir"] = os.path.isdir(root)
        if reply["is_dir"]:
            matcher = Matcher(req["names"], [(r, bool(i)) for r, i in req["patterns"]])
            entries, skipped, excluded = walk(root, matcher)
            reply.update(entries=entries, skipped=skipped, excluded=excluded)
        self.chan.send_json(reply, b"Z")

    def op_fetch(self, req: dict[str, Any]) -> None:
        rfd = self.root_fd(req["root"], False)
        try:
            for rel in req["paths"]:
                self._send_one(rfd, rel)
        finally:
            os.close(rfd)
        self.chan.send_json({"done": True})

    def _send_one(self, rfd: int, rel: str) -> None:
        try:
            parts = split_rel(rel)
            pfd = open_parent(rfd, parts, False)
            try:
                fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=pfd)
            finally:
                os.close(pfd)
        except (OSError, ValueError) as exc:
            self.chan.send_json({"path": rel, "error": _reason(exc)}, b"H")
            return
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                self.chan.send_json({"path": rel, "error": "not a regular file"}, b"H")
                return
            head = {"path": rel, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                    "mode": st.st_mode & 0o7777}
            self.chan.send_json(head, b"H")
            while chunk := os.read(fd, CHUNK):
                self.chan.write(b"D", chunk)
            after = os.fstat(fd)
            torn = (after.st_size, after.st_mtime_ns) != (st.st_size, st.st_mtime_ns)
            end = {"ok": False, "error": "changed while being read"} if torn else {"ok": True}
            self.chan.send_json(end, b"E")
        finally:
            os.close(fd)

    def op_send(self, req: dict[str, Any]) -> None:
        results: list[list[Any]] = []
        try:
            rfd, error = self.root_fd(req["root"], True), ""
        except OSError as exc:
            # Keep consuming the stream so that the protocol stays in step.
            rfd, error = -1, _reason(exc)
        try:
            for _ in range(req["count"]):
                frame = self.chan.read_json()
                if frame is None or frame[0] != b"H":
                    raise EOFError("stream ended mid-send")
                results.append(self._receive_one(rfd, frame[1], error))
        finally:
            if rfd >= 0:
                os.close(rfd)
        self.chan.send_json({"results": results}, b"Z")

    def _receive_one(self, rfd: int, head: dict[str, Any], error: str) -> list[Any]:
        rel: Any = head.get("path")
        mode: Any = head.get("mode")
        mtime_ns: Any = head.get("mtime_ns")
        expect: Any = head.get("expect")
        if not (isinstance(rel, str) and _is_int(mode) and _is_int(mtime_ns) and (
            expect is None
            or (isinstance(expect, list) and len(expect) == 2 and all(map(_is_int, expect)))
        )):
            raise BadRequest("malformed file header")
        sink = _TempFile(rfd, rel, self._temp_name(), error)
        while True:
            frame = self.chan.read_frame()
            if frame is None:
                sink.abort()
                raise EOFError("stream ended mid-file")
            kind, payload = frame
            if kind == b"D":
                sink.write(payload)
                continue
            try:
                end = json.loads(payload) if kind == b"E" else None
            except (ValueError, RecursionError):
                end = None
            if not isinstance(end, dict):
                sink.abort()
                raise BadRequest("expected a D or E frame inside a file")
            if not end.get("ok"):
                sink.abort()
                return [rel, "error", end.get("error", "aborted by client")]
            return sink.commit(mode, mtime_ns, expect)

    def _temp_name(self) -> str:
        self.counter += 1
        return f"{TEMP_PREFIX}{os.getpid()}.{self.counter}{TEMP_SUFFIX}"

    def op_delete(self, req: dict[str, Any]) -> None:
        results: list[list[Any]] = []
        rfd = self.root_fd(req["root"], False)
        try:
            for rel, size, mtime_ns in req["files"]:
                results.append(delete_file(rfd, rel, [size, mtime_ns]))
        finally:
            os.close(rfd)
        self.chan.send_json({"results": results}, b"Z")


class _TempFile:
    """A temp file beside the target, committed by rename only if the target is unchanged."""

    def __init__(self, rfd: int, rel: str, temp: str, error: str) -> None:
        self.rel, self.temp = rel, temp
        self.error = error
        self.pfd = -1
        self.fd = -1
        if error:
            return
        try:
            self.parts = split_rel(rel)
            self.pfd = open_parent(rfd, self.parts, True)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
            self.fd = os.open(temp, flags, 0o600, dir_fd=self.pfd)
        except (OSError, ValueError) as exc:
            self.error = _reason(exc)
            self._close()

    def write(self, data: bytes) -> None:
        if self.error:
            return
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self.fd, view):]
        except OSError as exc:
            self.error = _reason(exc)
            self.abort()

    def commit(self, mode: int, mtime_ns: int, expect: list[int] | None) -> list[Any]:
        if self.error:
            self.abort()
            return [self.rel, "error", self.error]
        try:
            os.fchmod(self.fd, mode & 0o7777)
            os.fsync(self.fd)
            os.utime(self.fd, ns=(mtime_ns, mtime_ns))
            st = os.fstat(self.fd)
            if not unchanged(_stat_at(self.pfd, self.parts[-1]), expect):
                self.abort()
                return [self.rel, "changed", "changed on the remote during the run"]
            os.rename(self.temp, self.parts[-1], src_dir_fd=self.pfd, dst_dir_fd=self.pfd)
        except OSError as exc:
            self.abort()
            return [self.rel, "error", _reason(exc)]
        self._close()
        return [self.rel, "ok", st.st_size, st.st_mtime_ns]

    def abort(self) -> None:
        if self.pfd >= 0:
            with contextlib.suppress(OSError):
                os.unlink(self.temp, dir_fd=self.pfd)
        self._close()

    def _close(self) -> None:
        for fd in (self.fd, self.pfd):
            if fd >= 0:
                os.close(fd)
        self.fd = self.pfd = -1


def delete_file(rfd: int, rel: str, expect: list[int]) -> list[Any]:
    """Unlink ``rel`` if it is still as listed; prune directories it leaves empty."""
    try:
        parts = split_rel(rel)
        pfd = open_parent(rfd, parts, False)
    except FileNotFoundError:
        return [rel, "ok"]
    except (OSError, ValueError) as exc:
        return [rel, "error", _reason(exc)]
    try:
        st = _stat_at(pfd, parts[-1])
        if st is None:
            return [rel, "ok"]
        if not unchanged(st, expect):
            return [rel, "changed", "changed on the remote during the run"]
        os.unlink(parts[-1], dir_fd=pfd)
    except OSError as exc:
        return [rel, "error", _reason(exc)]
    finally:
        os.close(pfd)
    prune_empty_dirs(rfd, parts[:-1])
    return [rel, "ok"]


def prune_empty_dirs(rfd: int, dirs: list[str]) -> None:
    """Remove now-empty parent directories, deepest first, never the root."""
    while dirs:
        try:
            pfd = open_parent(rfd, dirs, False)
        except OSError:
            return
        try:
            os.rmdir(dirs[-1], dir_fd=pfd)
        except OSError:
            return
        finally:
            os.close(pfd)
        dirs = dirs[:-1]


def serve(inp: IO[bytes], out: IO[bytes]) -> None:
    """Answer requests until ``bye`` or end of input."""
    chan = Channel(inp, out)
    server = Server(chan)
    ops: dict[str, Callable[[dict[str, Any]], None]] = {
        "list": server.op_list,
        "fetch": server.op_fetch,
        "send": server.op_send,
        "delete": server.op_delete,
    }
    chan.send_json({"hello": PROTOCOL, "cwd": os.getcwd(), "pid": os.getpid()})
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
        if op == "bye":
            chan.send_json({"bye": True})
            return
        handler = ops.get(op) if isinstance(op, str) else None
        if handler is None:
            chan.send_json({"error": f"unknown op {str(op)[:100]!r}"})
            continue
        try:
            handler(req)
        except OSError as exc:
            chan.send_json({"error": _reason(exc), "errno": exc.errno or 0})
        except EOFError:
            return
        except Exception as exc:  # a malformed request: answer once, then stop
            chan.send_json({"error": f"bad request: {type(exc).__name__}"})
            return


if __name__ == "__main__":
    with contextlib.suppress(EOFError, BrokenPipeError, KeyboardInterrupt):
        serve(sys.stdin.buffer, sys.stdout.buffer)
