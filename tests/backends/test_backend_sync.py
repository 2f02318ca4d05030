"""``filesync.backends.sync``: the sync helper of a backend that keeps its own command path.

Pushes at setup and before commands with a minimum interval (an injected clock, no sleeps),
a failed push retried at the next command, a teardown that never raises, self-sync turning
sync off with one warning, one push for threads that ask together. The remote is the local
transport (the same helper as over SSH); the SSH runs are in test_backend_sync_sshd.py.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest
from synctree import snapshot, write

from filesync import Mapping, SelfSync, Session, SessionClosed
from filesync.backends import AsyncBackendSync, BackendSync
from filesync.backends.sync import SyncPolicy


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    write(tmp_path / "home" / "skills" / "a.md", "a\n")
    write(tmp_path / "home" / "token.json", "secret\n", 0o600)
    return tmp_path / "home"


def _mappings(tree: Path) -> list[Mapping]:
    return [Mapping(tree / "skills", "skills"),
            Mapping(tree / "token.json", "gh_token.json", "upload-only")]


def test_pushes_at_setup_then_before_a_command_once_the_interval_passed(
    tree: Path, tmp_path: Path
) -> None:
    clock = Clock()
    remote = tmp_path / "box"
    with Session(remote, state_dir=tmp_path / "s") as session:
        sync = BackendSync(session, _mappings(tree), interval=5.0, clock=clock)
        assert sync.setup().uploaded == 2
        assert snapshot(remote) == {"skills/a.md": b"a\n", "gh_token.json": b"secret\n"}
        write(tree / "skills" / "b.md", "b\n")
        clock.now += 4.9
        assert sync.before_command() is None  # inside the interval: no push
        assert not (remote / "skills" / "b.md").exists()
        clock.now += 0.1
        report = sync.before_command()
        assert report is not None and report.uploaded == 1
        assert sync.before_command() is None  # the interval starts again
        write(remote / "skills" / "r.md", "from the remote\n")
        write(remote / "gh_token.json", "tampered\n")
        down = sync.teardown()
    assert down.downloaded == 1 and down.failed == []
    assert snapshot(tree) == {"skills/a.md": b"a\n", "skills/b.md": b"b\n",
                              "skills/r.md": b"from the remote\n", "token.json": b"secret\n"}


def test_a_failed_push_is_retried_at_the_next_command_not_after_the_interval(
    tree: Path, tmp_path: Path
) -> None:
    clock = Clock()
    remote = tmp_path / "box"
    # The credential's link points at a file that is not there yet (written later by a
    # login flow): its mapping fails, the others still go.
    link = tree / "gh.json"
    link.symlink_to(tree / "secrets" / "github-token-v2.json")
    mappings = [Mapping(link, "gh_token.json", "upload-only"),
                Mapping(tree / "skills", "skills")]
    with Session(remote, state_dir=tmp_path / "s") as session:
        sync = BackendSync(session, mappings, interval=3600.0, clock=clock)
        first = sync.setup()
        assert [m for m, _ in first.failed] == [mappings[0]]
        assert str(link) in str(first.failed[0][1])  # the mapping names itself
        assert (remote / "skills" / "a.md").read_text() == "a\n"  # the others still ran
        again = sync.before_command()  # no time passed: retried anyway
        assert again is not None and [m for m, _ in again.failed] == [mappings[0]]
        write(tree / "secrets" / "github-token-v2.json", "v2\n", 0o600)
        done = sync.before_command()
        assert done is not None and done.failed == [] and done.uploaded == 1
        assert (remote / "gh_token.json").read_text() == "v2\n"
        assert sync.before_command() is None  # back to the interval


def test_a_push_that_cannot_run_is_kept_in_the_report_and_retried(
    tree: Path, tmp_path: Path
) -> None:
    clock = Clock()
    session = Session(tmp_path / "box", state_dir=tmp_path / "s")
    sync = BackendSync(session, _mappings(tree), clock=clock)
    sync.setup()
    session.close()
    report = sync.before_command()  # due: the interval has not passed, but nothing failed...
    assert report is None
    clock.now += 5
    report = sync.before_command()  # ...now it is due, and the call cannot run
    assert report is not None and {type(e) for _, e in report.failed} == {SessionClosed}
    assert [m for m, _ in report.failed] == _mappings(tree)


def test_teardown_never_raises_and_returns_the_errors(tree: Path, tmp_path: Path) -> None:
    session = Session(tmp_path / "box", state_dir=tmp_path / "s")
    sync = BackendSync(session, _mappings(tree))
    sync.setup()
    session.close()
    report = sync.teardown()  # the session is gone: the error comes back, never raised
    assert [(m, type(e)) for m, e in report.failed] == [(_mappings(tree)[0], SessionClosed)]
    # A mapping that cannot run (its link now dangles) comes back in the report; the
    # other mappings are still pulled.
    link = tree / "notes.md"
    link.symlink_to(tree / "skills" / "a.md")
    mappings = [Mapping(link, "notes.md"), *_mappings(tree)]
    with Session(tmp_path / "box", state_dir=tmp_path / "s") as session:
        sync = BackendSync(session, mappings)
        sync.setup()
        write(tmp_path / "box" / "skills" / "new.md", "n\n")
        link.unlink()
        link.symlink_to(tree / "gone.md")
        report = sync.teardown()
    assert [m for m, _ in report.failed] == [mappings[0]]
    assert str(link) in str(report.failed[0][1])
    assert report.downloaded == 1 and (tree / "skills" / "new.md").read_text() == "n\n"


def test_self_sync_turns_sync_off_with_one_warning(
    tree: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="filesync.backends.sync")
    clock = Clock()
    # The remote's base is the agent's home itself: a loopback target.
    with Session(tree.parent, state_dir=tmp_path / "s") as session:
        sync = BackendSync(session, [Mapping(tree / "skills", "home/skills")], clock=clock)
        assert sync.setup().passes == [] and not sync.enabled
        clock.now += 100
        assert sync.before_command() is None
        assert sync.teardown().passes == []
    warnings = [r for r in caplog.records if "sync is off" in r.getMessage()]
    assert len(warnings) == 1 and "same tree" in warnings[0].getMessage()
    assert snapshot(tree / "skills") == {"a.md": b"a\n"}


def test_self_sync_raises_when_asked_and_teardown_still_does_not(
    tree: Path, tmp_path: Path
) -> None:
    with Session(tree.parent, state_dir=tmp_path / "s") as session:
        sync = BackendSync(session, [Mapping(tree / "skills", "home/skills")],
                           on_self_sync="raise")
        with pytest.raises(SelfSync):
            sync.setup()
        assert sync.teardown().passes == [] and not sync.enabled
    with pytest.raises(ValueError, match="on_self_sync='off' is not valid"):
        SyncPolicy([], on_self_sync="off")


def test_threads_asking_together_push_once(tree: Path, tmp_path: Path) -> None:
    clock = Clock()
    with Session(tmp_path / "box", state_dir=tmp_path / "s") as session:
        sync = BackendSync(session, _mappings(tree), clock=clock)
        sync.setup()
        write(tree / "skills" / "b.md", "b\n")
        clock.now += 10
        start = threading.Barrier(6)
        reports: list[object] = []

        def command() -> None:
            start.wait()
            reports.append(sync.before_command())

        threads = [threading.Thread(target=command) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert sum(r is not None for r in reports) == 1
    assert (tmp_path / "box" / "skills" / "b.md").read_text() == "b\n"


async def test_the_async_helper_follows_the_same_policy(tree: Path, tmp_path: Path) -> None:
    from filesync import AsyncSession

    clock = Clock()
    remote = tmp_path / "box"
    link = tree / "gh.json"
    link.symlink_to(tree / "later.json")
    mappings = [Mapping(tree / "skills", "skills"), Mapping(link, "gh_token.json")]
    async with AsyncSession(remote, state_dir=tmp_path / "s") as session:
        sync = AsyncBackendSync(session, mappings, interval=60.0, clock=clock)
        assert [m for m, _ in (await sync.setup()).failed] == mappings[1:]
        write(tree / "later.json", "now\n")
        done = await sync.before_command()
        assert done is not None and done.uploaded == 1 and done.failed == []
        assert await sync.before_command() is None
        write(remote / "skills" / "r.md", "r\n")
        assert (await sync.teardown()).downloaded == 1
    assert (tree / "skills" / "r.md").read_text() == "r\n"
