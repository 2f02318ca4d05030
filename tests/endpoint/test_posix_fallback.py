"""The POSIX fallback (sh + find + tar) for remotes without python3.

Three layers:
- the tar stream parser alone, fed crafted tar bytes (links, ``..``, absolute names,
  devices, duplicates, size lies, pax path overrides);
- the whole CLI over the local transport with the fallback forced, in the flavours a
  non-GNU remote gets (``stat -c`` listing, no ``xargs -0``, no ``--no-recursion``),
  and with tools missing from PATH;
- the whole CLI through the real sshd container with python3 whited out, including a
  remote ``tar`` that answers with a malicious stream.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import subprocess
import sys
import tarfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sshd import SshdContainer
from synctree import Pair, junk_tree, skills_tree, snapshot, write

from filesync.core.exclude import ExcludeRule
from filesync.endpoint import posix as posix_remote
from filesync.endpoint import posix_parse
from filesync.endpoint.contract import FetchHeader, FetchSink, SendItem
from filesync.endpoint.helper import HelperEndpoint, NoPython
from filesync.sync.staging import StagingSink
from filesync.transport.base import Conduit, RemoteProcess
from filesync.transport.local import local_conduit
from filesync.tree.wire import Reason

Factory = Callable[[int], SshdContainer]
BOX = 12  # sshd_factory index used by this module


# --------------------------------------------------------------------------- helpers


class RecordingSink(FetchSink):
    """Keeps what a fetch delivered, in memory."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.heads: dict[str, FetchHeader] = {}
        self.failures: dict[str, str] = {}
        self._buf = bytearray()

    def begin(self, head: FetchHeader) -> Callable[[bytes], None]:
        self._buf = bytearray()
        return self._buf.extend

    def end(self, head: FetchHeader, ok: bool, reason: str) -> None:
        if ok:
            self.files[head.path] = bytes(self._buf)
            self.heads[head.path] = head
        else:
            self.failures[head.path] = reason

    def failed(self, path: str, reason: str) -> None:
        self.failures[path] = reason


def member(name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE, *, mtime: int = 1000,
           link: str = "", size: int | None = None, pax: dict[str, str] | None = None,
           fmt: int = tarfile.GNU_FORMAT) -> bytes:
    """One tar member (header plus padded data) as raw bytes."""
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = len(data) if size is None else size
    info.mtime = mtime
    info.mode = 0o644
    info.linkname = link
    if pax:
        info.pax_headers = pax
        fmt = tarfile.PAX_FORMAT
    payload = data if kind == tarfile.REGTYPE else b""
    return info.tobuf(fmt, "utf-8", "surrogateescape") + payload + b"\0" * (-len(payload) % 512)


def archive(*members: bytes) -> bytes:
    return b"".join(members) + b"\0" * 1024


def listed(size: int, mtime: int) -> Any:
    return posix_parse.Listed(size, mtime * 10**9, f"{size} {mtime}")


def cwd_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# --------------------------------------------------------------------------- the tar parser


def test_crafted_stream_only_exact_regular_members_reach_the_sink(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")  # anything extracted by mistake would land here
    good = b"good content\n"
    stream = archive(
        member("./ok.txt", good),
        member("./link.txt", kind=tarfile.SYMTYPE, link="/etc/passwd"),
        member("../escape.txt", b"evil"),
        member("/abs.txt", b"evil"),
        member("./hard.txt", kind=tarfile.LNKTYPE, link="./ok.txt"),
        member("./dev.txt", kind=tarfile.CHRTYPE),
        member("./dir.txt", kind=tarfile.DIRTYPE),
        member("./unasked.txt", b"evil"),
        member("./ok.txt", b"a second copy\n"),  # duplicate: the first one stands
        member("./sized.txt", b"12345"),  # listed with another size
        member("./x", b"evil", pax={"path": "../pax-escape.txt"}),
        member("./" + "d" * 120 + "/long.txt", b"long name\n"),  # GNU longname
    )
    wanted = {
        "ok.txt": listed(len(good), 1000),
        "link.txt": None, "escape.txt": None, "abs.txt": None, "hard.txt": None,
        "dev.txt": None, "dir.txt": None, "sized.txt": listed(99, 1000),
        "d" * 120 + "/long.txt": None, "never-sent.txt": None,
    }
    sink = RecordingSink()
    parser = posix_remote.TarFetch(wanted, sink)
    parser.run(io.BytesIO(stream))
    assert sink.files == {"ok.txt": good, "d" * 120 + "/long.txt": b"long name\n"}
    assert sink.heads["ok.txt"].mtime_ns == 1000 * 10**9
    for rel in ("link.txt", "hard.txt", "dev.txt", "dir.txt"):
        assert sink.failures[rel] == "not a regular file on the remote"
    assert sink.failures["sized.txt"] == "changed on the remote during the run"
    refused = {name for name, _reason in parser.refused}
    assert {"../escape.txt", "/abs.txt", "./unasked.txt", "./ok.txt",
            "../pax-escape.txt"} <= refused
    parser.finish({"ok.txt": (len(good), 1000 * 10**9, f"{len(good)} 1000"),
                   "d" * 120 + "/long.txt": (10, 1000 * 10**9, "10 1000")},
                  {"never-sent.txt": (Reason.OS_ERROR, "No such file or directory")})
    assert sink.failures["never-sent.txt"] == "No such file or directory"
    assert sink.failures["escape.txt"] == "vanished from the remote"
    assert "ok.txt" not in sink.failures
    assert cwd_files(tmp_path) == ["cwd"]


def test_truncated_stream_is_a_lost_connection_and_the_partial_file_is_not_kept() -> None:
    stream = archive(member("./a.txt", b"x" * 5000))[:2048]
    sink = RecordingSink()
    with pytest.raises(posix_remote.ConnectionLost) as err:
        posix_remote.TarFetch({"a.txt": None}, sink).run(io.BytesIO(stream))
    assert "rerun" in str(err.value)
    assert sink.files == {} and "a.txt" in sink.failures


def test_garbage_instead_of_a_tar_stream_is_refused() -> None:
    sink = RecordingSink()
    with pytest.raises(posix_remote.TransportError):
        posix_remote.TarFetch({"a.txt": None}, sink).run(io.BytesIO(b"<html>oops</html>" * 64))
    assert sink.files == {}


def test_a_file_that_changed_while_tar_read_it_is_revoked_from_staging(tmp_path: Path) -> None:
    sink = StagingSink(tmp_path / "staging")
    wanted = {"a.txt": listed(4, 1000), "b.txt": listed(4, 1000)}
    parser = posix_remote.TarFetch(wanted, sink)
    parser.run(io.BytesIO(archive(member("./a.txt", b"aaaa"), member("./b.txt", b"bbbb"))))
    assert set(sink.staged) == {"a.txt", "b.txt"}
    # After the stream, the remote says b.txt now has another mtime: it was torn.
    parser.finish({"a.txt": (4, 1000 * 10**9, "4 1000"), "b.txt": (4, 1001 * 10**9, "4 1001")},
                  {})
    assert set(sink.staged) == {"a.txt"}
    assert sink.failed_paths == {"b.txt": "changed while being read"}
    assert sorted(p.name for p in (tmp_path / "staging").iterdir()) == ["1"]


def test_trailer_is_found_only_with_the_nonce() -> None:
    nonce = b"f00d"
    region = (b"\0" * 600 + b"\nbeef rc 0\nbeef end\n"
              + b"\nf00d rc 1\nE tar: x\nS 1 2 ./a\nf00d end\n")
    assert posix_parse.trailer(region, nonce) == (1, ["E tar: x", "S 1 2 ./a"])
    assert posix_parse.trailer(region[:-9], nonce) is None  # cut before its end line


def test_bsd_stat_listing_is_parsed_and_pruned() -> None:
    """``stat -f '%p %l %i %z %m %N'`` output, as a BSD remote prints it."""
    out = b"\n".join([
        b"40755 3 2 512 1700000000 .",
        b"100644 1 11 5 1700000001 ./a b.md",
        b"100755 1 12 7 1700000002 ./bin/run.sh",
        b"120755 1 13 9 1700000003 ./link",
        b"10644 1 14 0 1700000004 ./fifo",
        b"100644 2 15 3 1700000005 ./hard.txt",
        b"40755 2 16 512 1700000006 ./cache",
        b"100644 1 17 3 1700000007 ./cache/x.bin",
        b"X ./node_modules",
        b"100644 1 18 3 1700000008 ./.filesync.99.1.tmp",
        b"END 1",
    ]) + b"\n"
    records = posix_parse.parse_records(out, posix_remote.STAT_F)
    session = posix_remote.PosixEndpoint.__new__(posix_remote.PosixEndpoint)
    session._listed, session._stale = {}, {}
    rule = ExcludeRule.build(["cache/"])
    listing = session._listing("/r", rule, records,
                               "find: ./locked: Permission denied\nfind: warning: x\n")
    assert {rel: (e.size, e.mtime_ns, e.mode) for rel, e in listing.entries.items()} == {
        "a b.md": (5, 1700000001 * 10**9, 0o644), "bin/run.sh": (7, 1700000002 * 10**9, 0o755)}
    assert listing.excluded == 2  # node_modules (pruned remotely) and cache/ (here)
    reasons = {s.path: s.reason for s in listing.skipped}
    assert reasons == {"link": "symlink (not followed)",
                       "fifo": "special file (fifo, socket or device)",
                       "hard.txt": "hard link on the remote (not synced)",
                       "locked": "unreadable directory: Permission denied"}
    assert session._stale["/r"] == [".filesync.99.1.tmp"]
    assert session._listed["/r"]["a b.md"].token == "5 1700000001"


def test_a_listing_without_its_end_mark_is_an_error_not_a_shorter_tree() -> None:
    cut = b"f 1 2 644 5 1700000000.5000000000 ./a\0f 1 3 644 5 1700000000.0000000000 ./b\0"
    with pytest.raises(posix_remote.TransportError) as err:
        posix_parse.parse_records(cut, posix_remote.GNU_FIND)
    assert "did not finish" in str(err.value)
    [a, b] = posix_parse.parse_records(cut + b"END 0\0", posix_remote.GNU_FIND)
    assert (a.rel, a.mtime_ns, b.mtime_ns) == ("a", 1700000000_500000000, 1700000000 * 10**9)


@pytest.mark.parametrize(("facts", "message"), [
    ({"find": ["1"]}, "the remote has no python3 and no tar; install python3 (preferred) or tar"),
    ({"tar": [""], "find": ["1"]}, "its tar cannot read a file list (-T)"),
    ({"tar": [""], "tarlist": ["1"], "find": ["1"]},
     "its find has no -printf (not GNU find) and it has no stat"),
    ({"tar": [""], "tarlist": ["1"], "find": ["1"], "stat": ["f"], "missing": ["mv", "tr"]},
     "the remote has no python3 and no mv and tr; install python3 (preferred) or coreutils"),
])
def test_what_is_missing_is_named(facts: dict[str, list[str]], message: str) -> None:
    problem = posix_parse.missing_tools_error(facts)
    assert problem is not None and message in problem and "\n" not in problem
    assert posix_parse.missing_tools_error(
        {"tar": [""], "tarlist": ["1"], "find": ["1"], "stat": ["f"]}) is None


# --------------------------------------------------------------------------- local transport


@pytest.fixture
def pair(tmp_path: Path) -> Pair:
    local = tmp_path / "host" / "skills"
    skills_tree(local)
    return Pair(local, tmp_path / "remote" / "skills", tmp_path / "state")


def force_fallback(monkeypatch: pytest.MonkeyPatch, tools: posix_remote.Tools | None) -> None:
    """The local transport without python3 (as far as filesync can tell), with ``tools``."""

    async def no_python(
        cls: type[HelperEndpoint], conduit: Conduit, **_kwargs: object
    ) -> HelperEndpoint:
        raise NoPython("forced by the test")

    monkeypatch.setattr(HelperEndpoint, "start", classmethod(no_python))
    if tools is not None:
        real = posix_remote.PosixEndpoint.start.__func__  # type: ignore[attr-defined]

        async def with_tools(cls: type[posix_remote.PosixEndpoint], conduit: Conduit,
                             *, tools: posix_remote.Tools | None = tools
                             ) -> posix_remote.PosixEndpoint:
            session: posix_remote.PosixEndpoint = await real(cls, conduit, tools=tools)
            return session

        monkeypatch.setattr(posix_remote.PosixEndpoint, "start", classmethod(with_tools))


# What a busybox-like remote offers (the tar here is GNU tar, which needs --no-unquote).
NON_GNU = posix_remote.Tools(posix_remote.STAT_C, tar_norec=False, xargs0=False,
                             tar_no_unquote=True)
#: Names that trip up shells, tar -T and xargs.
ODD_NAMES = ("a\\tb.md", "back\\slash\\", " lead and trail ", "it's \"q\" [1] *?.md",
             "-dash.md", "ünïcödé.md", "100%.md")


@pytest.mark.parametrize("tools", [None, NON_GNU], ids=["detected", "stat-c-no-xargs"])
def test_scenarios_over_the_local_transport(
    pair: Pair, monkeypatch: pytest.MonkeyPatch, tools: posix_remote.Tools | None
) -> None:
    force_fallback(monkeypatch, tools)
    write(pair.local / "cache" / "big.bin", b"c" * 1000)
    for i, name in enumerate(ODD_NAMES):
        write(pair.local / "odd" / name / name, f"{i}\n")
    report = pair.ok("push", "--exclude", "cache/", "-v")
    assert "using the POSIX fallback" in pair.stderr
    local = snapshot(pair.local)
    expected = {p: b for p, b in local.items()
                if not p.startswith((".hub/", "cache/"))}
    assert snapshot(pair.remote) == expected and report["uploaded"] == len(expected)
    src, dst = pair.local / "pdf" / "scripts" / "extract.py", pair.remote / "pdf" / "scripts"
    assert (dst / "extract.py").stat().st_mode & 0o777 == 0o755
    assert (dst / "extract.py").stat().st_mtime_ns == src.stat().st_mtime_ns
    # conflict + one-sided edits + a deletion, both ways
    write(pair.local / "web" / "SKILL.md", "host edit\n")
    write(pair.remote / "web" / "SKILL.md", "remote edit\n")
    write(pair.remote / "pdf" / "references" / "api.md", "remote only edit\n")
    for name in ODD_NAMES:
        write(pair.remote / "odd" / name / name, f"remote {name}\n")
    (pair.local / "pdf" / "templates" / "t.txt").unlink()
    junk_tree(pair.remote, curator_mb=1)
    report = pair.ok("sync", "--exclude", "cache/")
    assert [c["path"] for c in report["conflicts"]] == ["web/SKILL.md"]
    assert (pair.local / "pdf" / "references" / "api.md").read_text() == "remote only edit\n"
    for name in ODD_NAMES:
        assert (pair.local / "odd" / name / name).read_text() == f"remote {name}\n"
    assert not (pair.remote / "pdf" / "templates").exists()  # emptied dir pruned
    assert report["deleted_remote"] == 1
    assert not (pair.local / ".curator_backups").exists()
    assert not (pair.local / "pdf" / "node_modules").exists()
    pair.ok("resolve", "web/SKILL.md", "--keep", "local")
    assert (pair.remote / "web" / "SKILL.md").read_text() == "host edit\n"
    assert pair.ok("status", "--exclude", "cache/")["plan"] == []
    assert not [p for p in snapshot(pair.remote) if ".filesync." in p]


def test_temp_files_of_gone_runs_are_removed_by_the_next_listing(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    force_fallback(monkeypatch, None)
    pair.ok("push")
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead, alive = gone.pid, os.getpid()  # a process that has ended, and this one
    write(pair.remote / f".filesync.{dead}.0.tmp", "manifest of a cut run\n")
    write(pair.remote / "pdf" / f".filesync.{dead}.3.tmp", "half a file")
    write(pair.remote / "pdf" / f".filesync.{alive}.1.tmp", "a run in progress")
    report = pair.ok("push")
    assert report["uploaded"] == 0 and report["skipped"] == []
    assert sorted(p for p in snapshot(pair.remote) if ".filesync." in p) == [
        f"pdf/.filesync.{alive}.1.tmp"]


def test_local_read_failure_fails_only_that_file(tmp_path: Path) -> None:
    async def go() -> list[Any]:
        conduit = local_conduit()
        session = await posix_remote.PosixEndpoint.start(conduit)
        try:
            def fine() -> Iterator[bytes]:
                yield b"fine\n"

            def broken() -> Iterator[bytes]:
                yield b"half"
                raise PermissionError(13, "Permission denied")

            items = [SendItem("a/fine.txt", 0o600, 10**18, None, fine),
                     SendItem("a/broken.txt", 0o644, 10**18, None, broken)]
            return list(await session.send(str(tmp_path / "r"), items))
        finally:
            await session.close()
            await conduit.close()

    fine, broken = asyncio.run(go())
    assert (fine.status, fine.size, fine.mtime_ns) == ("ok", 5, 10**18)
    assert (broken.status, broken.reason) == ("error", "local read failed: Permission denied")
    assert cwd_files(tmp_path / "r") == ["a", "a/fine.txt"]
    assert (tmp_path / "r" / "a" / "fine.txt").stat().st_mode & 0o777 == 0o600


def test_session_ops_refuse_symlinked_parents_and_changed_files(tmp_path: Path) -> None:
    root, outside = tmp_path / "r", tmp_path / "outside"
    write(root / "keep" / "a.txt", "a\n")
    write(root / "gone" / "sub" / "b.txt", "b\n")
    write(outside / "c.txt", "outside\n")
    (root / "link").symlink_to(outside)
    write(tmp_path / "afile", "x")

    async def go() -> dict[str, Any]:
        conduit = local_conduit()
        session = await posix_remote.PosixEndpoint.start(conduit)
        try:
            listing = await session.list_tree(str(root), ExcludeRule.build())
            files = listing.files()
            write(root / "keep" / "a.txt", "edited meanwhile\n")
            deleted = await session.delete(str(root), [files["keep/a.txt"],
                                                       files["gone/sub/b.txt"]])
            sink = RecordingSink()
            await session.fetch(str(root), ["link/c.txt", "gone/sub/b.txt", "../x"], sink)
            sent = await session.send(str(root), [
                SendItem("link/new.txt", 0o644, 10**18, None, lambda: iter([b"no\n"])),
                SendItem("keep/a.txt", 0o644, 10**18, (2, 1), lambda: iter([b"no\n"]))])
            blocked = await session.send(str(tmp_path / "afile" / "sub"), [
                SendItem("x.txt", 0o644, 10**18, None, lambda: iter([b"no\n"]))])
            vanished = await session.delete(str(tmp_path / "nowhere"), [files["keep/a.txt"]])
            return {"listing": listing, "deleted": deleted, "sink": sink, "sent": sent,
                    "blocked": blocked, "vanished": vanished}
        finally:
            await session.close()
            await conduit.close()

    out = asyncio.run(go())
    assert {s.path: s.reason for s in out["listing"].skipped} == {
        "link": "symlink (not followed)"}
    assert [(o.path, o.status) for o in out["deleted"]] == [
        ("keep/a.txt", "changed"), ("gone/sub/b.txt", "ok")]
    assert not (root / "gone").exists()  # emptied parents pruned, the root kept
    assert (root / "keep" / "a.txt").read_text() == "edited meanwhile\n"
    assert out["sink"].files == {}
    assert out["sink"].failures["../x"] == "unsafe path"
    assert out["sink"].failures["link/c.txt"] == "symlink in path (not followed)"
    assert out["sink"].failures["gone/sub/b.txt"] == "No such file or directory"
    assert [(o.status, o.reason) for o in out["sent"]] == [
        ("error", "symlink in path (not followed)"),
        ("changed", "changed on the remote during the run")]
    assert sorted(p.name for p in outside.iterdir()) == ["c.txt"]
    [blocked] = out["blocked"]
    assert (blocked.status, blocked.reason) == ("error", "Not a directory")
    assert [o.status for o in out["vanished"]] == ["ok"]
    assert cwd_files(root) == ["keep", "keep/a.txt", "link"]


class CuttingConduit(Conduit):
    """The local conduit, but the stdin of every command is cut after ``budget`` bytes."""

    def __init__(self, budget: int) -> None:
        self.inner = local_conduit()
        self.identity = "cutting"
        self.budget = budget

    async def start(self, command: str) -> RemoteProcess:
        proc = await self.inner.start(command)
        budget = [self.budget]
        real_write = proc.write

        async def write(data: bytes) -> None:
            if budget[0] > 0:
                await real_write(data[: budget[0]])
            budget[0] -= len(data)
            if budget[0] <= 0:
                await proc.write_eof()

        proc.write = write  # type: ignore[method-assign]
        return proc

    async def close(self) -> None:
        await self.inner.close()


def test_a_stream_cut_short_commits_nothing(tmp_path: Path) -> None:
    root = tmp_path / "r"
    write(root / "old.txt", "old\n")

    async def go() -> list[Any]:
        conduit = CuttingConduit(60_000)  # the header, the first file, part of the second
        session = await posix_remote.PosixEndpoint.start(conduit)
        items = [SendItem(f"d/f{i}.bin", 0o644, 10**18, None, lambda: iter([b"z" * 40_000]))
                 for i in range(3)]
        try:
            return list(await session.send(str(root), items))
        finally:
            await conduit.close()

    outcomes = asyncio.run(go())
    assert {o.status for o in outcomes} == {"error"}
    assert "did not get the whole stream" in outcomes[0].reason
    assert cwd_files(root) == ["old.txt"]  # no file, no temp file, no directory


@pytest.mark.parametrize(
    ("without", "message"),
    [
        ("tar", "the remote has no python3 and no tar; install python3 (preferred) or tar"),
        ("find", "the remote has no python3 and no find; install python3 (preferred) or find"),
    ],
)
def test_a_missing_tool_is_one_line_naming_it(
    pair: Pair, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, without: str, message: str
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sh", "tar", "find", "mv", "rm", "mkdir", "rmdir", "cat", "tr", "tail",
                 "head", "xargs", "stat", "pwd", "true", "sort"):
        found = next((Path(d) / tool for d in ("/usr/bin", "/bin")
                      if (Path(d) / tool).exists()), None)
        if found is not None and tool != without:
            (bin_dir / tool).symlink_to(found)
    monkeypatch.setenv("PATH", str(bin_dir))  # no python3 either
    code, report = pair.run("push")
    assert code == 1
    assert report["error"].startswith(message)
    assert pair.stderr.count("\n") == 1
    assert not pair.remote.exists()


def _fake_python3(bin_dir: Path, body: str) -> None:
    bin_dir.mkdir()
    fake = bin_dir / "python3"
    fake.write_text("#!/bin/sh\n" + body)
    fake.chmod(0o755)


def test_a_python3_older_than_the_helper_s_gets_the_fallback_and_says_why(
    pair: Pair, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The real interpreter, claiming to be 3.9: it runs the helper's bootstrap line as an
    # old python3 would (that line is the only code it runs before the version check).
    code = "import sys; sys.version_info = (3, 9, 18, 'final', 0); exec(sys.argv[1])"
    _fake_python3(tmp_path / "bin",
                  f'[ "$3" = -c ] || exit 9\nexec {sys.executable} -I -S -c "{code}" "$4"\n')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    report = pair.ok("push", "-v")
    assert "remote's python3 is 3.9 (the helper needs 3.10): using the POSIX fallback" \
        in pair.stderr
    assert snapshot(pair.remote) == {p: b for p, b in snapshot(pair.local).items()
                                     if not p.startswith(".hub/")}
    assert report["uploaded"] > 0


def test_a_python3_that_fails_to_start_is_named_not_a_lost_connection(
    pair: Pair, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_python3(tmp_path / "bin", "echo 'python3: error while loading shared libraries: "
                  "libpython3.so' >&2\nexit 127\n")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    code, report = pair.run("push")
    assert code == 1
    assert report["error"].startswith("the remote helper did not start: python3: error while "
                                      "loading shared libraries")
    assert "python3 runs there" in report["error"] and "Traceback" not in pair.stderr
    assert not pair.remote.exists()


# --------------------------------------------------------------------------- real sshd


@pytest.fixture
def user_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """HOME is empty and there is no agent: the machine's own ~/.ssh never decides."""
    home = tmp_path / "userhome"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)


@pytest.fixture
def box(sshd_factory: Factory, user_home: None) -> SshdContainer:
    container = sshd_factory(BOX)
    container.hide_python()
    return container


class SshPair(Pair):
    """A Pair whose remote is ``alias:path`` in the container, reached with ``-F``."""

    def __init__(self, local: Path, box: SshdContainer, rel: str, state: Path) -> None:
        super().__init__(local, box.home / rel, state)
        self.box = box
        self.spec = f"{box.alias}:{rel}"

    def run(self, command: str, *extra: str, remote: str | None = None) -> tuple[int, Any]:
        return super().run(command, "-F", str(self.box.ssh_config), *extra,
                           remote=remote or self.spec)


@pytest.fixture
def spair(box: SshdContainer, tmp_path: Path) -> SshPair:
    local = tmp_path / "host" / "skills"
    skills_tree(local)
    return SshPair(local, box, ".hermes/skills", tmp_path / "state")


@pytest.mark.sshd
def test_push_pull_through_sshd_without_python3(spair: SshPair, box: SshdContainer) -> None:
    umask = os.umask(0)
    os.umask(umask)
    report = spair.ok("push", "-v")
    assert "using the POSIX fallback" in spair.stderr
    assert report["uploaded"] == len(snapshot(spair.remote)) == 8
    assert box.home.stat().st_mode & 0o777 == 0o700  # the remote home is untouched
    assert (box.home / ".hermes").stat().st_mode & 0o777 == 0o777 & ~umask
    assert spair.ok("push")["uploaded"] == 0
    # The reported bug: bookkeeping next to a real edit and a new skill.
    junk = junk_tree(spair.remote, curator_mb=8)
    write(spair.remote / "pdf" / "SKILL.md", "# pdf\nedited remotely\n")
    write(spair.remote / "newskill" / "SKILL.md", "# new\n")
    write(spair.remote / "newskill" / "scripts" / "run.sh", "echo hi\n", 0o755)
    host_lock = (spair.local / ".hub" / "lock.json").read_bytes()
    before = snapshot(spair.local)
    wire = box.wire_bytes()
    report = spair.ok("pull")
    moved = box.wire_bytes() - wire
    after = snapshot(spair.local)
    assert {p for p in after if before.get(p) != after[p]} == {
        "pdf/SKILL.md", "newskill/SKILL.md", "newskill/scripts/run.sh"}
    assert (spair.local / ".hub" / "lock.json").read_bytes() == host_lock
    assert not (spair.local / ".curator_backups").exists()
    assert report["downloaded"] == 3 and moved < (1 << 20) < junk
    assert (spair.local / "newskill" / "scripts" / "run.sh").stat().st_mode & 0o777 == 0o755


@pytest.mark.sshd
def test_conflict_deletion_exclusion_through_sshd_without_python3(spair: SshPair) -> None:
    write(spair.local / "logs" / "x.log", "log\n")
    spair.ok("push", "--exclude", "*.log")
    assert not (spair.remote / "logs").exists()
    write(spair.local / "web" / "SKILL.md", "host edit\n")
    write(spair.remote / "web" / "SKILL.md", "remote edit\n")
    (spair.local / "pdf" / "templates" / "t.txt").unlink()
    (spair.remote / "pdf" / "references" / "api.md").unlink()
    write(spair.remote / "remote.log", "remote log\n")
    report = spair.ok("sync", "--exclude", "*.log")
    [conflict] = report["conflicts"]
    assert conflict["path"] == "web/SKILL.md"
    assert Path(conflict["saved_to"]).read_text() == "remote edit\n"
    assert (spair.local / "web" / "SKILL.md").read_text() == "host edit\n"
    assert (report["deleted_remote"], report["deleted_local"]) == (1, 1)
    assert not (spair.remote / "pdf" / "templates").exists()
    assert not (spair.local / "pdf" / "references" / "api.md").exists()
    assert not (spair.local / "remote.log").exists()
    spair.ok("resolve", "web/SKILL.md", "--keep", "remote")
    assert (spair.local / "web" / "SKILL.md").read_text() == "remote edit\n"
    assert spair.ok("status", "--exclude", "*.log")["plan"] == []
    # A push over the conflict saves the remote version first.
    write(spair.local / "web" / "SKILL.md", "host wins\n")
    write(spair.remote / "web" / "SKILL.md", "remote loses\n")
    report = spair.ok("push", "--exclude", "*.log")
    assert (spair.remote / "web" / "SKILL.md").read_text() == "host wins\n"
    assert Path(report["conflicts"][0]["saved_to"]).read_text() == "remote loses\n"


def evil_tar(box: SshdContainer, spair: SshPair) -> bytes:
    """A stream a compromised remote tar could send for this pull's requests."""
    web = spair.remote / "web" / "SKILL.md"
    st = web.stat()
    return archive(
        member("./pdf/SKILL.md", kind=tarfile.SYMTYPE, link="/etc/passwd"),
        member("../escape.txt", b"escaped\n"),
        member(f"{spair.local.parent}/abs.txt", b"absolute\n"),
        member("./newskill/SKILL.md", kind=tarfile.LNKTYPE, link="/etc/passwd"),
        member("./pdf/references/api.md", kind=tarfile.CHRTYPE),
        member("./web/SKILL.md", web.read_bytes(), mtime=int(st.st_mtime)),
        member("./web/SKILL.md", b"second copy\n", mtime=int(st.st_mtime)),
        member("./.ssh/authorized_keys", b"ssh-ed25519 AAAA attacker\n"),
    ) + b"\0" * 8192


@pytest.mark.sshd
def test_a_malicious_remote_tar_stream_is_refused(spair: SshPair, box: SshdContainer) -> None:
    spair.ok("push")
    write(spair.remote / "web" / "SKILL.md", "remote edit\n")
    write(spair.remote / "pdf" / "SKILL.md", "remote pdf edit\n")
    write(spair.remote / "pdf" / "references" / "api.md", "remote api edit\n")
    write(spair.remote / "newskill" / "SKILL.md", "# new\n")
    # A remote tar that answers every "tar -c" with the crafted stream.
    evil = box.home / "evil"
    write(evil / "payload.tar", evil_tar(box, spair))
    write(evil / "tar", '#!/bin/sh\ncase "$1" in -c*) cat >/dev/null; '
          'exec cat /root/evil/payload.tar;; esac\nexec /usr/bin/tar "$@"\n', 0o755)
    write(box.home / ".ssh" / "environment", "PATH=/root/evil:/usr/local/bin:/usr/bin:/bin\n")
    before = snapshot(spair.local)
    outside = sorted(p.name for p in spair.local.parent.parent.iterdir())
    report = spair.ok("pull")
    after = snapshot(spair.local)
    assert {p for p in after if before.get(p) != after[p]} == {"web/SKILL.md"}
    assert after["web/SKILL.md"] == b"remote edit\n"
    reasons = {s["path"]: s["reason"] for s in report["skipped"]}
    for rel in ("pdf/SKILL.md", "newskill/SKILL.md", "pdf/references/api.md"):
        assert "not a regular file" in reasons[rel], reasons
    assert not (spair.local / "pdf" / "SKILL.md").is_symlink()
    assert sorted(p.name for p in spair.local.parent.parent.iterdir()) == outside
    assert not (spair.local.parent / "abs.txt").exists()
    assert not (spair.local / ".ssh").exists()


def cut_when(box: SshdContainer, ready: Callable[[], bool]) -> threading.Thread:
    """Kill every ssh session of ``box`` as soon as ``ready()`` (polled) is true."""

    def watch() -> None:
        for _ in range(200_000):
            if ready():
                box.kill_sessions()
                return
            threading.Event().wait(0.001)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.sshd
def test_cuts_mid_push_and_mid_pull_then_reruns_converge(spair: SshPair, box: SshdContainer
                                                         ) -> None:
    spair.ok("push")
    big = os.urandom(48 << 20)
    write(spair.local / "web" / "assets" / "video.bin", big)
    assets = spair.remote / "web" / "assets"

    def uploading() -> bool:  # the fallback's temp files live in the root
        return any(p.name.startswith(".filesync.") and p.stat().st_size > (1 << 20)
                   for p in spair.remote.iterdir())

    watcher = cut_when(box, uploading)
    code, report = spair.run("push")
    watcher.join()
    assert code == 1 and "lost" in report["error"], report
    assert not (assets / "video.bin").exists()
    assert spair.ok("push")["uploaded"] == 1
    assert (assets / "video.bin").read_bytes() == big
    assert not [p for p in snapshot(spair.remote) if ".filesync." in p]  # stale temps gone
    # ... and the other way round.
    other = os.urandom(48 << 20)
    write(spair.remote / "pdf" / "assets" / "other.bin", other)
    write(spair.remote / "web" / "SKILL.md", "remote edit\n")
    before = snapshot(spair.local)

    def staging() -> bool:
        return any(p.stat().st_size > 0 for p in spair.state.glob("pairs/*/staging/*/*"))

    watcher = cut_when(box, staging)
    code, report = spair.run("pull")
    watcher.join()
    assert code == 1 and "lost" in report["error"] and "rerun" in report["error"], report
    assert snapshot(spair.local) == before
    assert spair.ok("pull")["downloaded"] == 2
    assert (spair.local / "pdf" / "assets" / "other.bin").read_bytes() == other
    assert (spair.local / "web" / "SKILL.md").read_text() == "remote edit\n"


@pytest.mark.sshd
def test_read_only_remote_directory_fails_only_its_files(spair: SshPair, box: SshdContainer
                                                         ) -> None:
    spair.ok("push")
    write(spair.local / "pdf" / "SKILL.md", "host edit\n")
    write(spair.local / "web" / "SKILL.md", "host edit too\n")
    (spair.local / "pdf" / "references" / "api.md").unlink()
    inside = "/root/.hermes/skills/pdf"
    mounted = box.run_inside(f"mount --bind {inside} {inside} && "
                             f"mount -o remount,ro,bind {inside}")
    assert mounted.returncode == 0, mounted.stderr
    try:
        code, report = spair.run("push")
        assert code == 1 and spair.stderr.count("\n") == 1
        assert "Read-only file system" in report["error"]
        reasons = {s["path"]: s["reason"] for s in report["skipped"]}
        assert "Read-only file system" in reasons["pdf/SKILL.md"]
        assert "Read-only file system" in reasons["pdf/references/api.md"]
        assert (spair.remote / "web" / "SKILL.md").read_text() == "host edit too\n"
        assert (spair.remote / "pdf" / "references" / "api.md").exists()
    finally:
        box.run_inside(f"umount {inside}")
    report = spair.ok("push")
    assert (report["uploaded"], report["deleted_remote"]) == (1, 1)
    assert (spair.remote / "pdf" / "SKILL.md").read_text() == "host edit\n"


@pytest.mark.sshd
def test_full_remote_disk_fails_only_what_did_not_fit(spair: SshPair, box: SshdContainer) -> None:
    inside = "/root/.hermes/skills"  # a 1 MiB tmpfs, seen inside the container only

    def remote_files() -> list[str]:
        found = box.run_inside(f"cd {inside} && find . -type f | sort")
        return found.stdout.split()

    mounted = box.run_inside(f"mkdir -p {inside} && mount -t tmpfs -o size=1m tmpfs {inside}")
    assert mounted.returncode == 0, mounted.stderr
    try:
        spair.ok("push")
        write(spair.local / "web" / "SKILL.md", "host edit\n")
        write(spair.local / "z-huge.bin", os.urandom(3 << 20))
        code, report = spair.run("push")
        assert code == 1 and spair.stderr.count("\n") == 1
        assert report["error"].startswith("upload of z-huge.bin failed: the remote disk is "
                                          "probably full"), report["error"]
        assert report["uploaded"] == 1
        assert box.run_inside(f"cat {inside}/web/SKILL.md").stdout == "host edit\n"
        assert "./z-huge.bin" not in remote_files()
        assert not [p for p in remote_files() if ".filesync." in p]  # no temp file left
        grown = box.run_inside(f"mount -o remount,size=16m {inside}")
        assert grown.returncode == 0, grown.stderr
        assert spair.ok("push")["uploaded"] == 1
        digest = box.run_inside(f"sha256sum {inside}/z-huge.bin").stdout.split()[0]
        assert digest == hashlib.sha256((spair.local / "z-huge.bin").read_bytes()).hexdigest()
    finally:
        box.run_inside(f"umount -l {inside}")


@pytest.mark.sshd
def test_a_file_under_another_remote_name_through_the_posix_fallback(
    box: SshdContainer, tmp_path: Path
) -> None:
    from filesync import Mapping, Session

    write(tmp_path / "creds" / "gh-v2.json", "v2\n", 0o600)
    write(tmp_path / "creds" / "other.json", "stays local\n")
    remote = box.home / "posix-rename"
    write(remote / "gh-v2.json", "a remote file of the host's name\n")
    lines: list[str] = []
    m = Mapping(tmp_path / "creds" / "gh-v2.json", "posix-rename/gh_token.json")
    with Session(box.alias, ssh_config=box.ssh_config, state_dir=tmp_path / "s",
                 log=lines.append) as s:
        assert s.push(m).uploaded == 1
        assert any("POSIX fallback" in line for line in lines)
        assert (remote / "gh_token.json").read_text() == "v2\n"
        assert os.stat(remote / "gh_token.json").st_mode & 0o777 == 0o600
        write(remote / "gh_token.json", "rotated\n", 0o600)
        assert s.pull(m).downloaded == 1
    assert snapshot(tmp_path / "creds") == {"gh-v2.json": b"rotated\n",
                                            "other.json": b"stays local\n"}
    assert snapshot(remote) == {"gh-v2.json": b"a remote file of the host's name\n",
                                "gh_token.json": b"rotated\n"}
