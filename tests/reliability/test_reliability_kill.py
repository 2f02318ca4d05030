"""A real SIGKILL of a real client process at every step of a pull's apply.

The client is ``python -m filesync.cli pull`` over SSH to the namespaced sshd. The test hook
``FILESYNC_TEST_CRASH=STEP:N`` (``filesync.core.faults.crash_point``, inert unless set) makes the
process SIGKILL itself the Nth time it reaches STEP: while staging fetched files, right
after the journal is durable, before each op, after the old file was kept for undo, after
each rename/unlink, after the last op, after the undo manifest. Each step of a pull that
replaces 3 files, creates 2 and deletes 1 is hit once: 24 kill points.

After each kill: every host file holds its old or its new content; the next (clean) run
finishes the journal before anything else and converges; no temp, journal or staging file
is left; the host's own edits are never lost.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from synctree import write
from test_reliability_support import (
    check_old_or_new,
    files_under,
    leftovers,
    record,
    run_cli,
    state_leftovers,
)

from filesync.core.faults import CRASH_ENV

pytestmark = pytest.mark.sshd

# (step, how many times a pull that replaces 3, creates 2 and deletes 1 file reaches it)
STEPS = [
    ("staged", 5),
    ("journal-saved", 1),
    ("before-op", 6),
    ("kept", 4),
    ("placed", 6),
    ("ops-done", 1),
    ("manifest-written", 1),
]
KILL_POINTS = [(step, n) for step, count in STEPS for n in range(1, count + 1)]


def mutate_remote(remote: Path, gen: int) -> None:
    for name in ("r1.txt", "r2.txt"):
        write(remote / "docs" / name, f"{name} generation {gen}\n" * (gen + 3))
    write(remote / "bin" / "r3.bin", os.urandom(200_000 + gen))
    write(remote / "new" / f"{gen}a.txt", f"new a {gen}\n")
    write(remote / "new" / f"{gen}b.txt", f"new b {gen}\n")
    old = remote / "new" / f"{gen - 1}a.txt"
    if old.exists():
        old.unlink()


@pytest.mark.timeout(240)
def test_sigkill_at_every_step_of_apply(sshd: Any, tmp_path: Path) -> None:
    home = tmp_path / "userhome"
    home.mkdir()
    rel = f"reliability/{tmp_path.name}/kill"
    remote = Path(sshd.home) / rel
    local = tmp_path / "local"
    state = tmp_path / "state"
    argv = ["pull", str(local), f"{sshd.alias}:{rel}", "--json", "--state-dir", str(state),
            "-F", str(sshd.ssh_config)]
    env = {k: v for k, v in os.environ.items() if k not in ("SSH_AUTH_SOCK", CRASH_ENV)}
    env["HOME"] = str(home)
    os.environ.pop(CRASH_ENV, None)

    mutate_remote(remote, 1)
    assert run_cli(argv)[0] == 0
    killed = 0
    for gen, (step, nth) in enumerate(KILL_POINTS, start=2):
        write(local / "host-own.txt", f"the host's own edit {gen}\n")
        old_host = files_under(local)
        mutate_remote(remote, gen)
        new_host = dict(files_under(remote), **{"host-own.txt": old_host["host-own.txt"]})

        proc = subprocess.run(
            [sys.executable, "-m", "filesync.cli", *argv],
            env={**env, CRASH_ENV: f"{step}:{nth}"},
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
        )
        assert proc.returncode == -signal.SIGKILL, (step, nth, proc.returncode, proc.stderr)
        killed += 1
        where = f"SIGKILL at {step} #{nth}"
        check_old_or_new(files_under(local), old_host, new_host, where)

        code, report, err = run_cli(argv)
        assert code == 0, (where, err)
        assert report["conflicts"] == [] and report["skipped"] == [], (where, report)
        assert files_under(local) == new_host, where
        assert leftovers(local, remote, state) == [] and state_leftovers(state) == [], where
        # Converged for good: another run has nothing to do.
        code, report, _ = run_cli(argv)
        assert (code, report["downloaded"], report["deleted_local"]) == (0, 0, 0), where
    assert killed == len(KILL_POINTS) >= 20
    record("sigkill-client", faults=killed, survived=killed, bytes_lost=0)
