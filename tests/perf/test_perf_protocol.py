"""Correctness of the protocol's performance changes (no timings are asserted here).

- uploads are gathered into few large writes, big chunks pass straight through;
- the helper keeps directory descriptors across the files of one request, without ever
  following a symlink swapped in meanwhile, and recreates a directory removed meanwhile;
- fetched files are gathered into few writes too;
- ``HelperEndpoint.start(list_first=...)`` pipelines the listing behind the helper;
- ``--via`` works for argv-preserving prefixes and for ssh-like ones that join their
  arguments into one line for a shell (``ssh HOST``), and ``~/`` means the remote's home;
- importing the SSH transport does not look for liboqs and restores ``find_library``.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from synctree import Pair, skills_tree, snapshot, write

from filesync.core.exclude import ExcludeRule
from filesync.endpoint.contract import FetchHeader, FetchSink, SendItem
from filesync.endpoint.helper import HelperEndpoint
from filesync.transport.base import Conduit, RemoteProcess
from filesync.transport.local import CommandConduit, command_argv, local_conduit
from filesync.tree import dirfd, paths, server, wire
from filesync.tree.wire import DIRECT as DIRECT_AT  # the size past which data goes straight through
from filesync.tree.wire import FLUSH_AT

HEADER = struct.Struct(">cI")
RULE = ExcludeRule.build(default_excludes=False)
MTIME = 1_600_000_000_123_456_789


def frame(kind: bytes, payload: bytes) -> bytes:
    return HEADER.pack(kind, len(payload)) + payload


def jframe(obj: dict[str, Any], kind: bytes = b"J") -> bytes:
    return frame(kind, json.dumps(obj).encode())


def upload_frames(rel: str, data: bytes, mode: int = 0o644) -> bytes:
    head = {"path": rel, "mode": mode, "mtime_ns": MTIME, "expect": None}
    return jframe(head, b"H") + frame(b"D", data) + jframe({"ok": True}, b"E")


# -- a conduit that counts the writes of its processes ------------------------------------


class CountingConduit(Conduit):
    """The local conduit, recording the size of every ``write`` to a process."""

    def __init__(self) -> None:
        self.inner = local_conduit()
        self.identity = "local"
        self.writes: list[int] = []

    async def start(self, command: str) -> RemoteProcess:
        proc = await self.inner.start(command)
        real_write = proc.write

        async def write(data: bytes) -> None:
            self.writes.append(len(data))
            await real_write(data)

        proc.write = write  # type: ignore[method-assign]
        return proc

    async def close(self) -> None:
        await self.inner.close()


def item(path: str, data: bytes, chunk: int = 1 << 20, mode: int = 0o644) -> SendItem:
    def chunks() -> Iterator[bytes]:
        for i in range(0, len(data), chunk):
            yield data[i : i + chunk]

    return SendItem(path, mode, MTIME, None, chunks)


def test_upload_gathers_small_files_into_few_writes(tmp_path: Path) -> None:
    root = tmp_path / "r"
    files = {f"d{i % 7}/sub{i % 3}/f{i}.txt": os.urandom(100 + i * 7) for i in range(600)}
    big = os.urandom(3 * (1 << 20) + 123)

    async def main() -> tuple[list[Any], list[int]]:
        conduit = CountingConduit()
        session = await HelperEndpoint.start(conduit)
        try:
            conduit.writes.clear()
            items = [item(p, d) for p, d in sorted(files.items())]
            items.insert(300, item("big/blob.bin", big, chunk=1 << 20, mode=0o755))
            outcomes = await session.send(str(root), items)
            return outcomes, list(conduit.writes)
        finally:
            await session.close()
            await conduit.close()

    outcomes, writes = asyncio.run(main())
    assert [o.status for o in outcomes] == ["ok"] * 601
    assert {o.path: o.size for o in outcomes} == {
        **{p: len(d) for p, d in files.items()}, "big/blob.bin": len(big)}
    assert all(o.mtime_ns == MTIME for o in outcomes)
    files["big/blob.bin"] = big
    assert snapshot(root) == files
    assert (root / "big" / "blob.bin").stat().st_mode & 0o777 == 0o755
    small_bytes = sum(len(d) for p, d in files.items() if p != "big/blob.bin")
    # 1,803 frames (plus the request) of small files: a handful of gathered writes, and
    # the 1 MiB chunks of the big file each on their own (4 of them), never ~1,800 writes.
    assert len(writes) <= small_bytes // FLUSH_AT + 2 + 2 * 4 + 2
    assert sum(1 for w in writes if w >= DIRECT_AT) >= 4


def test_upload_failure_mid_file_keeps_the_stream_in_step(tmp_path: Path) -> None:
    root = tmp_path / "r"

    def failing() -> Iterator[bytes]:
        yield b"x" * 1000
        raise PermissionError(13, "Permission denied")

    async def main() -> list[Any]:
        conduit = local_conduit()
        session = await HelperEndpoint.start(conduit)
        try:
            items = [item("a.txt", b"a"), SendItem("bad.txt", 0o644, MTIME, None, failing),
                     item("b.txt", os.urandom(DIRECT_AT * 2), chunk=DIRECT_AT)]
            outcomes = await session.send(str(root), items)
            outcomes += await session.send(str(root), [item("c.txt", b"c")])
            return outcomes
        finally:
            await session.close()
            await conduit.close()

    outcomes = asyncio.run(main())
    assert [(o.path, o.status) for o in outcomes] == [
        ("a.txt", "ok"), ("bad.txt", "error"), ("b.txt", "ok"), ("c.txt", "ok")]
    assert "local read failed" in outcomes[1].reason
    assert sorted(snapshot(root)) == ["a.txt", "b.txt", "c.txt"]


# -- the helper, in a thread over pipes ----------------------------------------------------


class Helper:
    """``server.serve`` in a thread, fed frame by frame."""

    def __init__(self) -> None:
        c2s_r, c2s_w = os.pipe()
        s2c_r, s2c_w = os.pipe()
        self.out = os.fdopen(c2s_w, "wb")
        self.inp = os.fdopen(s2c_r, "rb")
        self._sin = os.fdopen(c2s_r, "rb")
        self._sout = os.fdopen(s2c_w, "wb")
        self.reads = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.hello = self.reply()

    def _run(self) -> None:
        try:
            server.serve(self._sin, self._sout)
        finally:
            self._sout.close()
            self._sin.close()

    def write(self, data: bytes) -> None:
        self.out.write(data)
        self.out.flush()

    def frame(self) -> tuple[bytes, bytes]:
        kind, length = HEADER.unpack(self.inp.read(HEADER.size))
        return kind, self.inp.read(length)

    def reply(self) -> dict[str, Any]:
        kind, payload = self.frame()
        assert kind in (b"J", b"Z")
        if kind == b"Z":
            import zlib

            payload = zlib.decompress(payload)
        obj: dict[str, Any] = json.loads(payload)
        return obj

    def finish(self) -> None:
        self.out.close()
        self.thread.join(30)
        self.inp.close()


@pytest.fixture
def served() -> Iterator[Helper]:
    h = Helper()
    yield h
    h.finish()


@pytest.fixture
def one_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each uploaded file committed as it arrives (a batch of one), so that a test can act
    between one file's rename and the next file's write, which the directory descriptors
    a request keeps must survive; batches of more only widen the gap."""
    monkeypatch.setattr(dirfd.Batch, "LIMIT", 1)


def wait_for(path: Path) -> None:
    deadline = time.monotonic() + 60  # generous: a loaded machine is slow, never wrong
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)


def test_send_in_any_order_across_directories(served: Helper, tmp_path: Path) -> None:
    root = tmp_path / "r"
    names = ["a/b/c/1", "a/2", "z/3", "a/b/4", "a/b/c/d/5", "6", "a/b/c/7", "z/y/8", "a/9"]
    served.write(jframe({"op": "send", "root": str(root), "count": len(names)}))
    for n in names:
        served.write(upload_frames(n, n.encode()))
    results = served.reply()["results"]
    assert [r[:2] for r in results] == [[n, "ok"] for n in names]
    assert snapshot(root) == {n: n.encode() for n in names}
    assert not [p for p in root.rglob("*") if p.name.startswith(dirfd.TEMP_PREFIX)]


def test_a_symlink_swapped_in_between_files_is_never_followed(
    served: Helper, tmp_path: Path, one_at_a_time: None
) -> None:
    root, outside = tmp_path / "r", tmp_path / "outside"
    outside.mkdir()
    served.write(jframe({"op": "send", "root": str(root), "count": 3}))
    served.write(upload_frames("a/b/one", b"1"))
    wait_for(root / "a" / "b" / "one")
    # The directory the helper has open is moved away and a symlink takes its name.
    (root / "a" / "b").rename(root / "a" / "moved")
    (root / "a" / "b").symlink_to(outside)
    served.write(upload_frames("a/b/two", b"2"))
    served.write(upload_frames("a/c/three", b"3"))
    results = served.reply()["results"]
    assert list(outside.iterdir()) == []
    assert results[0][:2] == ["a/b/one", "ok"]
    # "two" landed in the directory it had open (still inside the root), or was refused.
    if results[1][1] == "ok":
        assert (root / "a" / "moved" / "two").read_bytes() == b"2"
    else:
        assert results[1][1] == "error"
    assert results[2][:2] == ["a/c/three", "ok"]

    # A fresh request opens the path afresh and refuses the symlink.
    served.write(jframe({"op": "send", "root": str(root), "count": 1}))
    served.write(upload_frames("a/b/four", b"4"))
    [row] = served.reply()["results"]
    assert row[1] == "error" and "symlink" in row[2]
    assert list(outside.iterdir()) == []


def test_a_directory_removed_between_files_is_created_again(
    served: Helper, tmp_path: Path, one_at_a_time: None
) -> None:
    root = tmp_path / "r"
    served.write(jframe({"op": "send", "root": str(root), "count": 2}))
    served.write(upload_frames("a/b/one", b"1"))
    wait_for(root / "a" / "b" / "one")
    (root / "a" / "b" / "one").unlink()
    (root / "a" / "b").rmdir()
    (root / "a").rmdir()
    served.write(upload_frames("a/b/two", b"2"))
    results = served.reply()["results"]
    assert [r[:2] for r in results] == [["a/b/one", "ok"], ["a/b/two", "ok"]]
    assert snapshot(root) == {"a/b/two": b"2"}


def test_the_target_is_rechecked_right_before_each_rename(
    served: Helper, tmp_path: Path, one_at_a_time: None
) -> None:
    root = tmp_path / "r"
    write(root / "d" / "x", "old")
    st = (root / "d" / "x").stat()
    served.write(jframe({"op": "send", "root": str(root), "count": 2}))
    served.write(upload_frames("d/first", b"1"))
    wait_for(root / "d" / "first")
    write(root / "d" / "x", "changed meanwhile")
    head = {"path": "d/x", "mode": 0o644, "mtime_ns": MTIME,
            "expect": [st.st_size, st.st_mtime_ns]}
    served.write(jframe(head, b"H") + frame(b"D", b"new") + jframe({"ok": True}, b"E"))
    results = served.reply()["results"]
    assert results[1][:2] == ["d/x", "changed"]
    assert (root / "d" / "x").read_text() == "changed meanwhile"


def test_fetch_gathers_frames_and_keeps_per_file_errors(
    served: Helper, tmp_path: Path
) -> None:
    root = tmp_path / "r"
    files = {f"d{i % 5}/f{i}": os.urandom(i * 13) for i in range(200)}
    files["big"] = os.urandom(wire.CHUNK + 5)
    for rel, data in files.items():
        write(root / rel, data)
    os.symlink("/etc/passwd", root / "d0" / "link")
    paths = [*sorted(files), "d0/link", "missing/x", "../up"]
    real_write = served._sout.write
    writes: list[int] = []

    def counting_write(data: Any) -> int:
        writes.append(len(data))
        return real_write(data)

    served._sout.write = counting_write  # type: ignore[method-assign]
    served.write(jframe({"op": "fetch", "root": str(root), "paths": paths}))
    got: dict[str, bytes] = {}
    errors: dict[str, str] = {}
    while True:
        kind, payload = served.frame()
        if kind == b"J":
            assert json.loads(payload) == {"done": True}
            break
        head = json.loads(payload)
        if "error" in head:
            errors[head["path"]] = head["error"]
            continue
        chunks = []
        while (f := served.frame())[0] == b"D":
            chunks.append(f[1])
        assert f[0] == b"E" and json.loads(f[1]) == {"ok": True}
        assert head["size"] == sum(map(len, chunks))
        got[head["path"]] = b"".join(chunks)
    assert got == files
    assert set(errors) == {"d0/link", "missing/x", "../up"}
    # ~400 small frames and one 1 MiB chunk: far fewer writes than frames.
    assert len(writes) < 20


# -- pipelined listing ---------------------------------------------------------------------


def test_list_first_is_answered_by_the_matching_list_tree(tmp_path: Path) -> None:
    root = tmp_path / "r"
    write(root / "a.txt", "a")
    write(root / "node_modules" / "x.js", "x")

    async def main() -> None:
        conduit = local_conduit()
        rel = os.path.relpath(root)  # relative: resolved against the helper's cwd
        session = await HelperEndpoint.start(conduit, list_first=(rel, ExcludeRule.build()))
        try:
            resolved = session.resolve_root(rel)
            assert resolved == str(root)
            listing = await session.list_tree(resolved, ExcludeRule.build())
            assert sorted(listing.entries) == ["a.txt"] and listing.excluded == 1
            # Later lists are plain requests.
            listing = await session.list_tree(resolved, RULE)
            assert sorted(listing.entries) == ["a.txt", "node_modules/x.js"]
        finally:
            await session.close()
            await conduit.close()

    asyncio.run(main())


def test_list_first_with_another_rule_or_root_is_dropped(tmp_path: Path) -> None:
    root, other = tmp_path / "r", tmp_path / "other"
    write(root / "node_modules" / "x.js", "x")
    write(other / "o.txt", "o")

    async def main() -> None:
        conduit = local_conduit()
        try:
            early = (str(root), ExcludeRule.build())
            session = await HelperEndpoint.start(conduit, list_first=early)
            listing = await session.list_tree(str(root), RULE)
            assert sorted(listing.entries) == ["node_modules/x.js"]
            await session.close()
            session = await HelperEndpoint.start(conduit, list_first=(str(other), RULE))
            listing = await session.list_tree(str(root), RULE)
            assert sorted(listing.entries) == ["node_modules/x.js"]
            await session.close()
        finally:
            await conduit.close()

    asyncio.run(main())


class Sink(FetchSink):
    def __init__(self) -> None:
        self.got: dict[str, bytes] = {}

    def begin(self, head: FetchHeader) -> Any:
        self.got[head.path] = b""

        def put(data: bytes) -> None:
            self.got[head.path] += data

        return put

    def end(self, head: FetchHeader, ok: bool, reason: str) -> None:
        assert ok, reason

    def failed(self, path: str, reason: str) -> None:
        raise AssertionError(reason)


def test_an_unread_early_listing_is_skipped_by_other_requests(tmp_path: Path) -> None:
    root = tmp_path / "r"
    write(root / "a.txt", "a")

    async def main() -> None:
        conduit = local_conduit()
        try:
            for op in ("fetch", "send", "delete", "close"):
                session = await HelperEndpoint.start(conduit, list_first=(str(root), RULE))
                if op == "fetch":
                    sink = Sink()
                    await session.fetch(str(root), ["a.txt"], sink)
                    assert sink.got == {"a.txt": b"a"}
                elif op == "send":
                    [out] = await session.send(str(root), [item("b.txt", b"b")])
                    assert out.status == "ok"
                elif op == "delete":
                    listing = await session.list_tree(str(root), RULE)  # (the early one)
                    [out] = await session.delete(str(root), [listing.entries["b.txt"]])
                    assert out.status == "ok"
                await session.close()
                assert not session.broken
        finally:
            await conduit.close()

    asyncio.run(main())
    assert snapshot(root) == {"a.txt": b"a"}


# -- --via and ~ ---------------------------------------------------------------------------

#: Runs its arguments as they are, like ``docker exec -i NAME``.
ARGV_PREFIX = ["sh", "-c", 'exec "$@"', "x"]
#: Joins its arguments with spaces for a shell to parse again, like ``ssh HOST``.
JOINING_PREFIX = ["sh", "-c", 'exec sh -c "$*"', "x"]


@pytest.mark.parametrize("prefix", [[], ARGV_PREFIX, JOINING_PREFIX, ["env"]])
def test_command_argv_survives_both_kinds_of_prefix(prefix: list[str]) -> None:
    command = "printf '%s|' \"a b\" 'it'\"'\"'s' '$HOME' '\\' \"$0\"; echo; cat"
    argv = command_argv(prefix, command)
    out = subprocess.run(argv, input=b"stdin\n", capture_output=True, check=True).stdout
    assert out.split(b"|")[:4] == [b"a b", b"it's", b"$HOME", b"\\"]
    assert out.endswith(b"\nstdin\n")


class ViaPair(Pair):
    def __init__(self, local: Path, remote: Path, state: Path, via: str, spec: str) -> None:
        super().__init__(local, remote, state)
        self.via, self.spec = via, spec

    def run(self, command: str, *extra: str, remote: str | None = None) -> tuple[int, Any]:
        return super().run(command, "--via", self.via, *extra, remote=remote or self.spec)


@pytest.mark.parametrize("prefix", [ARGV_PREFIX, JOINING_PREFIX])
def test_via_push_and_pull_through_either_kind_of_prefix(
    tmp_path: Path, prefix: list[str]
) -> None:
    local, remote = tmp_path / "local", tmp_path / "remote"
    skills_tree(local)
    pair = ViaPair(local, remote, tmp_path / "state", shlex.join(prefix), str(remote))
    report = pair.ok("push")
    assert report["uploaded"] > 0 and snapshot(remote) == {
        p: b for p, b in snapshot(local).items() if not p.startswith(".hub/")}
    write(remote / "pdf" / "SKILL.md", "remote edit\n")
    assert pair.ok("pull")["downloaded"] == 1
    assert (local / "pdf" / "SKILL.md").read_text() == "remote edit\n"


def test_tilde_means_the_remote_home_and_relative_means_its_cwd(tmp_path: Path) -> None:
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    local = tmp_path / "local"
    write(local / "a.txt", "a")
    # A prefix whose shell has HOME=home but runs in cwd (like docker exec's WORKDIR).
    enter = f'cd {shlex.quote(str(cwd))} && exec "$@"'
    via = shlex.join(["env", f"HOME={home}", "sh", "-c", enter, "x"])
    for spec, where in (("~/dest", home / "dest"), ("~", home), ("rel/dest", cwd / "rel" / "dest")):
        pair = ViaPair(local, where, tmp_path / f"state-{len(spec)}", via, spec)
        report = pair.ok("push")
        assert report["uploaded"] == 1, spec
        assert (where / "a.txt").read_text() == "a", spec
    assert not (cwd / "dest").exists() and not (cwd / "~").exists()


def test_resolve_root_rules() -> None:
    r = paths.resolve_root
    assert r("~", "/w", "/h") == "/h"
    assert r("~/x/../y", "/w", "/h") == "/h/y"
    assert r("x", "/w", "/h") == "/w/x"
    assert r("~user/x", "/w", "/h") == "/w/~user/x"
    assert r("/abs/./p/", "/w", "/h") == "/abs/p"

    hello = {"hello": 1, "cwd": "/w", "home": "/h"}
    session = HelperEndpoint(local_conduit(), None, hello)  # type: ignore[arg-type]
    assert session.resolve_root("~/x") == "/h/x"
    session.hello = {"hello": 1, "cwd": "/w"}  # an older helper: home falls back to cwd
    assert session.resolve_root("~/x") == "/w/x"


def test_hello_carries_home(served: Helper) -> None:
    assert served.hello["home"] == os.path.expanduser("~")
    assert served.hello["cwd"] == os.getcwd()


# -- against the namespaced sshd -----------------------------------------------------------


@pytest.mark.sshd
def test_via_ssh_command(sshd: Any, tmp_path: Path) -> None:
    """``--via 'ssh -F CFG ALIAS'``: ssh joins the arguments into one remote command line."""
    local = tmp_path / "local"
    skills_tree(local)
    rel = f"via-ssh-{os.getpid()}-{time.monotonic_ns()}"
    via = shlex.join(["ssh", "-F", str(sshd.ssh_config), sshd.alias])
    pair = ViaPair(local, sshd.home / rel, tmp_path / "state", via, f"~/{rel}")
    try:
        assert pair.ok("push")["uploaded"] > 0
        expected = {p: b for p, b in snapshot(local).items() if not p.startswith(".hub/")}
        assert snapshot(sshd.home / rel) == expected
        write(sshd.home / rel / "pdf" / "SKILL.md", "remote edit\n")
        assert pair.ok("pull")["downloaded"] == 1
        assert (local / "pdf" / "SKILL.md").read_text() == "remote edit\n"
        # A relative path is relative to the login directory, the home.
        pair.spec = rel
        assert pair.ok("push")["uploaded"] == 0
    finally:
        subprocess.run(["rm", "-rf", str(sshd.home / rel)], check=False)


# -- asyncssh import -----------------------------------------------------------------------


def test_ssh_transport_import_skips_the_liboqs_lookup() -> None:
    code = (
        "import ctypes.util\n"
        "seen = []\n"
        "real = ctypes.util.find_library\n"
        "def spy(name):\n"
        "    seen.append(name)\n"
        "    return real(name)\n"
        "ctypes.util.find_library = spy\n"
        "import filesync.transport.ssh.conduit\n"
        "assert ctypes.util.find_library is spy, 'not restored'\n"
        "assert not {'oqs', 'liboqs'} & set(seen), seen\n"
        "import asyncssh.crypto.pq as pq\n"
        "assert not pq.sntrup_available\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "ok", out.stderr


def test_command_conduit_runs_through_a_joining_prefix() -> None:
    async def main() -> bytes:
        conduit = CommandConduit(JOINING_PREFIX, "t")
        try:
            done = await conduit.run("cat; printf '%s' \"$1\" 'a  b'", b"in ")
            return done.stdout
        finally:
            await conduit.close()

    assert asyncio.run(main()) == b"in a  b"


def test_posix_fallback_probe_reports_home(monkeypatch: pytest.MonkeyPatch,
                                           tmp_path: Path) -> None:
    from filesync.endpoint.posix import PosixEndpoint

    monkeypatch.setenv("HOME", str(tmp_path / "h"))

    async def main() -> str:
        conduit = local_conduit()
        try:
            session = await PosixEndpoint.start(conduit)
            assert session.hello["home"] == str(tmp_path / "h")
            return session.resolve_root("~/x")
        finally:
            await conduit.close()

    assert asyncio.run(main()) == str(tmp_path / "h" / "x")
