"""A fan-out reads the host tree once: one walk, one hash and one read per file for all
remotes (filesync.host.shared_scan), with the same result on every remote."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sshd import SshdContainer
from synctree import snapshot, write

import filesync.host.scan as scan_mod
import filesync.host.shared_scan as shared_mod
import filesync.sync.plan as plan_mod
from filesync.cli.main import main
from filesync.core.exclude import ExcludeRule
from filesync.core.model import Entry
from filesync.core.reconcile import Direction
from filesync.host.shared_scan import ContentCache, HostScans, SharedReader
from filesync.sync.engine import Options, run_pass
from filesync.transport.local import local_conduit

FILES = 40


def run(*argv: str) -> tuple[int, Any]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(list(argv))
    return code, json.loads(out.getvalue())


def host_tree(root: Path) -> dict[str, bytes]:
    for i in range(FILES):
        write(root / f"d{i % 4}" / f"f{i}.bin", os.urandom(100 + 37 * i))
    return snapshot(root)


class Counts:
    """Calls of the host walk, the scan hash and the upload opens, by local path."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, local: Path) -> None:
        self.walks = 0
        self.hashed: list[str] = []
        self.opened: list[str] = []
        prefix = str(local) + "/"

        def walk(real: Callable[..., Any]) -> Callable[..., Any]:
            def counted(*args: Any, **kw: Any) -> Any:
                self.walks += 1
                return real(*args, **kw)
            return counted

        def hashed(real: Callable[..., str]) -> Callable[..., str]:
            def counted(path: Any, *args: Any) -> str:
                self.hashed.append(str(path))
                return real(path, *args)
            return counted

        def opened(real: Callable[..., int]) -> Callable[..., int]:
            def counted(path: Any, *args: Any) -> int:
                if str(path).startswith(prefix):
                    self.opened.append(str(path))
                return real(path, *args)
            return counted

        for mod in (plan_mod, shared_mod):
            monkeypatch.setattr(mod, "list_local", walk(mod.list_local))
        monkeypatch.setattr(scan_mod, "hash_file", hashed(scan_mod.hash_file))
        for mod in (scan_mod, shared_mod):
            monkeypatch.setattr(mod, "open_regular", opened(mod.open_regular))


def test_fan_out_push_walks_and_reads_each_host_file_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    local = tmp_path / "local"
    want = host_tree(local)
    remotes = [tmp_path / f"r{i}" for i in range(3)]
    counts = Counts(monkeypatch, local)
    code, report = run("push", str(local), *map(str, remotes), "--json",
                       "--state-dir", str(tmp_path / "s"))
    assert code == 0 and report["uploaded"] == 3 * FILES
    assert counts.walks == 1
    # every file read once for the three uploads, none hashed apart from its upload
    assert sorted(counts.opened) == sorted(str(local / rel) for rel in want)
    assert counts.hashed == []
    for r in remotes:
        assert snapshot(r) == want


def test_fan_out_hashes_each_host_file_once_for_all_pairs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The remotes already hold the files but no pair has state: every host file must be
    # hashed to be compared, and one hash serves the three pairs.
    local = tmp_path / "local"
    want = host_tree(local)
    remotes = [tmp_path / f"r{i}" for i in range(3)]
    for r in remotes:
        for rel, data in want.items():
            write(r / rel, data)
    write(remotes[1] / "d0" / "f0.bin", b"remote edit")
    for rel in want:  # old enough for the racy-timestamp rule to let the pairs cache them
        os.utime(local / rel, ns=(10**18, 10**18))
    counts = Counts(monkeypatch, local)
    code, report = run("push", str(local), *map(str, remotes), "--json",
                       "--state-dir", str(tmp_path / "s"))
    assert code == 0 and report["uploaded"] == 1
    assert counts.walks == 1
    assert sorted(counts.hashed) == sorted(str(local / rel) for rel in want)
    for r in remotes:
        assert snapshot(r) == want
    # the next push hashes nothing: each pair cached the shared digests itself
    counts.hashed.clear()
    assert run("push", str(local), *map(str, remotes), "--json",
               "--state-dir", str(tmp_path / "s"))[1]["uploaded"] == 0
    assert counts.hashed == []


def test_fan_out_over_ssh_reads_the_host_tree_once(
    sshd: SshdContainer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    local = tmp_path / "local"
    want = host_tree(local)
    rels = [f"fan-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    counts = Counts(monkeypatch, local)
    code, report = run("push", str(local), *(f"{sshd.alias}:{r}" for r in rels), "--json",
                       "-F", str(sshd.ssh_config), "--state-dir", str(tmp_path / "s"))
    assert code == 0 and report["uploaded"] == 2 * FILES
    assert counts.walks == 1
    assert sorted(counts.opened) == sorted(str(local / rel) for rel in want)
    for r in rels:
        assert snapshot(sshd.home / r) == want


def test_a_lone_push_shares_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    local = tmp_path / "local"
    host_tree(local)
    created: list[HostScans] = []
    monkeypatch.setattr(shared_mod.HostScans, "__init__", lambda self, *a: created.append(self))
    assert run("push", str(local), str(tmp_path / "r"), "--json",
               "--state-dir", str(tmp_path / "s"))[0] == 0
    assert created == []


def test_a_host_change_makes_later_passes_walk_again(tmp_path: Path) -> None:
    root = tmp_path / "t"
    write(root / "a", "1")
    rule = ExcludeRule.build(root=root)

    async def go() -> list[set[str]]:
        scans = HostScans({})
        first, _ = await scans.listing(root, rule, None, 0)
        same, _ = await scans.listing(root, rule, None, 0)
        write(root / "b", "2")
        stale, _ = await scans.listing(root, rule, None, 0)
        scans.changed(root / "sub")  # a nested root's change is a change of this tree
        fresh, _ = await scans.listing(root, rule, None, 0)
        assert scans.walks == 2
        assert first.entries is not same.entries  # each pass gets its own copy
        return [set(x.entries) for x in (first, same, stale, fresh)]

    assert asyncio.run(go()) == [{"a"}, {"a"}, {"a"}, {"a", "b"}]


def test_the_walk_start_time_comes_with_a_shared_listing(tmp_path: Path) -> None:
    write(tmp_path / "a", "1")
    rule = ExcludeRule.build(root=tmp_path)

    async def go() -> tuple[int, int]:
        scans = HostScans({})
        _, first = await scans.listing(tmp_path, rule, None, 111)
        _, second = await scans.listing(tmp_path, rule, None, 999)
        return first, second

    assert asyncio.run(go()) == (111, 111)


def _entry(path: Path) -> Entry:
    st = path.stat()
    return Entry(path.name, "f", st.st_size, st.st_mtime_ns, st.st_mode, st.st_ino)


def _read(reader: SharedReader) -> bytes:
    return b"".join(reader())


def test_shared_reader_serves_the_bytes_read_once_and_their_digest(tmp_path: Path) -> None:
    f = write(tmp_path / "f", os.urandom(3000))
    cache = ContentCache()
    one = SharedReader(str(f), None, _entry(f), cache, uses=1)
    data = _read(one)
    os.chmod(f, 0)  # a second open would fail for a non-root user; removal proves it for root
    saved = f.read_bytes()
    f.unlink()
    two = SharedReader(str(f), None, _entry_of(saved, one), cache, uses=1)
    assert _read(two) == data == saved and two.digest == one.digest and two.size == 3000
    assert cache.held == 0  # served to every other pass: dropped


def _entry_of(data: bytes, reader: SharedReader) -> Entry:
    size, mtime_ns, ino = reader.stat
    return Entry("f", "f", size, mtime_ns, 0o100644, ino)


def test_shared_reader_never_stores_a_file_that_is_not_as_listed(tmp_path: Path) -> None:
    f = write(tmp_path / "f", b"old")
    listed = _entry(f)
    write(f, b"newer")  # changed after the listing
    cache = ContentCache()
    assert _read(SharedReader(str(f), None, listed, cache, uses=3)) == b"newer"
    assert cache.held == 0
    assert cache.take(str(f), (listed.size, listed.mtime_ns, listed.ino)) is None


def test_content_cache_keeps_within_its_byte_budget(tmp_path: Path) -> None:
    cache = ContentCache(budget=1000, max_file=600)
    for i in range(5):
        cache.put(f"p{i}", (400, i, i), (b"x" * 400,), "d", uses=2)
        assert cache.held <= 1000
    cache.put("big", (700, 0, 0), (b"x" * 700,), "d", uses=2)
    assert cache.take("big", (700, 0, 0)) is None  # over max_file: never stored
    assert cache.take("p4", (400, 4, 4)) is not None and cache.take("p0", (400, 0, 0)) is None


def test_a_config_sync_of_one_root_to_two_remotes_converges(tmp_path: Path) -> None:
    # Concurrent passes on one shared host root, one of them writing the host: nothing is
    # lost or undone between the remotes, and the next run brings all three together.
    local, r1, r2 = tmp_path / "local", tmp_path / "r1", tmp_path / "r2"
    want = host_tree(local)
    cfg = write(tmp_path / "f.toml", f"""
remotes = ["file://{r1}", "file://{r2}"]
[[mapping]]
local = "{local}"
remote = "t"
""")
    state = str(tmp_path / "s")
    assert run("sync", "--config", str(cfg), "--json", "--state-dir", state)[0] == 0
    write(r1 / "t" / "new.txt", "from r1\n")
    write(r2 / "t" / "d1" / "f1.bin", b"edited on r2")
    for _ in range(2):
        assert run("sync", "--config", str(cfg), "--json", "--state-dir", state)[0] == 0
    want = {**want, "new.txt": b"from r1\n", "d1/f1.bin": b"edited on r2"}
    assert snapshot(local) == snapshot(r1 / "t") == snapshot(r2 / "t") == want


def test_a_pass_after_a_host_write_plans_on_a_fresh_walk(tmp_path: Path) -> None:
    # Two sync passes of one run on one host root, the first pulling a new file in: the
    # second must list the host as it is now and push that file on, in the same run.
    local, r1, r2 = tmp_path / "local", tmp_path / "r1", tmp_path / "r2"
    write(local / "a.txt", "a\n")
    scans = HostScans({local: 2})

    async def go() -> None:
        conduit = local_conduit()
        try:
            opts = Options(Direction.SYNC, rule=ExcludeRule.build(root=local),
                           state_dir=tmp_path / "s")
            for remote in (r1, r2):
                await run_pass(conduit, local, str(remote), opts, host_scans=scans)
            write(r1 / "new.txt", "from r1\n")
            for remote in (r1, r2):
                await run_pass(conduit, local, str(remote), opts, host_scans=scans)
        finally:
            await conduit.close()

    asyncio.run(go())
    want = {"a.txt": b"a\n", "new.txt": b"from r1\n"}
    assert snapshot(local) == snapshot(r1) == snapshot(r2) == want
