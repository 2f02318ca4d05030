"""Hangs and orphans, against the real namespaced OpenSSH sshd and the real CLI process.

- a helper that goes silent (SIGSTOPped mid-run) stops the run after ``--idle-timeout``
  with one line and exit 1, and the client kills it: nothing of it is left on the remote;
- a helper that works long but honestly (a walk stalled by the fault hook
  ``FILESYNC_TEST_STALL``, ``filesync.tree.watchdog.stall_point``) sends keepalives, and
  the run finishes past the deadline;
- a killed client leaves no helper behind, be it stuck in a long operation or healthy.

The stall hook is set in the remote's ``~/.ssh/environment`` (the test sshd permits user
environments) of a private container, so no other test sees it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from synctree import write

from filesync.core.faults import CRASH_ENV
from filesync.tree.watchdog import STALL_ENV

pytestmark = pytest.mark.sshd

BOX = 11  # sshd_factory index used by this module
#: The deadline no orphan may outlive (the rule under test, not a guess at speed).
ORPHAN_DEADLINE = 5.0


@pytest.fixture
def box(sshd_factory: Callable[[int], Any]) -> Iterator[Any]:
    container = sshd_factory(BOX)
    yield container
    (Path(container.home) / ".ssh" / "environment").unlink(missing_ok=True)


def stall(box: Any, spec: str) -> None:
    (Path(box.home) / ".ssh" / "environment").write_text(f"{STALL_ENV}={spec}\n")


def pythons(box: Any) -> set[int]:
    """Host pids of the live python processes in the container's pid namespace."""
    ns = os.stat(f"/proc/{box.ns_pid}/ns/pid").st_ino
    found: set[int] = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry.name}/ns/pid").st_ino != ns:
                continue
            head, _, tail = Path(f"/proc/{entry.name}/stat").read_text().rpartition(")")
        except OSError:  # ended meanwhile
            continue
        if tail.split()[0] not in ("Z", "X") and head.partition("(")[2].startswith("python"):
            found.add(int(entry.name))
    return found


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out ({timeout:g} s) waiting until {what}")
        time.sleep(0.02)


def new_helper(box: Any, baseline: set[int]) -> int:
    """The pid of the helper that started since ``baseline``, once it sent its hello (its
    watchdog thread runs from then on)."""
    found: list[int] = []

    def threads(pid: int) -> int:
        try:
            return len(os.listdir(f"/proc/{pid}/task"))
        except OSError:  # ended meanwhile
            return 0

    def serving() -> bool:
        found[:] = [pid for pid in sorted(pythons(box) - baseline) if threads(pid) >= 2]
        return bool(found)

    wait_until(serving, "the remote helper serves")
    return found[0]


def cli(box: Any, tmp_path: Path, *extra: str, env: dict[str, str] | None = None,
        ) -> subprocess.Popen[str]:
    home = tmp_path / "userhome"
    home.mkdir(exist_ok=True)
    base = {k: v for k, v in os.environ.items() if k not in ("SSH_AUTH_SOCK", CRASH_ENV)}
    argv = [sys.executable, "-m", "filesync.cli", "pull", str(tmp_path / "local"),
            f"{box.alias}:tree", "--state-dir", str(tmp_path / "state"),
            "-F", str(box.ssh_config), *extra]
    return subprocess.Popen(argv, env={**base, "HOME": str(home), **(env or {})},
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_a_silent_helper_stops_the_run_with_one_line_and_is_killed(
    box: Any, tmp_path: Path
) -> None:
    write(Path(box.home) / "tree" / "a.txt", "a\n")
    stall(box, "list:3600")
    baseline = pythons(box)
    proc = cli(box, tmp_path, "--idle-timeout", "2")
    helper = new_helper(box, baseline)
    os.kill(helper, signal.SIGSTOP)  # silent from now on: no reply, no keepalive
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("filesync: error: the remote sent nothing for 2 s"), err
    assert "--idle-timeout" in lines[0]
    wait_until(lambda: helper not in pythons(box), "the silent helper is gone")
    assert not (tmp_path / "local" / "a.txt").exists()


def test_keepalives_carry_slow_honest_work_past_the_deadline(
    box: Any, tmp_path: Path
) -> None:
    write(Path(box.home) / "tree" / "a.txt", "a\n")
    # The walk takes three deadlines; only the keepalives keep the client waiting.
    stall(box, "list:6")
    proc = cli(box, tmp_path, "--idle-timeout", "2")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert (tmp_path / "local" / "a.txt").read_text() == "a\n"


def test_a_killed_client_leaves_no_stuck_helper(box: Any, tmp_path: Path) -> None:
    write(Path(box.home) / "tree" / "a.txt", "a\n")
    stall(box, "list:3600")  # the helper is deep in a long operation when its client dies
    baseline = pythons(box)
    proc = cli(box, tmp_path)
    helper = new_helper(box, baseline)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    wait_until(lambda: helper not in pythons(box), "the orphaned helper exited",
               ORPHAN_DEADLINE)


def test_a_killed_client_leaves_no_healthy_helper(box: Any, tmp_path: Path) -> None:
    for n in range(3):
        write(Path(box.home) / "tree" / f"{n}.txt", f"{n}\n")
    baseline = pythons(box)
    # The client SIGKILLs itself mid-fetch, with the helper between two requests' frames.
    proc = cli(box, tmp_path, env={CRASH_ENV: "staged:1"})
    proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL
    wait_until(lambda: not pythons(box) - baseline, "the helper exited", ORPHAN_DEADLINE)
