"""``Session.watch`` over the real OpenSSH sshd: edits cross both ways while it runs, a
conflict keeps both versions, a cut connection is retried and what changed meanwhile
arrives, a vanished root stops it (nothing propagated), the fallbacks to polling, and
a watch driven from several threads.

Every wait is for a condition, with a generous deadline; nothing asserts a duration.
"""

from __future__ import annotations

import shutil
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from synctree import write

from filesync import Mapping, SafetyRefusal, Session, SessionReport

pytestmark = pytest.mark.sshd

DEADLINE = 90.0
BOX = 8  # sshd_factory index of this module's private containers (any free one will do)


def until(what: Callable[[], bool], why: str, deadline: float = DEADLINE) -> None:
    end = time.monotonic() + deadline
    while not what():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting until {why}")
        time.sleep(0.02)


def holds(path: Path, text: str) -> Callable[[], bool]:
    def check() -> bool:
        try:
            return path.read_text() == text
        except OSError:
            return False

    return check


def _session(box: Any, tmp_path: Path, **kwargs: Any) -> Session:
    return Session(box.alias, ssh_config=box.ssh_config, state_dir=tmp_path / "state",
                   **kwargs)


def _pair(box: Any, tmp_path: Path) -> tuple[Path, Path, str]:
    name = f"watch-{uuid.uuid4().hex[:8]}"
    return tmp_path / "local", box.home / name, name


def test_edits_cross_both_ways_while_watching(sshd: Any, tmp_path: Path) -> None:
    local, remote, name = _pair(sshd, tmp_path)
    write(local / "a.md", "a1")
    write(local / "keep.md", "k")
    reports: list[SessionReport] = []
    with _session(sshd, tmp_path) as s:
        w = s.watch(Mapping(local, name), on_report=reports.append)
        # watch() returns after the first pass: both sides already agree.
        assert (remote / "a.md").read_text() == "a1"
        write(local / "a.md", "a2")
        until(holds(remote / "a.md", "a2"), "the host edit is on the remote")
        write(remote / "sub" / "r.md", "r1")
        until(holds(local / "sub" / "r.md", "r1"), "the remote file is on the host")
        write(remote / "sub" / "r.md", "r2")
        until(holds(local / "sub" / "r.md", "r2"), "the remote edit is on the host")
        (remote / "a.md").unlink()
        until(lambda: not (local / "a.md").exists(), "the remote delete reached the host")
        write(local / "node_modules" / "x.js", "junk")  # excluded: never sent
        write(local / "later.md", "l")
        until(holds(remote / "later.md", "l"), "a later host file is on the remote")
        w.stop()
        assert not w.running and w.error is None
    assert not (remote / "node_modules").exists()
    assert (remote / "keep.md").read_text() == "k"
    assert all(isinstance(r, SessionReport) for r in reports) and len(reports) == w.passes
    shutil.rmtree(remote)


def test_a_conflict_while_watching_keeps_both_versions(sshd: Any, tmp_path: Path) -> None:
    local, remote, name = _pair(sshd, tmp_path)
    write(local / "base.md", "b")
    armed = threading.Event()
    conflicts: list[dict[str, str]] = []

    def on_report(report: SessionReport) -> None:
        conflicts.extend(report.conflicts)
        if armed.is_set():
            # Called on the loop between passes: both edits land before the next pass.
            armed.clear()
            write(local / "c.md", "host side")
            write(remote / "c.md", "remote side")

    with _session(sshd, tmp_path) as s:
        w = s.watch(Mapping(local, name), on_report=on_report)
        armed.set()
        write(local / "trigger.md", "t")
        until(lambda: any(c["path"] == "c.md" for c in conflicts), "the conflict is reported")
        w.stop()
        status = s.status(Mapping(local, name))
    assert (local / "c.md").read_text() == "host side"
    assert (remote / "c.md").read_text() == "remote side"
    saved = next(c for c in conflicts if c["path"] == "c.md")["saved_to"]
    assert Path(saved).read_text() == "remote side"
    assert [c.path for c in status.open_conflicts] == ["c.md"]
    shutil.rmtree(remote)


def test_a_cut_connection_is_retried_and_edits_made_meanwhile_arrive(
    sshd_factory: Callable[[int], Any], tmp_path: Path
) -> None:
    box = sshd_factory(BOX)
    local, remote, name = _pair(box, tmp_path)
    write(local / "a.md", "a")
    seen: list[str] = []
    with _session(box, tmp_path, log=seen.append, connect_timeout=5) as s:
        w = s.watch(Mapping(local, name))
        # Connected first: a cut while ssh still logs in would kill nothing, and the login
        # would then only fail once the link is down, never a connection said lost.
        until(holds(remote / "a.md", "a"), "the first pass pushed a.md")
        # The cut first, while the link is up, so the client sees its connection drop
        # (with the link already down the FIN is lost and only the 60 s idle deadline
        # would tell); then the link stays down so that reconnecting fails until it is up.
        assert box.kill_sessions() >= 1
        box.link_down()
        try:
            until(lambda: any("connection was lost" in m for m in seen), "the loss is said")
            write(local / "host-while-down.md", "H")
            write(remote / "remote-while-down.md", "R")
        finally:
            box.link_up()
        until(holds(remote / "host-while-down.md", "H"), "the host edit crossed after the cut")
        until(holds(local / "remote-while-down.md", "R"), "the remote edit came back")
        write(local / "after.md", "x")  # and it is watching again
        until(holds(remote / "after.md", "x"), "an edit after the reconnect crossed")
        w.stop()
    assert sum("connection was lost" in m for m in seen) == 1
    assert any("connected again" in m for m in seen)
    assert s.connections_opened >= 2


def test_a_vanished_remote_root_stops_the_watch(sshd: Any, tmp_path: Path) -> None:
    local, remote, name = _pair(sshd, tmp_path)
    write(local / "a.md", "a")
    write(local / "b.md", "b")
    with _session(sshd, tmp_path) as s:
        w = s.watch(Mapping(local, name))
        shutil.rmtree(remote)
        assert w.wait(DEADLINE), "the watch did not stop"
        assert isinstance(w.error, SafetyRefusal)
        with pytest.raises(SafetyRefusal):
            w.stop()
    # Nothing was propagated: the host keeps every file, the remote stays gone.
    assert (local / "a.md").read_text() == "a" and (local / "b.md").read_text() == "b"
    assert not remote.exists()


def test_falls_back_to_polling_on_both_sides_and_says_so_once(
    sshd_factory: Callable[[int], Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import watchfiles._rust_notify as rust

    class AtTheLimit:
        def __init__(self, *args: object) -> None:
            raise OSError("OS file watch limit reached. about [\"/x\"]")

    # The host: the native watcher refuses (as at the inotify watch limit). The remote:
    # no python3, so the POSIX fallback serves it and nothing watches there.
    monkeypatch.setattr(rust, "RustNotify", AtTheLimit)
    box = sshd_factory(BOX)
    box.hide_python()
    local, remote, name = _pair(box, tmp_path)
    write(local / "a.md", "a")
    seen: list[str] = []
    with _session(box, tmp_path, log=seen.append) as s:
        w = s.watch(Mapping(local, name))
        write(local / "a.md", "a2")
        until(holds(remote / "a.md", "a2"), "the host edit is on the remote")
        write(remote / "r.md", "r")
        until(holds(local / "r.md", "r"), "the remote file is on the host")
        write(local / "a.md", "a3")
        until(holds(remote / "a.md", "a3"), "a second host edit is on the remote")
        w.stop()
    assert w.loop.host is not None and w.loop.host.polling
    assert sum("watching the host tree natively failed" in m for m in seen) == 1
    assert sum("remote tree cannot be watched" in m for m in seen) == 1


def test_watch_from_one_thread_stop_from_another_and_calls_in_between(
    sshd: Any, tmp_path: Path
) -> None:
    local, remote, name = _pair(sshd, tmp_path)
    write(local / "a.md", "a")
    out: dict[str, Any] = {}
    with _session(sshd, tmp_path) as s:
        starter = threading.Thread(target=lambda: out.update(w=s.watch(Mapping(local, name))))
        starter.start()
        starter.join()
        w = out["w"]
        # Another call while the watch waits on the helper: served, not held up for long.
        write(local / "b.md", "b")
        report = s.push(Mapping(local, name))
        assert report.uploaded + report.conflicts.__len__() <= 1
        assert (remote / "b.md").read_text() == "b"
        write(remote / "c.md", "c")
        until(holds(local / "c.md", "c"), "the watch still brings remote files")
        stopper = threading.Thread(target=w.stop)
        stopper.start()
        stopper.join()
        assert not w.running
    shutil.rmtree(remote)


def test_close_stops_the_watch_after_a_last_pass(sshd: Any, tmp_path: Path) -> None:
    local, remote, name = _pair(sshd, tmp_path)
    write(local / "a.md", "a")
    s = _session(sshd, tmp_path)
    w = s.watch(Mapping(local, name))
    passes = w.passes
    closer = threading.Thread(target=s.close)  # a reaper thread's teardown
    closer.start()
    closer.join()
    assert not w.running and w.passes > passes and w.error is None
    shutil.rmtree(remote)
