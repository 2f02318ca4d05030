"""Environments side by side: sessions of one pair in several threads or processes wait
for each other's pass (``lock_timeout``, default 60 s; 0 fails at once), over the real
OpenSSH sshd; ``LockBusy`` from a session names the session's parameter."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sshd import SshdContainer
from synctree import write

from filesync import LockBusy, Mapping, Session, SessionReport

pytestmark = pytest.mark.sshd


@pytest.fixture
def pair(tmp_path: Path, box: SshdContainer) -> Iterator[tuple[Mapping, Path]]:
    for n in range(20):
        write(tmp_path / "home" / "skills" / f"f{n}.md", f"{n}\n")
    yield Mapping(tmp_path / "home" / "skills", "side-by-side/skills"), tmp_path / "state"
    subprocess.run(["rm", "-rf", str(box.home / "side-by-side")], check=True)


def session(box: SshdContainer, state: Path, **kw: Any) -> Session:
    return Session(box.alias, ssh_config=box.ssh_config, state_dir=state, **kw)


def test_four_threads_each_with_a_session_push_the_same_pair(
        box: SshdContainer, pair: tuple[Mapping, Path]) -> None:
    mapping, state = pair
    sessions = [session(box, state) for _ in range(4)]
    go = threading.Barrier(4)
    results: list[SessionReport | BaseException] = []

    def push(s: Session) -> None:
        go.wait()
        try:
            results.append(s.push(mapping))
        except BaseException as exc:
            results.append(exc)
        finally:
            s.close()

    threads = [threading.Thread(target=push, args=(s,)) for s in sessions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(isinstance(r, SessionReport) for r in results), results
    assert sum(r.uploaded for r in results if isinstance(r, SessionReport)) == 20
    assert len(list((box.home / "side-by-side" / "skills").iterdir())) == 20


HOLDER = """
import sys, time
from pathlib import Path
from filesync.host.state import PairState
state_dir, local, remote, root, released = sys.argv[1:]
held = PairState.open(Path(state_dir), local, remote, root)
print("held", flush=True)
sys.stdin.readline()  # until the test says so
Path(released).write_text(repr(time.monotonic()))
held.close()
"""


def test_a_session_waits_for_another_process_then_succeeds(
        tmp_path: Path, box: SshdContainer, pair: tuple[Mapping, Path]) -> None:
    mapping, state = pair
    with session(box, state) as first:
        first.push(mapping)
    info = json.loads(next((state / "pairs").glob("*/pair.json")).read_text())
    released = tmp_path / "released"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(state), info["local"], info["remote"],
         info["remote_root"], str(released)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        write(Path(mapping.local) / "new.md", "new\n")
        with session(box, state, lock_timeout=0) as impatient, \
                pytest.raises(LockBusy) as busy:
            impatient.push(mapping)
        # The library's parameter, not the CLI's option.
        assert "lock_timeout" in str(busy.value) and "--lock-timeout" not in str(busy.value)
        done: list[float] = []
        waiting = threading.Event()
        second = session(box, state,  # the default deadline: 60 s
                         log=lambda line: "waiting up to 60 s" in line and waiting.set())
        started = time.monotonic()
        pusher = threading.Thread(target=lambda: done.append(
            second.push(mapping).uploaded and time.monotonic()))
        pusher.start()
        assert waiting.wait(120)  # the second session waits on the pair's lock: release it
        assert holder.stdin is not None
        holder.stdin.write("go\n")
        holder.stdin.flush()
        pusher.join(120)
        second.close()
    finally:
        holder.kill()
        holder.wait()
    assert done and done[0] > float(released.read_text())  # it finished after the release
    print(f"the second session waited {float(released.read_text()) - started:.2f} s "
          f"for the holder, then pushed in {done[0] - float(released.read_text()):.2f} s")
    assert (box.home / "side-by-side" / "skills" / "new.md").read_text() == "new\n"


def test_a_deadline_that_runs_out_names_the_sessions_parameter(
        box: SshdContainer, pair: tuple[Mapping, Path]) -> None:
    mapping, state = pair
    with session(box, state) as first:
        first.push(mapping)
    info = json.loads(next((state / "pairs").glob("*/pair.json")).read_text())
    from filesync.host.state import PairState

    held = PairState.open(state, info["local"], info["remote"], info["remote_root"])
    try:
        with session(box, state, lock_timeout=0.3) as s, pytest.raises(LockBusy) as busy:
            s.push(mapping)
    finally:
        held.close()
    assert "lock_timeout" in str(busy.value) and "0.3 s" in str(busy.value)

