"""The remote helper's framed protocol, driven in-process over a pair of pipes.

``serve`` runs in a thread exactly as it runs on the remote (binary streams in and
out); the test is the client and speaks the frame format from helper.py's docstring.
"""

from __future__ import annotations

import errno
import io
import json
import os
import struct
import subprocess
import sys
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import pytest

from filesync.core.exclude import ExcludeRule
from filesync.tree.server import serve
from filesync.tree.wire import CHUNK, PROTOCOL, WHOLE_HEAD, whole_head

HEADER = struct.Struct(">cI")


def frame(kind: bytes, payload: bytes) -> bytes:
    return HEADER.pack(kind, len(payload)) + payload


def jframe(obj: dict[str, Any], kind: bytes = b"J") -> bytes:
    return frame(kind, json.dumps(obj).encode())


@dataclass
class Fetched:
    header: dict[str, Any]
    data: bytes = b""
    end: dict[str, Any] = field(default_factory=dict)


@dataclass
class Upload:
    path: str
    data: bytes
    mode: int = 0o644
    mtime_ns: int = 1_600_000_000_000_000_000
    expect: list[int] | None = None
    abort: str | None = None  # end the file with ok=False and this error


class Client:
    """The client end of one helper process (a thread here)."""

    def __init__(self) -> None:
        c2s_r, c2s_w = os.pipe()
        s2c_r, s2c_w = os.pipe()
        self.out: BinaryIO = os.fdopen(c2s_w, "wb")
        self.inp: BinaryIO = os.fdopen(s2c_r, "rb")
        self._server_in = os.fdopen(c2s_r, "rb")
        self._server_out = os.fdopen(s2c_w, "wb")
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.hello = self.reply()

    def _run(self) -> None:
        try:
            serve(self._server_in, self._server_out)
        except BaseException as exc:  # inspected by the tests
            self.error = exc
        finally:
            self._server_out.close()
            self._server_in.close()

    # -- frames ------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        self.out.write(data)
        self.out.flush()

    def read_frame(self) -> tuple[bytes, bytes]:
        head = self.inp.read(HEADER.size)
        assert len(head) == HEADER.size, "helper closed its output"
        kind, length = HEADER.unpack(head)
        payload = self.inp.read(length)
        assert len(payload) == length
        return kind, payload

    def reply(self) -> dict[str, Any]:
        kind, payload = self.read_frame()
        assert kind in (b"J", b"Z"), kind
        if kind == b"Z":
            payload = zlib.decompress(payload)
        obj: dict[str, Any] = json.loads(payload)
        return obj

    def request(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.write(jframe(obj))
        return self.reply()

    def finish(self) -> None:
        """End input and wait for the helper to return."""
        if not self.out.closed:
            self.out.close()
        self.thread.join(30)
        assert not self.thread.is_alive()
        self.inp.close()

    # -- operations --------------------------------------------------------------------

    def list_tree(self, root: Path, rule: ExcludeRule | None = None) -> dict[str, Any]:
        wire = (rule or ExcludeRule.build(default_excludes=False)).wire()
        return self.request({"op": "list", "root": str(root), **wire})

    def fetch(self, root: Path, paths: list[str]) -> list[Fetched]:
        self.write(jframe({"op": "fetch", "root": str(root), "paths": paths}))
        return self.fetch_rest()

    def fetch_rest(self) -> list[Fetched]:
        out: list[Fetched] = []
        while True:
            kind, payload = self.read_frame()
            if kind == b"J":
                assert json.loads(payload) == {"done": True}
                return out
            assert kind == b"H", kind
            item = Fetched(json.loads(payload))
            out.append(item)
            if "error" in item.header:
                continue
            chunks = []
            while True:
                kind, payload = self.read_frame()
                if kind == b"E":
                    item.end = json.loads(payload)
                    break
                assert kind == b"D"
                chunks.append(payload)
            item.data = b"".join(chunks)

    def send_frames(self, root: Path, files: list[Upload]) -> bytes:
        buf = io.BytesIO()
        buf.write(jframe({"op": "send", "root": str(root), "count": len(files)}))
        for f in files:
            head = {"path": f.path, "mode": f.mode, "mtime_ns": f.mtime_ns, "expect": f.expect}
            buf.write(jframe(head, b"H"))
            for i in range(0, len(f.data), CHUNK // 2):
                buf.write(frame(b"D", f.data[i : i + CHUNK // 2]))
            end = {"ok": True} if f.abort is None else {"ok": False, "error": f.abort}
            buf.write(jframe(end, b"E"))
        return buf.getvalue()

    def send(self, root: Path, files: list[Upload]) -> list[list[Any]]:
        self.write(self.send_frames(root, files))
        results: list[list[Any]] = self.reply()["results"]
        return results

    def delete(self, root: Path, files: list[tuple[str, int, int]]) -> list[list[Any]]:
        results: list[list[Any]] = self.request(
            {"op": "delete", "root": str(root), "files": [list(f) for f in files]}
        )["results"]
        return results


@pytest.fixture
def client() -> Iterator[Client]:
    c = Client()
    yield c
    c.finish()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "root"
    r.mkdir()
    return r


def put(root: Path, rel: str, data: bytes = b"data", mode: int = 0o644) -> Path:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    p.chmod(mode)
    return p


def temp_files(top: Path) -> list[str]:
    return sorted(
        str(p.relative_to(top)) for p in top.rglob("*") if p.name.startswith(".filesync.")
    )


def as_listed(rel: str, p: Path) -> tuple[str, int, int]:
    """A delete request entry: the path with the size and mtime it was listed with."""
    st = p.stat()
    return rel, st.st_size, st.st_mtime_ns


def expect_of(p: Path) -> list[int]:
    st = p.stat()
    return [st.st_size, st.st_mtime_ns]


# -- session -----------------------------------------------------------------------------


def test_the_shipped_helper_answers_bye_then_ends_at_once(tmp_path: Path) -> None:
    """The helper as the remote runs it (the bootstrap, the bundle on stdin): its last
    reply is out whole, and it exits 0 right after, without the interpreter's teardown
    (a 100k-file helper would first free every listing row it remembers)."""
    from filesync.tree.bundle import bootstrap_command, payload

    bye = json.dumps({"op": "bye"}).encode()
    stdin = payload() + struct.pack(">cI", b"J", len(bye)) + bye
    done = subprocess.run(["sh", "-c", bootstrap_command()], input=stdin, cwd=tmp_path,
                          capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    replies, out = [], done.stdout
    while out:
        kind, length = struct.unpack(">cI", out[:5])
        if kind == b"J":
            replies.append(json.loads(out[5:5 + length]))
        out = out[5 + length:]
    assert replies[0]["hello"] == PROTOCOL and replies[-1] == {"bye": True}
    assert done.stderr == b""


def _descriptor_table_size(pid: int | str) -> int:
    """How many descriptors the process's table holds now (Linux: ``FDSize``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("FDSize:"):
            return int(line.split()[1])
    raise AssertionError("no FDSize")


def test_the_shipped_helper_holds_a_batch_s_descriptors_before_its_first_request(
        tmp_path: Path) -> None:
    """Its table is grown at start, with one thread (``server._reserve_descriptors``): no
    upload's opens grow it later, when each doubling waits for an RCU grace period."""
    from filesync.tree.bundle import bootstrap_command, payload
    from filesync.tree.dirfd import batch_descriptors

    proc = subprocess.Popen(["sh", "-c", bootstrap_command()], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, cwd=tmp_path)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(payload())
        proc.stdin.flush()
        kind, length = struct.unpack(">cI", proc.stdout.read(5))
        hello = json.loads(proc.stdout.read(length))
        assert kind == b"J" and hello["hello"] == PROTOCOL
        assert _descriptor_table_size(hello["pid"]) >= batch_descriptors() > 64
    finally:
        proc.stdin.close()
        assert proc.wait(60) == 0


def test_reserving_descriptors_grows_the_table_and_leaves_nothing_open() -> None:
    code = ("import os; from filesync.tree.server import _reserve_descriptors; "
            "before = sorted(os.listdir('/proc/self/fd')); _reserve_descriptors(500); "
            "after = sorted(os.listdir('/proc/self/fd')); "
            "size = [l for l in open('/proc/self/status') if l.startswith('FDSize')][0]; "
            "print(before == after, size.split()[1])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True, stdin=subprocess.DEVNULL)
    same, size = done.stdout.split()
    assert same == "True" and int(size) >= 500


def test_hello_then_bye(client: Client) -> None:
    assert client.hello == {"hello": PROTOCOL, "cwd": os.getcwd(),
                            "home": os.path.expanduser("~"), "pid": os.getpid()}
    assert client.request({"op": "bye"}) == {"bye": True}
    client.thread.join(30)
    assert not client.thread.is_alive()
    assert client.error is None


def test_end_of_input_ends_the_helper_quietly(client: Client) -> None:
    client.out.close()
    client.thread.join(30)
    assert not client.thread.is_alive()
    assert client.error is None


def test_a_truncated_request_frame_ends_the_helper(client: Client) -> None:
    client.write(jframe({"op": "list", "root": "/"})[:-3])
    client.out.close()
    client.thread.join(30)
    assert not client.thread.is_alive()
    assert client.error is None


@pytest.mark.parametrize("req", [{"op": "frobnicate"}, {"noop": 1}, {"op": None}])
def test_unknown_op_is_answered_and_the_session_continues(
    client: Client, root: Path, req: dict[str, Any]
) -> None:
    reply = client.request(req)
    assert set(reply) == {"error"}
    assert reply["error"].startswith("unknown op")
    assert str(req.get("op")) in reply["error"]
    put(root, "f.txt")
    assert [e[0] for e in client.list_tree(root)["entries"]] == ["f.txt"]


def test_an_os_error_in_a_handler_is_answered(client: Client, tmp_path: Path) -> None:
    client.write(jframe({"op": "fetch", "root": str(tmp_path / "missing"), "paths": ["x"]}))
    reply = client.reply()
    assert reply["errno"] == errno.ENOENT
    assert reply["error"] == os.strerror(errno.ENOENT)
    assert client.request({"op": "bye"}) == {"bye": True}


def test_an_undecodable_request_is_answered_then_the_helper_stops(client: Client) -> None:
    client.write(frame(b"J", b"{not json"))
    reply = client.reply()
    assert reply["error"].startswith("bad request")
    client.thread.join(30)
    assert not client.thread.is_alive()


# -- list ----------------------------------------------------------------------------------


def test_list_applies_the_rule_and_reports_skips(client: Client, root: Path) -> None:
    put(root, "SKILL.md", b"# skill")
    exe = put(root, "scripts/run.sh", b"#!/bin/sh\n", 0o755)
    put(root, "node_modules/x/index.js")
    put(root, "debug.log")
    (root / "link").symlink_to(root / "SKILL.md")
    reply = client.list_tree(root, ExcludeRule.build(["*.log"]))
    assert reply["root"] == str(root)
    assert reply["exists"] is True and reply["is_dir"] is True
    entries = {e[0]: e for e in reply["entries"]}
    assert set(entries) == {"SKILL.md", "scripts/run.sh"}
    st = exe.stat()
    assert entries["scripts/run.sh"] == [
        "scripts/run.sh",
        "f",
        st.st_size,
        st.st_mtime_ns,
        0o755,
        st.st_ino,
        1,
    ]
    assert reply["skipped"] == [["link", "symlink", ""]]
    assert reply["excluded"] == 2


def test_list_of_a_missing_root(client: Client, tmp_path: Path) -> None:
    reply = client.list_tree(tmp_path / "nope")
    assert reply == {"root": str(tmp_path / "nope"), "exists": False, "is_dir": False}


def test_list_of_a_root_that_is_a_file(client: Client, tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"")
    reply = client.list_tree(tmp_path / "file")
    assert reply["exists"] is True and reply["is_dir"] is False
    assert "entries" not in reply


# -- fetch ----------------------------------------------------------------------------------


def test_fetch_sends_content_and_metadata(client: Client, root: Path) -> None:
    big = os.urandom(CHUNK * 2 + 12345)
    put(root, "big.bin", big, 0o600)
    small = put(root, "d/small.sh", b"echo hi\n", 0o755)
    os.utime(small, ns=(1, 1_500_000_000_123_456_789))
    put(root, "empty", b"")
    got = client.fetch(root, ["big.bin", "d/small.sh", "empty"])
    assert [f.header["path"] for f in got] == ["big.bin", "d/small.sh", "empty"]
    assert got[0].data == big and got[0].header["size"] == len(big)
    assert got[0].header["mode"] == 0o600
    assert got[1].data == b"echo hi\n"
    assert got[1].header["mode"] == 0o755
    assert got[1].header["mtime_ns"] == 1_500_000_000_123_456_789
    assert got[2].data == b""
    assert all(f.end == {"ok": True} for f in got)


def test_fetch_errors_are_per_file(client: Client, root: Path, tmp_path: Path) -> None:
    put(root, "ok.txt", b"fine")
    os.mkfifo(root / "fifo")
    (root / "sub").mkdir()
    outside = put(tmp_path, "outside/secret.txt", b"secret")
    (root / "filelink").symlink_to(outside)
    paths = [
        "missing.txt", "fifo", "sub", "../outside/secret.txt", str(outside),
        "filelink", "ok.txt/x", "ok.txt",
    ]  # fmt: skip
    got = {f.header["path"]: f for f in client.fetch(root, paths)}
    errors = {p: (f.header.get("error"), f.header.get("detail", "")) for p, f in got.items()}
    assert errors == {
        "missing.txt": ("os-error", os.strerror(errno.ENOENT)),
        "fifo": ("not-regular", ""),
        "sub": ("not-regular", ""),
        "../outside/secret.txt": ("unsafe-path", ""),
        str(outside): ("unsafe-path", ""),
        "filelink": ("symlink-in-path", ""),
        "ok.txt/x": ("parent-not-a-directory", ""),
        "ok.txt": (None, ""),
    }
    assert got["ok.txt"].data == b"fine"
    assert all(b"secret" not in f.data for f in got.values())


def test_fetch_refuses_a_symlinked_parent(client: Client, root: Path, tmp_path: Path) -> None:
    outside = put(tmp_path, "outside/secret.txt", b"secret")
    (root / "dirlink").symlink_to(outside.parent, target_is_directory=True)
    (root / "d").mkdir()
    (root / "d" / "inner").symlink_to(outside.parent, target_is_directory=True)
    got = client.fetch(root, ["dirlink/secret.txt", "d/inner/secret.txt"])
    assert [f.header["path"] for f in got] == ["dirlink/secret.txt", "d/inner/secret.txt"]
    assert all("error" in f.header for f in got)
    assert all(f.data == b"" and f.end == {} for f in got)  # no content was sent


def test_fetch_reports_a_torn_read(client: Client, root: Path) -> None:
    # Bigger than the pipe buffer: the helper is still reading when the file changes.
    path = put(root, "growing.bin", os.urandom(CHUNK * 4))
    client.write(jframe({"op": "fetch", "root": str(root), "paths": ["growing.bin"]}))
    kind, payload = client.read_frame()
    assert kind == b"H"
    header = json.loads(payload)
    os.utime(path, ns=(1, header["mtime_ns"] + 1_000_000_000))
    while True:
        kind, payload = client.read_frame()
        if kind == b"E":
            break
        assert kind == b"D"
    assert json.loads(payload) == {"ok": False, "error": "torn"}
    assert client.reply() == {"done": True}


# -- send -----------------------------------------------------------------------------------


def test_send_writes_content_mode_and_mtime(client: Client, root: Path) -> None:
    data = os.urandom(CHUNK + 99)
    results = client.send(root, [
        Upload("run.sh", b"#!/bin/sh\n", mode=0o755, mtime_ns=1_234_567_890_123_456_789),
        Upload("blob.bin", data, mode=0o600, mtime_ns=1_000_000_000_000_000_001),
        Upload("empty", b"", mode=0o640),
    ])  # fmt: skip
    assert results == [
        ["run.sh", "ok", 10, 1_234_567_890_123_456_789],
        ["blob.bin", "ok", len(data), 1_000_000_000_000_000_001],
        ["empty", "ok", 0, 1_600_000_000_000_000_000],
    ]
    st = (root / "run.sh").stat()
    assert (st.st_mode & 0o7777, st.st_mtime_ns) == (0o755, 1_234_567_890_123_456_789)
    assert (root / "run.sh").read_bytes() == b"#!/bin/sh\n"
    assert (root / "blob.bin").read_bytes() == data
    assert (root / "blob.bin").stat().st_mode & 0o7777 == 0o600
    assert (root / "empty").read_bytes() == b""
    assert temp_files(root) == []


def whole(head: dict[str, Any], data: bytes) -> bytes:
    """A ``W`` frame: a small upload's header and bytes in one frame."""
    expect = head["expect"]
    encoded = whole_head(head["path"], head["mode"], head["mtime_ns"],
                         None if expect is None else (expect[0], expect[1]))
    assert encoded is not None
    return frame(b"W", encoded + data)


def test_send_takes_whole_files_in_one_frame_between_streamed_ones(
    client: Client, root: Path
) -> None:
    head = {"path": "small/a.txt", "mode": 0o640, "mtime_ns": 1_234_567_890_123_456_789,
            "expect": None}
    client.write(jframe({"op": "send", "root": str(root), "count": 3})
                 + whole(head, b"small file\n")
                 + jframe({"path": "big.bin", "mode": 0o644, "mtime_ns": 7, "expect": None},
                          b"H") + frame(b"D", b"x" * 100) + jframe({"ok": True}, b"E")
                 + whole({**head, "path": "empty"}, b""))
    assert client.reply()["results"] == [
        ["small/a.txt", "ok", 11, 1_234_567_890_123_456_789], ["big.bin", "ok", 100, 7],
        ["empty", "ok", 0, 1_234_567_890_123_456_789]]
    st = (root / "small" / "a.txt").stat()
    assert (st.st_mode & 0o7777, st.st_mtime_ns) == (0o640, 1_234_567_890_123_456_789)
    assert (root / "small" / "a.txt").read_bytes() == b"small file\n"
    assert (root / "empty").read_bytes() == b"" and temp_files(root) == []
    # A W frame is held to the same rules as H: an unsafe path is refused, not written.
    client.write(jframe({"op": "send", "root": str(root), "count": 1})
                 + whole({**head, "path": "../escape.txt"}, b"no"))
    assert client.reply()["results"][0][:3] == ["../escape.txt", "error", "unsafe-path"]
    assert not (root.parent / "escape.txt").exists()


OLD_HEAD = b'{"path": "a", "mode": 420, "mtime_ns": 1, "expect": null}'


@pytest.mark.parametrize("kind, payload", [
    (b"W", b"\x00\x00"),  # shorter than its header
    (b"W", WHOLE_HEAD.pack(50, 0o644, 1, 0, 0, 0) + b"a"),  # a path running past the frame
    (b"W", WHOLE_HEAD.pack(1, 0o644, 1, 7, 0, 0) + b"a"),  # an expect flag not 0 or 1
    # protocol 1's whole-file frame: a client of another version is refused, never misread
    (b"F", struct.pack(">I", len(OLD_HEAD)) + OLD_HEAD + b"data"),
], ids=["short", "past-frame", "bad-expect-flag", "protocol-1-frame"])
def test_a_malformed_whole_file_frame_is_refused_and_writes_nothing(
    client: Client, root: Path, kind: bytes, payload: bytes
) -> None:
    client.write(jframe({"op": "send", "root": str(root), "count": 1}) + frame(kind, payload))
    assert client.reply()["error"].startswith("bad request")
    client.thread.join(30)
    assert not client.thread.is_alive()  # the framing is not trusted any more
    assert list(root.iterdir()) == []


def test_send_replaces_a_file_only_if_unchanged(client: Client, root: Path) -> None:
    target = put(root, "f.txt", b"old")
    seen = expect_of(target)
    stale = [seen[0], seen[1] + 1]
    results = client.send(root, [
        Upload("f.txt", b"lost", expect=stale),
        Upload("f.txt", b"lost too", expect=None),  # "absent" is not what is there
        Upload("gone.txt", b"lost three", expect=[3, 5]),  # expected a file that is absent
    ])  # fmt: skip
    assert [r[:2] for r in results] == [
        ["f.txt", "changed"],
        ["f.txt", "changed"],
        ["gone.txt", "changed"],
    ]
    assert target.read_bytes() == b"old"
    assert not (root / "gone.txt").exists()
    assert temp_files(root) == []
    assert client.send(root, [Upload("f.txt", b"new", expect=seen)])[0][:2] == ["f.txt", "ok"]
    assert target.read_bytes() == b"new"


def test_send_creates_parents_without_chmodding_existing_ones(
    client: Client, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    root.mkdir(mode=0o700)
    root.chmod(0o700)
    private = root / "private"
    private.mkdir()
    private.chmod(0o700)
    shared = root / "shared"
    shared.mkdir()
    shared.chmod(0o775)
    results = client.send(root, [
        Upload("private/new/deeper/f.txt", b"1"),
        Upload("private/g.txt", b"2"),
        Upload("shared/h.txt", b"3"),
        Upload("fresh/a/b.txt", b"4"),
    ])  # fmt: skip
    assert [r[1] for r in results] == ["ok"] * 4
    assert root.stat().st_mode & 0o7777 == 0o700
    assert private.stat().st_mode & 0o7777 == 0o700
    assert shared.stat().st_mode & 0o7777 == 0o775
    assert (private / "new/deeper/f.txt").read_bytes() == b"1"
    assert (root / "fresh/a/b.txt").read_bytes() == b"4"
    assert (root / "fresh").is_dir() and (private / "new/deeper").is_dir()


def test_send_creates_a_missing_root(client: Client, tmp_path: Path) -> None:
    root = tmp_path / "new" / "root"
    assert client.send(root, [Upload("f", b"x")]) == [["f", "ok", 1, 1_600_000_000_000_000_000]]
    assert (root / "f").read_bytes() == b"x"


@pytest.mark.parametrize("rel", ["../x", "a/../../x", "/abs/x", "", "a//b", "./a"])
def test_send_refuses_unsafe_paths(client: Client, tmp_path: Path, rel: str) -> None:
    root = tmp_path / "root"
    root.mkdir()
    if rel.startswith("/"):
        rel = str(tmp_path / "abs" / "x")
    results = client.send(root, [Upload(rel, b"evil"), Upload("fine.txt", b"ok")])
    assert results[0] == [rel, "error", "unsafe-path", ""]
    assert results[1][:2] == ["fine.txt", "ok"]
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["fine.txt", "root"]


def test_send_refuses_to_write_through_a_symlinked_parent(
    client: Client, root: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "link").symlink_to(outside, target_is_directory=True)
    (root / "real").mkdir()
    (root / "real" / "inner").symlink_to(outside, target_is_directory=True)
    results = client.send(root, [Upload("link/x", b"evil"), Upload("real/inner/y/z", b"evil")])
    assert [r[:2] for r in results] == [["link/x", "error"], ["real/inner/y/z", "error"]]
    assert list(outside.iterdir()) == []
    assert temp_files(tmp_path) == []


def test_send_does_not_replace_a_symlink_or_write_through_it(
    client: Client, root: Path, tmp_path: Path
) -> None:
    outside = put(tmp_path, "outside.txt", b"precious")
    (root / "f").symlink_to(outside)
    results = client.send(root, [Upload("f", b"evil", expect=expect_of(outside))])
    assert results[0][:2] == ["f", "changed"]
    assert (root / "f").is_symlink()
    assert outside.read_bytes() == b"precious"
    assert temp_files(tmp_path) == []


def test_send_under_a_file_is_refused(client: Client, root: Path) -> None:
    put(root, "f.txt")
    assert client.send(root, [Upload("f.txt/x", b"1")]) == [
        ["f.txt/x", "error", "parent-not-a-directory", ""]
    ]


def test_failed_sends_leave_no_temp_files(client: Client, root: Path) -> None:
    put(root, "dir/unlisted", b"excluded or new: never listed")
    (root / "empty").mkdir()
    put(root, "f.txt", b"old")
    results = client.send(root, [
        Upload("aborted.txt", b"partial", abort="read error on the host"),
        Upload("dir", b"a dir is in the way"),
        Upload("empty", b"an empty dir makes way"),
        Upload("f.txt", b"new", expect=[999, 999]),
        Upload("ok.txt", b"fine"),
    ])  # fmt: skip
    assert results[0] == ["aborted.txt", "error", "os-error", "read error on the host"]
    # A directory holding anything is never replaced, and is not "changed" (issue 23).
    assert results[1] == ["dir", "error", "dir-in-the-way", ""]
    assert results[2][:2] == ["empty", "ok"] and (root / "empty").read_bytes() == (
        b"an empty dir makes way")
    assert results[3][:2] == ["f.txt", "changed"]
    assert results[4][:2] == ["ok.txt", "ok"]
    assert not (root / "aborted.txt").exists()
    assert (root / "dir" / "unlisted").read_bytes() == b"excluded or new: never listed"
    assert temp_files(root) == []


def test_stream_ending_mid_file_leaves_no_temp_file(client: Client, root: Path) -> None:
    (root / "d").mkdir()
    frames = client.send_frames(root, [Upload("d/f.bin", os.urandom(5000))])
    client.write(frames[: len(frames) - 200])  # cut inside the data frame
    client.out.close()
    client.thread.join(30)
    assert not client.thread.is_alive()
    assert client.error is None or isinstance(client.error, EOFError)
    assert temp_files(root) == []
    assert not (root / "d" / "f.bin").exists()


def test_stream_ending_between_files_leaves_no_temp_file(client: Client, root: Path) -> None:
    frames = client.send_frames(root, [Upload("a", b"1"), Upload("b", b"2")])
    first_file_end = frames.index(b"E") + HEADER.size + len(b'{"ok": true}')
    client.write(frames[:first_file_end])
    client.out.close()
    client.thread.join(30)
    assert not client.thread.is_alive()
    assert client.error is None or isinstance(client.error, EOFError)
    assert temp_files(root) == []
    assert (root / "a").read_bytes() == b"1"  # the complete first file was committed
    assert not (root / "b").exists()


def test_unwritable_root_keeps_the_protocol_in_step(client: Client, tmp_path: Path) -> None:
    blocker = put(tmp_path, "blocker", b"")
    results = client.send(blocker / "root", [Upload("a", b"1"), Upload("b", b"2")])
    assert [r[:2] for r in results] == [["a", "error"], ["b", "error"]]
    # the data frames were consumed: the next request is understood
    root = tmp_path / "ok"
    assert client.send(root, [Upload("c", b"3")])[0][:2] == ["c", "ok"]


# -- delete ----------------------------------------------------------------------------------


def test_delete_prunes_emptied_parents_but_never_the_root(client: Client, root: Path) -> None:
    deep = put(root, "a/b/c/deep.txt")
    top = put(root, "top.txt")
    results = client.delete(root, [as_listed("a/b/c/deep.txt", deep), as_listed("top.txt", top)])
    assert results == [["a/b/c/deep.txt", "ok"], ["top.txt", "ok"]]
    assert root.is_dir()
    assert list(root.iterdir()) == []


def test_delete_keeps_parents_that_are_not_empty(client: Client, root: Path) -> None:
    f = put(root, "a/b/f.txt")
    put(root, "a/keep.txt")
    (root / "a" / "b" / "emptydir").mkdir()
    assert client.delete(root, [as_listed("a/b/f.txt", f)]) == [["a/b/f.txt", "ok"]]
    assert (root / "a" / "b" / "emptydir").is_dir()
    assert (root / "a" / "keep.txt").exists()


def test_delete_refuses_a_changed_file(client: Client, root: Path) -> None:
    f = put(root, "d/f.txt", b"v1")
    size, mtime = expect_of(f)
    results = client.delete(root, [("d/f.txt", size, mtime + 1)])
    assert results[0][:2] == ["d/f.txt", "changed"]
    assert f.read_bytes() == b"v1"


def test_delete_of_something_already_gone_is_ok(client: Client, root: Path) -> None:
    assert client.delete(root, [("nope.txt", 1, 1), ("no/such/dir.txt", 1, 1)]) == [
        ["nope.txt", "ok"],
        ["no/such/dir.txt", "ok"],
    ]


def test_delete_refuses_unsafe_and_symlinked_paths(
    client: Client, root: Path, tmp_path: Path
) -> None:
    secret = put(tmp_path, "outside/secret.txt", b"s")
    (root / "link").symlink_to(secret.parent, target_is_directory=True)
    size, mtime = expect_of(secret)
    results = client.delete(root, [
        ("../outside/secret.txt", size, mtime),
        (str(secret), size, mtime),
        ("link/secret.txt", size, mtime),
    ])  # fmt: skip
    assert secret.exists()
    assert (root / "link").is_symlink()
    assert results[:2] == [
        ["../outside/secret.txt", "error", "unsafe-path", ""],
        [str(secret), "error", "unsafe-path", ""],
    ]
    assert results[2][:2] == ["link/secret.txt", "error"]


def test_a_symlinked_parent_is_reported_as_a_symlink(
    client: Client, root: Path, tmp_path: Path
) -> None:
    """ELOOP maps to "symlink-in-path"; a symlinked *parent* dir must get the same code."""
    secret = put(tmp_path, "outside/secret.txt", b"s")
    (root / "link").symlink_to(secret.parent, target_is_directory=True)
    reason = "symlink-in-path"
    fetched = client.fetch(root, ["link/secret.txt"])
    sent = client.send(root, [Upload("link/new.txt", b"x")])
    deleted = client.delete(root, [as_listed("link/secret.txt", secret)])
    assert {
        "fetch": fetched[0].header.get("error"),
        "send": sent[0][2],
        "delete": deleted[0][2],
    } == {"fetch": reason, "send": reason, "delete": reason}
