"""One suite for the endpoint contract (``filesync.endpoint.contract``), run against both
endpoints over the real namespaced OpenSSH sshd: ``HelperEndpoint`` (python3 on the
remote) and ``PosixEndpoint`` (sh/find/tar, on a remote whose python3 is whited out).

The remote root's directory is a host directory (the container's home), so every test
arranges the remote tree and inspects the outcome directly on the host side. Statuses and
the paths that are skipped or refused are asserted, never reason texts.
"""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from contract_remote import Remote, container_processes, start_endpoint, wait_until
from synctree import write

from filesync.core.exclude import ExcludeRule
from filesync.core.model import FILE, Entry, Listing
from filesync.endpoint.contract import FetchHeader, Outcome, SendItem
from filesync.errors import ConnectionLost, FilesyncError, TransportError

pytestmark = pytest.mark.sshd

RULE = ExcludeRule.build()
#: An mtime with nanoseconds, well in the past.
MTIME = 1_600_000_000_123_456_789
#: A pid no process of the container has (its pid namespace counts from 1).
DEAD_PID = 999_999
#: The container's own PID 1 (its listening sshd), alive for the whole test.
LIVE_PID = 1
#: An atime older than any mtime or ctime here: with ``relatime`` the next read of the
#: file or directory moves it, so an unchanged atime means "never read".
OLD_ATIME = 10**9


# --------------------------------------------------------------------------- helpers


class Sink:
    """A ``FetchSink`` that records every call, in order, and the bytes of each file."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self.heads: dict[str, FetchHeader] = {}
        self.data: dict[str, bytearray] = {}
        self.ended: dict[str, bool] = {}
        self.failed_paths: list[str] = []

    def begin(self, head: FetchHeader) -> Callable[[bytes], None]:
        self.events.append(("begin", head.path))
        self.heads[head.path] = head
        buf = self.data[head.path] = bytearray()
        return buf.extend

    def end(self, head: FetchHeader, ok: bool, reason: str) -> None:
        self.events.append(("end", head.path))
        self.ended[head.path] = ok

    def failed(self, path: str, reason: str) -> None:
        self.events.append(("failed", path))
        self.failed_paths.append(path)

    @property
    def files(self) -> dict[str, bytes]:
        """The files that ended whole."""
        return {p: bytes(b) for p, b in self.data.items() if self.ended.get(p)}

    def assert_well_formed(self) -> None:
        """Each ``begin`` is followed by its own ``end`` before anything else; every path
        is reported once."""
        open_path = None
        for kind, path in self.events:
            if kind == "end":
                assert open_path == path, self.events
                open_path = None
            else:
                assert open_path is None, self.events
                open_path = path if kind == "begin" else None
        assert open_path is None, self.events
        reported = [p for kind, p in self.events if kind != "end"]
        assert len(reported) == len(set(reported)), self.events


def chunks_of(data: bytes, size: int = 1 << 20) -> Callable[[], Iterator[bytes]]:
    def gen() -> Iterator[bytes]:
        for at in range(0, len(data), size):
            yield data[at : at + size]

    return gen


def item(path: str, data: bytes, mode: int = 0o644, mtime_ns: int = MTIME,
         expect: tuple[int, int] | None = None) -> SendItem:
    return SendItem(path, mode, mtime_ns, expect, chunks_of(data))


def statuses(outcomes: list[Outcome]) -> list[tuple[str, str]]:
    """(path, status) per outcome; every file not done says why."""
    assert all(o.reason for o in outcomes if o.status != "ok"), outcomes
    return [(o.path, o.status) for o in outcomes]


def facts(path: Path) -> tuple[bytes, int, int]:
    """(bytes, mode bits, mtime_ns) of a regular file, not following a symlink."""
    st = path.lstat()
    assert stat.S_ISREG(st.st_mode), path
    return path.read_bytes(), st.st_mode & 0o7777, st.st_mtime_ns


def tree_state(top: Path, skip: Path | None = None) -> dict[str, tuple[str, int, int, bytes]]:
    """Every path under ``top`` (but ``skip``'s subtree): kind, mode, mtime and content."""
    out: dict[str, tuple[str, int, int, bytes]] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        base = Path(dirpath)
        if skip is not None and base == skip.parent:
            dirnames[:] = [d for d in dirnames if base / d != skip]
            filenames = [f for f in filenames if base / f != skip]
        for name in dirnames + filenames:
            p = base / name
            st = p.lstat()
            if stat.S_ISLNK(st.st_mode):
                out[str(p.relative_to(top))] = ("l", 0, 0, os.readlink(p).encode())
            elif stat.S_ISREG(st.st_mode):
                out[str(p.relative_to(top))] = ("f", st.st_mode & 0o7777, st.st_mtime_ns,
                                                p.read_bytes())
            else:
                out[str(p.relative_to(top))] = ("d" if stat.S_ISDIR(st.st_mode) else "o",
                                                st.st_mode & 0o7777, 0, b"")
    return out


def temps_under(top: Path) -> list[str]:
    """Every filesync temp name left under ``top``."""
    return sorted(str(p.relative_to(top)) for p in top.rglob(".filesync.*"))


def outside_state(remote: Remote) -> tuple[dict[str, tuple[str, int, int, bytes]], str]:
    """Everything the remote could write outside the root: its home, and its own /tmp."""
    tmp = remote.box.run_inside("ls -A /tmp").stdout
    return tree_state(remote.box.home, skip=remote.path), tmp


def age_atime(path: Path) -> None:
    st = path.lstat()
    os.utime(path, ns=(OLD_ATIME, st.st_mtime_ns), follow_symlinks=False)


def atime(path: Path) -> int:
    return path.lstat().st_atime_ns


def view(listing: Listing) -> tuple[bool, dict[str, Entry], list[str], int]:
    """A listing in comparable form (``skipped`` as its sorted paths)."""
    return (listing.exists, listing.entries, sorted(s.path for s in listing.skipped),
            listing.excluded)


def odd_kinds(root: Path, outside: Path) -> set[str]:
    """Symlinks, a FIFO, a socket, hard links and unsafe names under ``root``; their paths."""
    write(outside / "secret.txt", "outside\n")
    root.mkdir(parents=True, exist_ok=True)
    (root / "link.txt").symlink_to("ok.txt")
    (root / "dirlink").symlink_to(outside)
    (root / "abslink").symlink_to(outside / "secret.txt")
    (root / "dangling").symlink_to("nowhere")
    os.mkfifo(root / "fifo")
    sock = socket.socket(socket.AF_UNIX)
    try:
        here = os.getcwd()
        os.chdir(root)  # a socket path is limited to 108 bytes: bind relative to the root
        try:
            sock.bind("sock")
        finally:
            os.chdir(here)
    finally:
        sock.close()
    write(root / "hard" / "one.txt", "linked twice\n")
    os.link(root / "hard" / "one.txt", root / "hard" / "two.txt")
    write(root / "bad\nname.txt", "newline in its name\n")
    write(root / "tab\there.txt", "control character in its name\n")
    write(root / "nl\ndir" / "inner.txt", "under a directory with a newline\n")
    with open(os.fsencode(root) + b"/latin1-\xe9.txt", "wb") as f:  # not valid UTF-8
        f.write(b"x\n")
    return {"link.txt", "dirlink", "abslink", "dangling", "fifo", "sock", "hard/one.txt",
            "hard/two.txt", "bad\nname.txt", "tab\there.txt", "nl\ndir/inner.txt",
            os.fsdecode(b"latin1-\xe9.txt")}


# --------------------------------------------------------------------------- resolve_root


async def test_resolve_root_forms_without_talking_to_the_remote(remote: Remote) -> None:
    ep, conduit = remote.endpoint, remote.conduit
    forms = ["~", "~/x", "~/a/./b/../c/", "rel/dir", ".", "/srv/a/../b/", "/"]
    expected = ["/root", "/root/x", "/root/a/c", "/root/rel/dir", "/root", "/srv/b", "/"]
    sent, received = conduit.bytes_sent, conduit.bytes_received
    assert [ep.resolve_root(f) for f in forms] == expected
    assert (conduit.bytes_sent, conduit.bytes_received) == (sent, received)
    # With the connection gone, the answers stay the same: nothing was asked of the remote.
    remote.box.kill_sessions()
    await wait_until(lambda: not conduit.alive, "the client saw the connection drop")
    assert [ep.resolve_root(f) for f in forms] == expected
    assert remote.root == "/root/tree"


# --------------------------------------------------------------------------- list_tree


async def test_list_tree_gives_regular_files_with_size_mtime_and_mode(remote: Remote) -> None:
    root = remote.path
    write(root / "a.txt", "alpha\n", 0o640)
    write(root / "sub" / "deeper" / "run.sh", "echo hi\n", 0o755)
    write(root / "empty.bin", b"")
    write(root / "sub" / "big.bin", os.urandom(3 << 20), 0o600)
    (root / "emptydir" / "nested").mkdir(parents=True)
    os.utime(root / "a.txt", ns=(MTIME, MTIME))
    listing = await remote.endpoint.list_tree(remote.root, RULE)
    assert listing.exists and listing.root == remote.root
    expected = {}
    for rel in ("a.txt", "sub/deeper/run.sh", "empty.bin", "sub/big.bin"):
        st = (root / rel).stat()
        expected[rel] = (FILE, st.st_size, st.st_mtime_ns, st.st_mode & 0o7777)
    got = {rel: (e.kind, e.size, e.mtime_ns, e.mode) for rel, e in listing.entries.items()}
    assert got == expected
    assert all(e.path == rel for rel, e in listing.entries.items())
    assert listing.entries["a.txt"].mtime_ns == MTIME
    assert listing.skipped == []


async def test_default_excluded_dirs_are_pruned_unread(remote: Remote) -> None:
    root = remote.path
    write(root / "keep" / "a.txt", "kept\n")
    pruned = [root / "node_modules", root / "keep" / ".git", root / "keep" / "x" / "__pycache__"]
    for d in pruned:
        odd_kinds(d, remote.box.home / "outside")
        write(d / f".filesync.{DEAD_PID}.1.tmp", "a stale temp, left alone unread\n")
    for d in [*pruned, root / "keep" / "x"]:
        age_atime(d)
    listing = await remote.endpoint.list_tree(remote.root, RULE)
    assert set(listing.entries) == {"keep/a.txt"}
    assert listing.skipped == []
    assert listing.excluded >= len(pruned)
    assert [atime(d) for d in pruned] == [OLD_ATIME] * len(pruned)
    assert all((d / f".filesync.{DEAD_PID}.1.tmp").exists() for d in pruned)
    # The check means something: a directory that is walked has its atime moved.
    assert atime(root / "keep" / "x") != OLD_ATIME


async def test_pattern_excluded_dirs_are_pruned_unread(remote: Remote) -> None:
    root = remote.path
    rule = ExcludeRule.build(["cache/", "build*/", "*.log"])
    write(root / "keep" / "a.txt", "kept\n")
    write(root / "keep" / "a.log", "excluded file\n")
    pruned = [root / "cache", root / "keep" / "build-out", root / "keep" / "deep" / "cache"]
    for d in pruned:
        odd_kinds(d, remote.box.home / "outside")
    for d in [*pruned, root / "keep" / "deep"]:
        age_atime(d)
    listing = await remote.endpoint.list_tree(remote.root, rule)
    assert set(listing.entries) == {"keep/a.txt"}
    assert listing.skipped == []
    assert [atime(d) for d in pruned] == [OLD_ATIME] * len(pruned)
    assert atime(root / "keep" / "deep") != OLD_ATIME


async def test_links_special_files_and_unsafe_names_are_skipped_never_listed(
    remote: Remote,
) -> None:
    root, outside = remote.path, remote.box.home / "outside"
    write(root / "ok.txt", "fine\n")
    odd = odd_kinds(root, outside)
    age_atime(outside)
    listing = await remote.endpoint.list_tree(remote.root, RULE)
    assert set(listing.entries) == {"ok.txt"}
    skipped = [s.path for s in listing.skipped]
    assert set(skipped) == odd
    assert all(s.reason for s in listing.skipped)
    assert len(skipped) == len(set(skipped))  # each once
    assert atime(outside) == OLD_ATIME  # the symlinked directory was not followed


async def test_a_missing_root_lists_as_not_existing(remote: Remote) -> None:
    root = remote.endpoint.resolve_root("~/no/such/root")
    listing = await remote.endpoint.list_tree(root, RULE)
    assert (listing.exists, listing.entries, listing.skipped) == (False, {}, [])
    assert not (remote.box.home / "no").exists()  # listing created nothing


async def test_listing_removes_stale_temps_of_dead_runs_only(remote: Remote) -> None:
    root = remote.path
    assert remote.box.run_inside(f"kill -0 {DEAD_PID}").returncode != 0
    write(root / "a.txt", "a\n")
    write(root / f".filesync.{DEAD_PID}.0.tmp", "manifest of a cut run\n")
    write(root / "sub" / f".filesync.{DEAD_PID}.3.tmp", "half a file")
    write(root / "sub" / f".filesync.{LIVE_PID}.1.tmp", "a run in progress")
    listing = await remote.endpoint.list_tree(remote.root, RULE)
    assert set(listing.entries) == {"a.txt"}
    assert listing.skipped == []
    assert temps_under(root) == [f"sub/.filesync.{LIVE_PID}.1.tmp"]


async def test_prefetch_then_list_equals_a_listing_alone(remote: Remote) -> None:
    root = remote.path
    write(root / "a.txt", "a\n")
    write(root / "d" / "b.txt", "bb\n", 0o600)
    write(root / "node_modules" / "x.js", "x\n")
    odd_kinds(root / "odd", remote.box.home / "outside")
    other = await start_endpoint(remote.kind, remote.conduit)
    try:
        alone = await other.list_tree(remote.root, RULE)
    finally:
        await other.close()
    ep = remote.endpoint
    await ep.prefetch_list(remote.root, RULE)
    assert view(await ep.list_tree(remote.root, RULE)) == view(alone)
    # A prefetch followed by another request first: that request and the listing still
    # get their own answers.
    await ep.prefetch_list(remote.root, RULE)
    sink = Sink()
    await ep.fetch(remote.root, ["a.txt"], sink)
    assert sink.files == {"a.txt": b"a\n"}
    assert view(await ep.list_tree(remote.root, RULE)) == view(alone)


async def test_any_exists_follows_symlinks_and_waits_behind_a_pending_listing(
    remote: Remote,
) -> None:
    root = remote.path
    write(root / "a.txt", "a\n")
    (root / "d").mkdir()
    (root / "to-a").symlink_to("a.txt")
    (root / "dangling").symlink_to("nowhere")
    ep = remote.endpoint
    alone = view(await ep.list_tree(remote.root, RULE))

    def at(*names: str) -> list[str]:
        return [f"{remote.root}/{name}" for name in names]

    assert await ep.any_exists(at("nowhere", "a.txt")) is True
    assert await ep.any_exists(at("d")) is True
    assert await ep.any_exists(at("to-a")) is True
    assert await ep.any_exists(at("dangling", "nowhere", "d/nowhere")) is False
    assert await ep.any_exists([]) is False
    # Asked while a listing asked for ahead is pending (the pass's self-sync check): both
    # get their own answers, the listing whole.
    await ep.prefetch_list(remote.root, RULE)
    assert await ep.any_exists(at("nowhere")) is False
    assert await ep.any_exists(at("a.txt")) is True
    assert view(await ep.list_tree(remote.root, RULE)) == alone


@pytest.mark.parametrize("watch", [False, True], ids=["fresh", "watch"])
async def test_a_later_listing_shows_every_change(remote: Remote, watch: bool) -> None:
    root = remote.path
    write(root / "same.txt", "same\n")
    write(root / "edit.txt", "before\n")
    write(root / "gone.txt", "gone soon\n")
    write(root / "d" / "relinked.txt", "becomes a symlink\n")
    ep = remote.endpoint
    ep.watch = watch
    first = await ep.list_tree(remote.root, RULE)
    assert set(first.entries) == {"same.txt", "edit.txt", "gone.txt", "d/relinked.txt"}
    write(root / "edit.txt", "after, and longer\n")
    (root / "gone.txt").unlink()
    (root / "d" / "relinked.txt").unlink()
    (root / "d" / "relinked.txt").symlink_to("../same.txt")
    write(root / "new" / "dir" / "new.txt", "new\n")
    second = await ep.list_tree(remote.root, RULE)
    other = await start_endpoint(remote.kind, remote.conduit)
    try:
        fresh = await other.list_tree(remote.root, RULE)
    finally:
        await other.close()
    assert view(second) == view(fresh)
    assert set(second.entries) == {"same.txt", "edit.txt", "new/dir/new.txt"}
    assert second.entries["edit.txt"].size == len("after, and longer\n")
    assert [s.path for s in second.skipped] == ["d/relinked.txt"]


async def test_list_tree_unless_skips_only_a_listing_equal_to_the_known_one(
    remote: Remote,
) -> None:
    root = remote.path
    write(root / "a.txt", "a\n")
    write(root / "d" / "b.txt", "bb\n")
    first = await remote.endpoint.list_tree(remote.root, RULE)

    async def in_a_new_session(known: str) -> Listing | None:
        other = await start_endpoint(remote.kind, remote.conduit)
        try:
            return await other.list_tree_unless(remote.root, RULE, known)
        finally:
            await other.close()

    if remote.kind == "posix":  # takes no digests: always lists
        assert first.digest == ""
        listed = await in_a_new_session("0" * 32)
        assert listed is not None and view(listed) == view(first)
        return
    assert first.digest
    assert await in_a_new_session(first.digest) is None
    os.chmod(root / "a.txt", 0o600)  # one field of one row
    changed = await in_a_new_session(first.digest)
    assert changed is not None and changed.entries["a.txt"].mode == 0o600
    assert changed.digest not in ("", first.digest)
    # A delta of the same session is never taken for the full listing it updates.
    again = await remote.endpoint.list_tree_unless(remote.root, RULE, changed.digest)
    assert again is not None and view(again) == view(changed)


async def test_seal_digest_is_a_new_sessions_listing_only_of_the_root_as_left(
    remote: Remote,
) -> None:
    """After a listing, a send and a delete, ``seal_digest`` is the digest a new
    session's listing has; anything else changed since that listing gives ``""``."""
    root = remote.path
    write(root / "a.txt", "a\n")
    write(root / "d" / "b.txt", "bb\n")
    await remote.endpoint.list_tree(remote.root, RULE)
    await remote.endpoint.send(remote.root, [item("d/new.txt", b"new\n")])
    gone = (await remote.endpoint.list_tree(remote.root, RULE)).entries["a.txt"]
    await remote.endpoint.send(remote.root, [item("e/f.txt", b"f\n")])
    await remote.endpoint.delete(remote.root, [gone])
    digest = await remote.endpoint.seal_digest(remote.root, RULE)
    if remote.kind == "posix":  # takes no digests
        assert digest == ""
        return
    other = await start_endpoint(remote.kind, remote.conduit)
    try:
        assert digest and await other.list_tree_unless(remote.root, RULE, digest) is None
    finally:
        await other.close()
    write(root / "d" / "b.txt", "changed by someone else\n")
    assert await remote.endpoint.seal_digest(remote.root, RULE) == ""


# --------------------------------------------------------------------------- fetch


async def test_fetch_streams_exactly_the_asked_files(remote: Remote) -> None:
    root = remote.path
    files = {"a.txt": b"alpha\n", "empty": b"", "d/e/big.bin": os.urandom((5 << 20) + 7),
             "d/run.sh": b"#!/bin/sh\n", "not/asked.txt": b"never sent\n"}
    for rel, data in files.items():
        write(root / rel, data, 0o755 if rel.endswith(".sh") else 0o640)
    asked = ["d/e/big.bin", "a.txt", "empty", "d/run.sh"]
    sink = Sink()
    await remote.endpoint.fetch(remote.root, asked, sink)
    sink.assert_well_formed()
    assert sink.failed_paths == []
    assert sink.files == {rel: files[rel] for rel in asked}
    assert sorted(p for kind, p in sink.events if kind == "begin") == sorted(asked)
    for rel in asked:
        st = (root / rel).stat()
        head = sink.heads[rel]
        assert (head.size, head.mode) == (st.st_size, st.st_mode & 0o7777), rel


@pytest.mark.parametrize("listed", [True, False], ids=["listed", "unlisted"])
async def test_fetch_header_has_the_remote_mtime(remote: Remote, listed: bool) -> None:
    """The header is the file as the remote saw it, nanoseconds included, whether or not
    this endpoint listed the root before."""
    write(remote.path / "a.txt", "alpha\n")
    os.utime(remote.path / "a.txt", ns=(MTIME, MTIME))
    if listed:
        await remote.endpoint.list_tree(remote.root, RULE)
    sink = Sink()
    await remote.endpoint.fetch(remote.root, ["a.txt"], sink)
    assert sink.files == {"a.txt": b"alpha\n"}
    assert sink.heads["a.txt"].mtime_ns == MTIME


async def test_fetch_reports_vanished_and_refused_paths_as_failed(remote: Remote) -> None:
    root, outside = remote.path, remote.box.home / "outside"
    write(root / "ok.txt", "fine\n")
    write(root / "gone.txt", "about to vanish\n")
    odd_kinds(root, outside)
    write(remote.box.home / "beside.txt", "next to the root\n")
    await remote.endpoint.list_tree(remote.root, RULE)
    (root / "gone.txt").unlink()
    for p in (outside / "secret.txt", remote.box.home / "beside.txt"):
        age_atime(p)
    refused = ["gone.txt", "never-was.txt", "link.txt", "abslink", "dirlink/secret.txt",
               "fifo", "hard", "../beside.txt", "/root/beside.txt", "hard/../ok.txt",
               "bad\nname.txt"]
    sink = Sink()
    await remote.endpoint.fetch(remote.root, [*refused[:5], "ok.txt", *refused[5:]], sink)
    sink.assert_well_formed()
    assert sink.files == {"ok.txt": b"fine\n"}
    assert sorted(sink.failed_paths) == sorted(refused)
    assert [p for kind, p in sink.events if kind == "begin"] == ["ok.txt"]
    # Nothing outside the root was read, through a symlink or a '..'.
    assert atime(outside / "secret.txt") == OLD_ATIME
    assert atime(remote.box.home / "beside.txt") == OLD_ATIME


async def test_fetch_sends_a_path_asked_twice_once(remote: Remote) -> None:
    write(remote.path / "a.txt", "a\n")
    write(remote.path / "b.txt", "b\n")
    sink = Sink()
    await remote.endpoint.fetch(remote.root, ["a.txt", "b.txt", "a.txt", "gone", "gone"], sink)
    sink.assert_well_formed()
    assert sink.files == {"a.txt": b"a\n", "b.txt": b"b\n"}
    assert sink.failed_paths == ["gone"]


# --------------------------------------------------------------------------- send


async def test_send_lands_content_mode_and_mtime(remote: Remote) -> None:
    before = outside_state(remote)
    big = os.urandom((3 << 20) + 11)
    items = [
        item("a.txt", b"alpha\n", 0o640),
        item("new/deep/dir/run.sh", b"#!/bin/sh\necho hi\n", 0o755, MTIME + 1),
        item("empty", b"", 0o600, 10**18),
        item("new/big.bin", big, 0o644, MTIME - 10**9),
        item("odd name, 'q' $x.md", "ünïcödé\n".encode(), 0o644),
    ]
    outcomes = await remote.endpoint.send(remote.root, items)
    assert statuses(outcomes) == [(i.path, "ok") for i in items]
    for it, out in zip(items, outcomes, strict=True):
        data = b"".join(it.chunks())
        assert facts(remote.path / it.path) == (data, it.mode, it.mtime_ns), it.path
        assert (out.size, out.mtime_ns) == (len(data), it.mtime_ns), it.path
    assert temps_under(remote.path) == []
    assert outside_state(remote) == before


async def test_send_creates_parents_and_never_chmods_existing_dirs(remote: Remote) -> None:
    (remote.path / "keep").mkdir(parents=True)
    remote.path.chmod(0o711)
    (remote.path / "keep").chmod(0o750)
    outcomes = await remote.endpoint.send(remote.root, [
        item("keep/x.txt", b"x\n"), item("keep/made/y.txt", b"y\n")])
    assert statuses(outcomes) == [("keep/x.txt", "ok"), ("keep/made/y.txt", "ok")]
    assert remote.path.stat().st_mode & 0o7777 == 0o711
    assert (remote.path / "keep").stat().st_mode & 0o7777 == 0o750
    assert (remote.path / "keep" / "made" / "y.txt").read_bytes() == b"y\n"
    # A root that does not exist yet is created too.
    fresh = remote.endpoint.resolve_root("~/brand/new/root")
    [out] = await remote.endpoint.send(fresh, [item("f.txt", b"f\n")])
    assert out.status == "ok"
    assert (remote.box.home / "brand" / "new" / "root" / "f.txt").read_bytes() == b"f\n"


async def test_send_replaces_only_what_it_expects(remote: Remote) -> None:
    root = remote.path
    for name in ("listed.txt", "wrong-size.txt", "wrong-mtime.txt", "no-expect.txt"):
        write(root / name, f"remote {name}\n")
    listing = await remote.endpoint.list_tree(remote.root, RULE)
    now = {rel: facts(root / rel) for rel in listing.entries}
    e = listing.entries
    outcomes = await remote.endpoint.send(remote.root, [
        item("listed.txt", b"new\n", expect=(e["listed.txt"].size, e["listed.txt"].mtime_ns)),
        item("wrong-size.txt", b"new\n",
             expect=(e["wrong-size.txt"].size + 1, e["wrong-size.txt"].mtime_ns)),
        item("wrong-mtime.txt", b"new\n",
             expect=(e["wrong-mtime.txt"].size, e["wrong-mtime.txt"].mtime_ns + 1)),
        item("no-expect.txt", b"new\n", expect=None),
        item("absent.txt", b"new\n", expect=(4, MTIME)),
    ])
    assert statuses(outcomes) == [("listed.txt", "ok"), ("wrong-size.txt", "changed"),
                                  ("wrong-mtime.txt", "changed"), ("no-expect.txt", "changed"),
                                  ("absent.txt", "changed")]
    assert facts(root / "listed.txt") == (b"new\n", 0o644, MTIME)
    for rel in ("wrong-size.txt", "wrong-mtime.txt", "no-expect.txt"):
        assert facts(root / rel) == now[rel], rel
    assert not (root / "absent.txt").exists()
    assert temps_under(root) == []


async def test_send_matches_expect_given_without_a_listing(remote: Remote) -> None:
    """``expect`` is the (size, mtime_ns) the remote file has, wherever the caller got it."""
    write(remote.path / "t.txt", "remote\n")
    st = (remote.path / "t.txt").stat()
    [out] = await remote.endpoint.send(remote.root, [
        item("t.txt", b"replaced\n", expect=(st.st_size, st.st_mtime_ns))])
    assert out.status == "ok"
    assert (remote.path / "t.txt").read_bytes() == b"replaced\n"


async def test_send_refuses_to_write_through_symlinks_or_out_of_the_root(
    remote: Remote,
) -> None:
    root, outside = remote.path, remote.box.home / "outside"
    write(outside / "secret.txt", "outside\n")
    write(root / "afile", "a regular file\n")
    root.mkdir(exist_ok=True)
    (root / "dirlink").symlink_to(outside)
    (root / "filelink").symlink_to(outside / "secret.txt")
    (root / "d").mkdir()
    (root / "d" / "up").symlink_to("..")
    before = outside_state(remote)
    secret = (outside / "secret.txt").stat()
    outcomes = await remote.endpoint.send(remote.root, [
        item("dirlink/new.txt", b"no\n"),
        item("dirlink/secret.txt", b"no\n", expect=(secret.st_size, secret.st_mtime_ns)),
        item("filelink", b"no\n", expect=(secret.st_size, secret.st_mtime_ns)),
        item("filelink", b"no\n"),
        item("d/up/escaped.txt", b"no\n"),
        item("afile/x.txt", b"no\n"),
        item("../escape.txt", b"no\n"),
        item("/root/abs.txt", b"no\n"),
        item("ok.txt", b"yes\n"),
    ])
    assert [status for _path, status in statuses(outcomes)] == [
        "error", "error", "changed", "changed", "error", "error", "error", "error", "ok"]
    assert outside_state(remote) == before
    assert (root / "filelink").is_symlink()
    assert sorted(os.listdir(root)) == ["afile", "d", "dirlink", "filelink", "ok.txt"]
    assert os.listdir(root / "d") == ["up"]
    assert temps_under(root) == []


async def test_an_item_whose_chunks_raise_fails_alone(remote: Remote) -> None:
    before = outside_state(remote)

    def half() -> Iterator[bytes]:
        yield b"half of it"
        raise PermissionError(13, "Permission denied")

    def nothing() -> Iterator[bytes]:
        raise OSError(5, "Input/output error")
        yield b""  # pragma: no cover - makes this a generator

    write(remote.path / "d" / "kept.txt", "remote copy\n")
    kept = facts(remote.path / "d" / "kept.txt")
    listing = await remote.endpoint.list_tree(remote.root, RULE)
    k = listing.entries["d/kept.txt"]
    items = [
        item("d/first.txt", b"first\n"),
        SendItem("d/broken.txt", 0o644, MTIME, None, half),
        SendItem("d/kept.txt", 0o644, MTIME, (k.size, k.mtime_ns), nothing),
        item("d/last.txt", os.urandom(2 << 20)),
    ]
    outcomes = await remote.endpoint.send(remote.root, items)
    assert statuses(outcomes) == [("d/first.txt", "ok"), ("d/broken.txt", "error"),
                                  ("d/kept.txt", "error"), ("d/last.txt", "ok")]
    assert not (remote.path / "d" / "broken.txt").exists()
    assert facts(remote.path / "d" / "kept.txt") == kept
    assert (remote.path / "d" / "last.txt").read_bytes() == b"".join(items[3].chunks())
    assert temps_under(remote.path) == []
    assert outside_state(remote) == before
    # The endpoint is still in step: the next request is answered normally.
    again = await remote.endpoint.list_tree(remote.root, RULE)
    assert set(again.entries) == {"d/first.txt", "d/kept.txt", "d/last.txt"}


async def test_send_takes_a_generator_with_its_count(remote: Remote) -> None:
    made: list[str] = []

    def items() -> Iterator[SendItem]:
        for i in range(5):
            made.append(f"g/{i}.txt")
            yield item(f"g/{i}.txt", f"{i}\n".encode())

    outcomes = await remote.endpoint.send(remote.root, items(), count=5)
    assert statuses(outcomes) == [(p, "ok") for p in made] and len(made) == 5
    assert {p.name: p.read_text() for p in (remote.path / "g").iterdir()} == {
        f"{i}.txt": f"{i}\n" for i in range(5)}


# --------------------------------------------------------------------------- delete


async def test_delete_removes_only_files_still_as_listed(remote: Remote) -> None:
    root, outside = remote.path, remote.box.home / "outside"
    write(outside / "secret.txt", "outside\n")
    for name in ("same.txt", "edited.txt", "touched.txt", "relinked.txt"):
        write(root / name, f"{name}\n")
    files = (await remote.endpoint.list_tree(remote.root, RULE)).entries
    write(root / "edited.txt", "edited meanwhile\n")
    st = (root / "touched.txt").stat()
    os.utime(root / "touched.txt", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    (root / "relinked.txt").unlink()
    (root / "relinked.txt").symlink_to(outside / "secret.txt")
    asked = [files[n] for n in ("same.txt", "edited.txt", "touched.txt", "relinked.txt")]
    outcomes = await remote.endpoint.delete(remote.root, asked)
    assert statuses(outcomes) == [("same.txt", "ok"), ("edited.txt", "changed"),
                                  ("touched.txt", "changed"), ("relinked.txt", "changed")]
    assert sorted(os.listdir(root)) == ["edited.txt", "relinked.txt", "touched.txt"]
    assert (root / "edited.txt").read_text() == "edited meanwhile\n"
    assert (root / "relinked.txt").is_symlink()
    assert (outside / "secret.txt").read_text() == "outside\n"


async def test_delete_prunes_emptied_dirs_but_never_the_root(remote: Remote) -> None:
    root = remote.path
    for rel in ("a/b/c/deep.txt", "x/one.txt", "x/two.txt", "top.txt"):
        write(root / rel, f"{rel}\n")
    (root / "unrelated" / "empty").mkdir(parents=True)
    files = (await remote.endpoint.list_tree(remote.root, RULE)).entries
    outcomes = await remote.endpoint.delete(
        remote.root, [files["a/b/c/deep.txt"], files["x/one.txt"], files["top.txt"]])
    assert [status for _path, status in statuses(outcomes)] == ["ok", "ok", "ok"]
    assert sorted(os.listdir(root)) == ["unrelated", "x"]
    assert os.listdir(root / "x") == ["two.txt"]
    assert os.listdir(root / "unrelated") == ["empty"]
    [out] = await remote.endpoint.delete(remote.root, [files["x/two.txt"]])
    assert out.status == "ok"
    assert sorted(os.listdir(root)) == ["unrelated"]
    (root / "unrelated" / "empty").rmdir()
    (root / "unrelated").rmdir()
    write(root / "last.txt", "the only file\n")
    [last] = (await remote.endpoint.list_tree(remote.root, RULE)).entries.values()
    assert [o.status for o in await remote.endpoint.delete(remote.root, [last])] == ["ok"]
    assert root.is_dir() and os.listdir(root) == []


async def test_delete_ignores_entries_that_are_not_files(remote: Remote) -> None:
    root = remote.path
    write(root / "d" / "f.txt", "f\n")
    write(root / "e" / "g.txt", "g\n")
    (root / "link").symlink_to("d/f.txt")
    files = (await remote.endpoint.list_tree(remote.root, RULE)).entries
    link, d = (root / "link").lstat(), (root / "e").lstat()
    asked = [
        Entry("link", "l", link.st_size, link.st_mtime_ns, 0o777),
        files["d/f.txt"],
        Entry("e", "d", d.st_size, d.st_mtime_ns, 0o755),
    ]
    outcomes = await remote.endpoint.delete(remote.root, asked)
    assert statuses(outcomes) == [("d/f.txt", "ok")]
    assert (root / "link").is_symlink()
    assert (root / "e" / "g.txt").read_text() == "g\n"


# --------------------------------------------------------------------------- close


async def test_close_ends_the_remote_side(remote: Remote) -> None:
    box = remote.box
    baseline = set(container_processes(box))
    ep = await start_endpoint(remote.kind, remote.conduit)
    write(remote.path / "a.txt", "a\n")
    await ep.list_tree(remote.root, RULE)
    await ep.send(remote.root, [item("b.txt", b"b\n")])
    if remote.kind == "helper":
        started = set(container_processes(box)) - baseline
        assert started, "the helper runs as a remote process"
    await ep.close()
    await wait_until(lambda: set(container_processes(box)) <= baseline,
               "the endpoint's remote processes are gone")
    await ep.close()  # idempotent


async def test_close_of_a_broken_endpoint_kills_the_remote_side(remote: Remote) -> None:
    box = remote.box
    baseline = set(container_processes(box))
    ep = await start_endpoint(remote.kind, remote.conduit)
    await ep.list_tree(remote.root, RULE)
    ep.broken = True
    await ep.close()
    await wait_until(lambda: set(container_processes(box)) <= baseline,
               "the broken endpoint's remote processes are gone")
    await ep.close()


async def test_a_dropped_connection_raises_connection_lost_and_close_still_works(
    remote: Remote,
) -> None:
    write(remote.path / "a.txt", "a\n")
    remote.box.kill_sessions()
    await wait_until(lambda: not remote.conduit.alive, "the client saw the connection drop")
    with pytest.raises(ConnectionLost):
        await remote.endpoint.list_tree(remote.root, RULE)
    with pytest.raises(TransportError):
        await remote.endpoint.send(remote.root, [item("b.txt", b"b\n")])
    await remote.endpoint.close()
    await remote.endpoint.close()
    assert not (remote.path / "b.txt").exists()


class FullDisk(Sink):
    """A sink that fails on the first bytes it is given, as a full staging disk does."""

    def begin(self, head: FetchHeader) -> Callable[[bytes], None]:
        super().begin(head)

        def write(data: bytes) -> None:
            raise OSError(28, "No space left on device")

        return write


async def test_close_after_a_call_that_raised_mid_stream_ends_the_remote_side(
    remote: Remote,
) -> None:
    box = remote.box
    write(remote.path / "big.bin", os.urandom(32 << 20))
    baseline = set(container_processes(box))
    ep = await start_endpoint(remote.kind, remote.conduit)
    sink = FullDisk()
    with pytest.raises(FilesyncError):
        await ep.fetch(remote.root, ["big.bin"], sink)
    assert [kind for kind, _p in sink.events][:1] == ["begin"]  # it failed mid-file
    await ep.close()
    await wait_until(lambda: set(container_processes(box)) <= baseline,
                     "the interrupted endpoint's remote processes are gone")
    await ep.close()


async def test_an_empty_send_creates_the_root_and_nothing_else(remote: Remote) -> None:
    root = f"{remote.root}/fresh/deeper"
    assert await remote.endpoint.send(root, [], 0) == []
    made = remote.path / "fresh" / "deeper"
    assert made.is_dir() and list(made.iterdir()) == []
