"""Fault injection against the real OpenSSH sshd: lost connections, full disks, remote races.

Every test runs the real CLI (in-process, ``filesync.cli.main``) over the SSH transport to
the namespaced sshd of ``tests/sshd.py``. Lost connections are real: a ``CuttingConduit``
counts the run's I/O calls on the conduit and, right before call N, calls
``sshd.kill_sessions()``, which SIGKILLs the server side of the connection (the helper dies
with it). N walks through the whole run, from opening the exec channel to the goodbye.

After each fault: the run failed with one clean line (or finished, when the cut came after
its last needed byte); every file on both sides holds its old or its new content; a clean
rerun converges; no temp, journal or staging file is left; no edit on either side is lost.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from synctree import write
from test_reliability_support import (
    CutPlan,
    ancestors,
    assert_clean_failure,
    check_old_or_new,
    cutting,
    files_under,
    leftovers,
    record,
    run_cli,
    state_leftovers,
)

import filesync.endpoint.helper
import filesync.sync.plan
import filesync.sync.staging
import filesync.sync.transition
import filesync.transport.ssh.conduit

pytestmark = pytest.mark.sshd

POINTS = 24  # cut points per direction (the issue asks for at least 20)
BIG_PULL = 3 << 20


@pytest.fixture(autouse=True)
def user_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "userhome"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    monkeypatch.delenv("FILESYNC_TEST_CRASH", raising=False)
    # The cut points are spread over the I/O calls of a calibration run, which assumes a
    # later run makes about as many; with the asyncssh client's fixed channel packets it
    # does (and the pull sweep tunes that client's window). Through the system ssh, pipe
    # reads coalesce replies by timing, so this sweep stays on asyncssh; the OpenSSH
    # client's cut handling is tested by tests/transport/test_ssh_regression.py.
    monkeypatch.setenv("FILESYNC_SSH_CLIENT", "asyncssh")


class SshPair:
    """A host root, a remote root inside the sshd container, and a state dir."""

    def __init__(self, sshd: Any, tmp_path: Path, name: str) -> None:
        self.sshd = sshd
        self.rel = f"reliability/{tmp_path.name}/{name}"
        self.remote = Path(sshd.home) / self.rel  # the same files, seen from the host
        self.local = tmp_path / name / "local"
        self.state = tmp_path / name / "state"
        self.local.mkdir(parents=True)
        self.remote.mkdir(parents=True)

    def argv(self, command: str, *extra: str) -> list[str]:
        return [command, str(self.local), f"{self.sshd.alias}:{self.rel}", "--json",
                "--state-dir", str(self.state), "-F", str(self.sshd.ssh_config), *extra]

    def run(self, command: str, *extra: str) -> tuple[int, Any, str]:
        return run_cli(self.argv(command, *extra))

    def ok(self, command: str, *extra: str) -> Any:
        code, report, err = self.run(command, *extra)
        assert code == 0, (code, report, err)
        assert "Traceback" not in err
        return report

    def no_leftovers(self) -> None:
        assert leftovers(self.local, self.remote, self.state) == []
        assert state_leftovers(self.state) == []


@pytest.fixture
def same_io_at_any_speed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every run reads back every unchanged remote file, however fast the machine is.

    A run re-reads (fetches) an unchanged remote file when the run before recorded it
    within ``RACY_NS`` of its mtime (the racy-timestamp rule). How many are in that window
    depends on the machine's speed: on a loaded one a run records later and re-reads
    fewer, its I/O calls no longer match the calibration run the cut points come from, and
    the last points fall after the run's end. A window wider than the whole test keeps
    every file in it: each run's I/O sequence is the same at any speed.
    """
    for module in (filesync.sync.plan, filesync.sync.transition):
        monkeypatch.setattr(module, "RACY_NS", 1 << 62)


def base_tree(root: Path, big: int = 2 << 20) -> None:
    for i in range(16):
        write(root / "s" / f"{i:02d}.txt", f"file {i} gen 0\n" * (40 + 30 * i))
    write(root / "big" / "a.bin", os.urandom(300 << 10))
    write(root / "big" / "b.bin", os.urandom(big + 12345))
    write(root / "deep" / "x" / "y" / "z.txt", "deep\n")
    write(root / "new" / "0.txt", "new 0\n")


def mutate(root: Path, gen: int, pulled: bool = False) -> None:
    """One generation of edits: a third of the small files, big files, a create, a delete.

    A pull edits the big file of ``BIG_PULL`` bytes every time: a cut only fails a run while
    data is still to come, and a few MiB fit in the socket buffers (sshd's last bytes
    still arrive after it is killed).
    """
    for i in range(16):
        if i % 3 == gen % 3:
            write(root / "s" / f"{i:02d}.txt", f"file {i} gen {gen}\n" * (40 + 30 * i))
    for name in ("a.bin", "b.bin") if pulled else ("a.bin" if gen % 2 else "b.bin",):
        big = root / "big" / name
        write(big, os.urandom(big.stat().st_size + 1))
    write(root / "new" / f"{gen}.txt", f"new {gen}\n")
    (root / "new" / f"{gen - 1}.txt").unlink()


def cut_points(total: int, n: int = POINTS) -> list[int]:
    """``n`` distinct I/O call numbers spread over 1..total (1 = opening the channel)."""
    points = sorted({1 + (k * (total - 1)) // (n - 1) for k in range(n)})
    extra = [p for p in range(1, total + 1) if p not in points]
    return sorted(points + extra[: n - len(points)])


def faulty_run(pair: SshPair, command: str, plan: CutPlan) -> tuple[int, Any, str]:
    with cutting(plan):
        code, report, err = pair.run(command)
    if code != 0:
        assert_clean_failure(code, err)
    else:
        assert "Traceback" not in err
    return code, report, err


@pytest.mark.timeout(240)
@pytest.mark.usefixtures("same_io_at_any_speed")
def test_push_survives_the_connection_cut_at_every_point(sshd: Any, tmp_path: Path) -> None:
    pair = SshPair(sshd, tmp_path, "push")
    base_tree(pair.local)
    write(pair.remote / "remote-only.txt", "the remote's own file\n")
    write(pair.local / ".git" / "HEAD", "excluded\n")
    pair.ok("push")
    mutate(pair.local, 1)
    calibration = CutPlan(sshd.kill_sessions)
    with cutting(calibration):
        pair.ok("push")
    points = cut_points(calibration.calls)
    failed = cut = 0
    for gen, point in enumerate(points, start=2):
        old_remote = files_under(pair.remote)
        old_host = files_under(pair.local)
        mutate(pair.local, gen)
        new_host = files_under(pair.local)
        new_remote = {p: b for p, b in new_host.items() if not p.startswith(".git/")}
        new_remote["remote-only.txt"] = old_remote["remote-only.txt"]
        plan = CutPlan(sshd.kill_sessions, point)
        code, _, _ = faulty_run(pair, "push", plan)
        failed += code != 0
        cut += plan.killed > 0
        assert plan.killed > 0 or plan.calls < point
        assert files_under(pair.local) == new_host  # push never touches the host
        remote_now = {p: b for p, b in files_under(pair.remote).items()
                      if not p.rsplit("/", 1)[-1].startswith(".filesync.")}
        check_old_or_new(remote_now, old_remote, new_remote, f"push cut at I/O call {point}")
        report = pair.ok("push")
        assert report["conflicts"] == [] and report["skipped"] == []
        assert files_under(pair.remote) == new_remote, f"no convergence after cut {point}"
        assert files_under(pair.local) == new_host
        assert old_host != new_host
        pair.no_leftovers()
    assert cut >= 20 and failed >= POINTS - 4, (cut, failed)  # nearly every cut hit the run
    record("lost-connection-push", faults=cut, runs_failed=failed, survived=cut, bytes_lost=0)


@pytest.mark.timeout(240)
@pytest.mark.usefixtures("same_io_at_any_speed")
def test_pull_survives_the_connection_cut_at_every_point(
    sshd: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A 64 KiB channel window (a slow link) bounds what is in flight: with the default
    # 8 MiB, a cut in the last MiBs of a pull finds them already in the client's buffers.
    monkeypatch.setattr(filesync.transport.ssh.conduit, "_WINDOW", 64 << 10)
    monkeypatch.setattr(filesync.transport.ssh.conduit, "_MAX_PKTSIZE", 32 << 10)
    pair = SshPair(sshd, tmp_path, "pull")
    base_tree(pair.remote, big=BIG_PULL)
    write(pair.remote / ".hub" / "lock.json", "remote bookkeeping, excluded\n")
    pair.ok("pull")
    mutate(pair.remote, 1, pulled=True)
    calibration = CutPlan(sshd.kill_sessions)
    with cutting(calibration):
        pair.ok("pull")
    # Half the cuts spread over the run's I/O calls (every phase: channel, helper upload,
    # listing, file headers, data, goodbye), half over the bytes it reads (deep in data).
    half = POINTS // 2
    points = [(p, False) for p in cut_points(calibration.calls * 9 // 10, half)] + [
        (calibration.bytes * k // (half + 1), True) for k in range(1, half + 1)]
    failed = cut = 0
    for gen, (point, by_bytes) in enumerate(points, start=2):
        # The host's own edits must survive too: one new file and one edit per generation.
        write(pair.local / "host-own" / f"{gen}.txt", f"host {gen}\n")
        write(pair.local / "host-edit.txt", f"host edit {gen}\n")
        old_host = files_under(pair.local)
        old_remote = files_under(pair.remote)
        mutate(pair.remote, gen, pulled=True)
        new_remote = files_under(pair.remote)
        new_host = {p: b for p, b in new_remote.items() if not p.startswith(".hub/")}
        new_host.update({p: b for p, b in old_host.items() if p.startswith("host-")})
        plan = CutPlan(sshd.kill_sessions, point, by_bytes)
        code, _, _ = faulty_run(pair, "pull", plan)
        failed += code != 0
        cut += plan.killed > 0
        assert plan.killed > 0 or plan.calls < point
        check_old_or_new(files_under(pair.local), old_host, new_host,
                         f"pull cut at I/O call {point}")
        assert files_under(pair.remote) == new_remote  # pull never touches the remote
        assert old_remote != new_remote
        report = pair.ok("pull")
        assert report["conflicts"] == [] and report["skipped"] == []
        assert files_under(pair.local) == new_host, f"no convergence after cut {point}"
        pair.no_leftovers()
    # A cut after the last byte the run needs is survived by just finishing; most are not.
    assert cut >= 20 and failed >= POINTS // 2, (cut, failed)
    record("lost-connection-pull", faults=cut, runs_failed=failed, survived=cut, bytes_lost=0)


# -- disk full ------------------------------------------------------------------------------


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Callable[[str, str], Path]]:
    """``make(name, size)`` mounts a tmpfs of ``size`` at tmp_path/name; unmounted after."""
    mounted: list[Path] = []

    def make(name: str, size: str) -> Path:
        where = tmp_path / name
        where.mkdir(parents=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                       check=True)
        mounted.append(where)
        return where

    yield make
    for where in reversed(mounted):
        subprocess.run(["umount", "-l", str(where)], check=False)


def grow(where: Path, size: str) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(where)], check=True)


@pytest.mark.timeout(120)
def test_host_disk_full_while_staging(sshd: Any, tmp_path: Path, small_tmpfs: Any) -> None:
    """The state dir (staging) fills up: one line, exit 1, host and state untouched."""
    pair = SshPair(sshd, tmp_path, "fullstate")
    pair.state = small_tmpfs("statefs", "512k")
    write(pair.remote / "small.txt", "small v1\n")
    pair.ok("pull")
    before_anc = ancestors(pair.state)
    write(pair.remote / "small.txt", "small v2\n")
    write(pair.remote / "huge.bin", os.urandom(2 << 20))
    before_host = files_under(pair.local)
    code, report, err = pair.run("pull")
    assert_clean_failure(code, err)
    assert "No space left on device" in err and "huge.bin" in err
    assert report["error"] and report["exit_code"] == 1
    assert files_under(pair.local) == before_host
    assert ancestors(pair.state) == before_anc
    pair.no_leftovers()
    grow(pair.state, "16m")
    report = pair.ok("pull")
    assert report["downloaded"] == 2
    assert files_under(pair.local) == files_under(pair.remote)
    pair.no_leftovers()
    record("disk-full", faults=1, survived=1, bytes_lost=0)


@pytest.mark.timeout(120)
def test_host_disk_full_while_applying(sshd: Any, tmp_path: Path, small_tmpfs: Any) -> None:
    """The host root fills up: the file that does not fit is never half there, exit 1."""
    pair = SshPair(sshd, tmp_path, "fullhost")
    pair.local = small_tmpfs("hostfs", "1m")
    write(pair.remote / "keep.txt", "v1\n")
    pair.ok("pull")
    write(pair.remote / "keep.txt", "v2\n")
    write(pair.remote / "a-fits.txt", "fits\n")
    write(pair.remote / "z-huge.bin", os.urandom(3 << 20))
    old_host = files_under(pair.local)
    before_anc = ancestors(pair.state)
    code, report, err = pair.run("pull")
    assert_clean_failure(code, err)
    assert "z-huge.bin" in err and "No space left on device" in err
    now = files_under(pair.local)
    assert "z-huge.bin" not in now  # never a partial file
    check_old_or_new(now, old_host, files_under(pair.remote), "host disk full")
    huge_rows = [k for k in ancestors(pair.state) if k.endswith("/z-huge.bin")]
    assert huge_rows == []  # what did not land is not recorded
    after_anc = ancestors(pair.state)
    [keep] = [k for k in after_anc if k.endswith("/keep.txt")]
    assert (after_anc[keep] != before_anc[keep]) == (now["keep.txt"] == b"v2\n")
    assert [s["path"] for s in report["skipped"]] == ["z-huge.bin"]
    pair.no_leftovers()
    grow(pair.local, "16m")
    pair.ok("pull")
    assert files_under(pair.local) == files_under(pair.remote)
    pair.no_leftovers()
    record("disk-full", faults=1, survived=1, bytes_lost=0)


@pytest.mark.timeout(120)
def test_remote_disk_full(sshd: Any, tmp_path: Path) -> None:
    """A tmpfs mounted inside the container fills up during a push."""
    pair = SshPair(sshd, tmp_path, "fullremote")
    inside = f"/root/{pair.rel}"
    mounted = sshd.run_inside(f"mount -t tmpfs -o size=1m tmpfs {inside}")
    assert mounted.returncode == 0, mounted.stderr
    try:
        write(pair.local / "keep.txt", "v1\n")
        pair.ok("push")
        write(pair.local / "keep.txt", "v2\n")
        write(pair.local / "a-fits.txt", "fits\n")
        write(pair.local / "z-huge.bin", os.urandom(3 << 20))
        code, report, err = pair.run("push")
        assert_clean_failure(code, err)
        assert "z-huge.bin" in err and "No space left on device" in err
        listing = sshd.run_inside(
            f"cd {inside} && find . -type f -printf '%P\\n' | sort && cat keep.txt")
        names = listing.stdout.split()
        assert names[:2] == ["a-fits.txt", "keep.txt"] and "z-huge.bin" not in names
        assert not any(".filesync." in n for n in names)  # no temp left behind
        assert names[-1] == "v2"
        assert not [k for k in ancestors(pair.state) if k.endswith("/z-huge.bin")]
        assert report["uploaded"] == 2
        grown = sshd.run_inside(f"mount -o remount,size=16m {inside}")
        assert grown.returncode == 0, grown.stderr
        assert pair.ok("push")["uploaded"] == 1
        digest = sshd.run_inside(f"sha256sum {inside}/z-huge.bin").stdout.split()[0]
        import hashlib

        assert digest == hashlib.sha256((pair.local / "z-huge.bin").read_bytes()).hexdigest()
    finally:
        sshd.run_inside(f"umount -l {inside}")
    record("disk-full", faults=1, survived=1, bytes_lost=0)


# -- the remote changes while the run reads it ---------------------------------------------------


@pytest.mark.timeout(120)
def test_remote_rewritten_or_deleted_between_listing_and_fetch(
    sshd: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pair = SshPair(sshd, tmp_path, "race")
    write(pair.remote / "rewritten.txt", "v1\n")
    write(pair.remote / "deleted.txt", "v1\n")
    write(pair.remote / "steady.txt", "v1\n")
    pair.ok("pull")
    write(pair.remote / "rewritten.txt", "v2 as listed\n")
    write(pair.remote / "deleted.txt", "v2 as listed\n")
    write(pair.remote / "steady.txt", "v2\n")
    real_fetch = filesync.endpoint.helper.HelperEndpoint.fetch

    async def racing_fetch(self: Any, root: str, paths: Any, sink: Any) -> None:
        write(pair.remote / "rewritten.txt", "v3, rewritten after the listing, longer\n")
        (pair.remote / "deleted.txt").unlink()
        await real_fetch(self, root, paths, sink)

    monkeypatch.setattr(filesync.endpoint.helper.HelperEndpoint, "fetch", racing_fetch)
    report = pair.ok("pull")
    monkeypatch.undo()
    host = files_under(pair.local)
    assert host["steady.txt"] == b"v2\n"
    # the fetched version is whole: the old one or the one read after the rewrite
    assert host["rewritten.txt"] in (b"v1\n", b"v3, rewritten after the listing, longer\n")
    assert host["deleted.txt"] == b"v1\n"  # a vanished file is reported, not applied
    reasons = {s["path"]: s["reason"] for s in report["skipped"]}
    assert "No such file" in reasons["deleted.txt"] and "retried" in reasons["deleted.txt"]
    report = pair.ok("pull")
    assert files_under(pair.local) == files_under(pair.remote)
    assert "deleted.txt" not in files_under(pair.local)
    pair.no_leftovers()
    record("remote-race", faults=2, survived=2, bytes_lost=0)


@pytest.mark.timeout(120)
def test_torn_remote_read_is_never_applied(
    sshd: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file appended to while it streams is reported as torn and left for the next run."""
    pair = SshPair(sshd, tmp_path, "torn")
    big = pair.remote / "growing.log"
    write(big, b"x" * (48 << 20))
    write(pair.remote / "other.txt", "other\n")
    real_begin = filesync.sync.staging.StagingSink.begin
    appended = []

    def begin(self: Any, head: Any) -> Callable[[bytes], None]:
        writer = real_begin(self, head)
        if head.path != "growing.log":
            return writer

        def spy(data: bytes) -> None:
            if not appended:  # the first chunk arrived: the helper is still reading
                with big.open("ab") as f:
                    f.write(b"appended while streaming\n")
                appended.append(True)
            writer(data)

        return spy

    monkeypatch.setattr(filesync.sync.staging.StagingSink, "begin", begin)
    report = pair.ok("pull")
    monkeypatch.undo()
    assert appended
    host = files_under(pair.local)
    assert "growing.log" not in host  # neither torn nor a stale half
    assert host["other.txt"] == b"other\n"
    reasons = {s["path"]: s["reason"] for s in report["skipped"]}
    assert "changed while being read" in reasons["growing.log"]
    pair.ok("pull")
    assert (pair.local / "growing.log").read_bytes() == big.read_bytes()
    pair.no_leftovers()
    record("remote-race", faults=1, survived=1, bytes_lost=0)


@pytest.mark.timeout(120)
def test_remote_edited_between_scan_and_upload_is_kept(
    sshd: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pair = SshPair(sshd, tmp_path, "recheck")
    write(pair.local / "doc.txt", "v1\n")
    write(pair.local / "gone.txt", "v1\n")
    pair.ok("push")
    write(pair.local / "doc.txt", "host v2\n")
    (pair.local / "gone.txt").unlink()
    real_send = filesync.endpoint.helper.HelperEndpoint.send
    real_delete = filesync.endpoint.helper.HelperEndpoint.delete

    async def racing_send(self: Any, root: str, items: Any, count: Any = None) -> Any:
        write(pair.remote / "doc.txt", "remote edit during the run\n")
        return await real_send(self, root, items, count)

    async def racing_delete(self: Any, root: str, files: Any) -> Any:
        write(pair.remote / "gone.txt", "remote edit of a file the host deleted\n")
        return await real_delete(self, root, files)

    monkeypatch.setattr(filesync.endpoint.helper.HelperEndpoint, "send", racing_send)
    monkeypatch.setattr(filesync.endpoint.helper.HelperEndpoint, "delete", racing_delete)
    report = pair.ok("push")
    monkeypatch.undo()
    assert (pair.remote / "doc.txt").read_text() == "remote edit during the run\n"
    assert (pair.remote / "gone.txt").read_text() == "remote edit of a file the host deleted\n"
    assert {s["path"] for s in report["skipped"]} == {"doc.txt", "gone.txt"}
    # The next push keeps the remote edit as a conflict copy before it overwrites.
    report = pair.ok("push")
    saved = {c["path"]: Path(c["saved_to"]).read_text() for c in report["conflicts"]}
    assert saved["doc.txt"] == "remote edit during the run\n"
    assert saved["gone.txt"] == "remote edit of a file the host deleted\n"
    assert not (pair.remote / "gone.txt").exists()
    assert (pair.remote / "doc.txt").read_text() == "host v2\n"
    pair.no_leftovers()
    record("remote-race", faults=2, survived=2, bytes_lost=0)

