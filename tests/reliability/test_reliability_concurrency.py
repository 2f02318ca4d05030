"""Concurrent runs: the per-pair lock, and many pairs sharing one state dir.

- A second run on the same pair fails at once with a clear one-line message naming the
  holder's pid, or with ``--lock-timeout`` waits for the holder and then runs.
- Runs of different pairs in parallel (real processes, one shared state dir, one of them
  SIGKILLed mid-apply) never corrupt any state database: every ``PRAGMA integrity_check``
  is ``ok``, every pair converges and a final run has nothing to do.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from synctree import Pair, write
from test_reliability_support import (
    assert_clean_failure,
    files_under,
    integrity,
    record,
    state_leftovers,
)

from filesync.core.faults import CRASH_ENV


@pytest.mark.timeout(60)
def test_second_run_fails_clearly_or_waits_for_the_lock(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pair = Pair(tmp_path / "local", tmp_path / "remote", tmp_path / "state")
    write(pair.local / "a.txt", "a\n")
    pair.ok("push")
    [pair_dir] = (pair.state / "pairs").iterdir()
    lock = pair_dir / "lock"
    holder = os.open(lock, os.O_RDWR)  # another run, as far as the lock can tell
    fcntl.flock(holder, fcntl.LOCK_EX)
    os.pwrite(holder, f"{os.getpid()}".encode(), 0)
    code, report = pair.run("push")
    assert_clean_failure(code, pair.stderr)
    assert f"another filesync run (pid {os.getpid()})" in pair.stderr
    assert "--lock-timeout" in pair.stderr
    assert report["exit_code"] == 1

    # With --lock-timeout the run waits: release the holder only once the waiter has
    # found the lock taken (it is then in its wait loop), so the wait really happens. (The
    # waiter holds the lock file open only while it tries, so its descriptor is no signal.)
    write(pair.local / "b.txt", "b\n")
    waiting = threading.Event()
    real_flock = fcntl.flock

    def flock(fd: int, operation: int) -> None:
        try:
            real_flock(fd, operation)
        except BlockingIOError:
            waiting.set()
            raise

    monkeypatch.setattr(fcntl, "flock", flock)

    def release_when_waited_for() -> None:
        waiting.wait()
        os.close(holder)

    releaser = threading.Thread(target=release_when_waited_for, daemon=True)
    releaser.start()
    report = pair.ok("push", "--lock-timeout", "50")
    releaser.join()
    assert waiting.is_set()
    assert report["uploaded"] == 1
    assert files_under(pair.remote) == files_under(pair.local)


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "filesync.cli", *args], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.timeout(120)
def test_parallel_runs_never_corrupt_the_state(tmp_path: Path) -> None:
    state = tmp_path / "state"
    env = {k: v for k, v in os.environ.items() if k != CRASH_ENV}
    pairs = [Pair(tmp_path / f"p{i}" / "local", tmp_path / f"p{i}" / "remote", state)
             for i in range(6)]
    for i, p in enumerate(pairs):
        for j in range(20):
            write(p.local / "d" / f"{j}.txt", f"pair {i} file {j}\n" * 50)
    runs = 0
    for rnd in range(4):
        for p in pairs:
            if rnd:
                write(p.local / "d" / f"{rnd}.txt", f"host edit {rnd}\n")
                write(p.remote / "r" / f"{rnd}.txt", f"remote new {rnd}\n")
                write(p.remote / "d" / f"{rnd + 10}.txt", f"remote edit {rnd}\n")
        procs = []
        for i, p in enumerate(pairs):
            args = ["sync", str(p.local), str(p.remote), "--json", "--state-dir", str(state)]
            # Round 2 kills pair 0 in the middle of its host apply; the others run on.
            crash = {CRASH_ENV: "placed:2"} if (rnd, i) == (2, 0) else {}
            procs.append(cli(*args, env={**env, **crash}))
        for i, proc in enumerate(procs):
            _, err = proc.communicate(timeout=100)
            runs += 1
            if (rnd, i) == (2, 0):
                assert proc.returncode == -signal.SIGKILL, err
            else:
                assert proc.returncode == 0, (rnd, i, err)
                assert "Traceback" not in err
    dbs = sorted((state / "pairs").glob("*/state.db"))
    assert len(dbs) == len(pairs)
    for p in pairs:
        report = p.ok("sync")  # pair 0 finishes its journal here; the rest is a no-op
        assert report["conflicts"] == [] and report["skipped"] == []
        assert files_under(p.local) == files_under(p.remote)
        assert p.ok("sync")["uploaded"] == 0
    assert [integrity(db) for db in dbs] == ["ok"] * len(pairs)
    assert state_leftovers(state) == []
    record("concurrency", runs=runs + 2 * len(pairs), faults=1, survived=1, bytes_lost=0)
