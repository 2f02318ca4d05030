"""The command transport (``--via CMD``) into the sshd container, without ssh.

``--via "nsenter -t PID -m -u -n -p"`` reaches the container's shell the way
``docker exec -i NAME`` reaches a container's: filesync runs ``CMD sh -c ...`` and
speaks the same helper protocol over its stdin/stdout. The same rules apply as over
SSH, and the reported sync-back bug is checked through it too.
"""

from __future__ import annotations

import os
import re
import shlex
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sshd import SshdContainer
from synctree import Pair, junk_tree, skills_tree, snapshot, write

pytestmark = pytest.mark.sshd

Factory = Callable[[int], SshdContainer]
BOX = 14  # sshd_factory index used by this module


class ViaPair(Pair):
    """A Pair whose remote is an absolute path inside the container, reached by nsenter."""

    def __init__(self, local: Path, box: SshdContainer, rel: str, state: Path) -> None:
        super().__init__(local, box.home / rel, state)
        self.via = shlex.join(box.nsenter_argv())
        self.spec = f"/root/{rel}"

    def run(self, command: str, *extra: str, remote: str | None = None) -> tuple[int, Any]:
        return super().run(command, "--via", self.via, *extra, remote=remote or self.spec)


def make_pair(tmp_path: Path, box: SshdContainer) -> ViaPair:
    local = tmp_path / "host" / "skills"
    skills_tree(local)
    return ViaPair(local, box, f"via-{uuid.uuid4().hex[:8]}/skills", tmp_path / "state")


@pytest.fixture
def pair(sshd: SshdContainer, tmp_path: Path) -> ViaPair:
    return make_pair(tmp_path, sshd)


def test_push_and_pull_apply_the_same_rules(pair: ViaPair) -> None:
    write(pair.local / "pdf" / "node_modules" / "x.js", "junk")
    write(pair.local / "notes.log", "log\n")
    report = pair.ok("push", "--exclude", "*.log")
    expected = {p: b for p, b in snapshot(pair.local).items()
                if not p.startswith(".hub/") and "node_modules" not in p and p != "notes.log"}
    assert snapshot(pair.remote) == expected and report["uploaded"] == len(expected)
    script = pair.remote / "pdf" / "scripts" / "extract.py"
    assert script.stat().st_mode & 0o777 == 0o755
    src = pair.local / "web" / "SKILL.md"
    assert (pair.remote / "web" / "SKILL.md").stat().st_mtime_ns == src.stat().st_mtime_ns
    assert pair.ok("push", "--exclude", "*.log")["uploaded"] == 0
    write(pair.remote / "web" / "SKILL.md", "remote edit\n")
    write(pair.remote / "remote.log", "stays remote\n")
    (pair.remote / "pdf" / "templates" / "t.txt").unlink()
    report = pair.ok("pull", "--exclude", "*.log")
    assert (report["downloaded"], report["deleted_local"]) == (1, 1)
    assert (pair.local / "web" / "SKILL.md").read_text() == "remote edit\n"
    assert not (pair.local / "remote.log").exists()
    assert not (pair.local / "pdf" / "templates" / "t.txt").exists()


def test_sync_conflict_is_kept_for_resolve(pair: ViaPair) -> None:
    pair.ok("push")
    write(pair.local / "web" / "SKILL.md", "host edit\n")
    write(pair.remote / "web" / "SKILL.md", "remote edit\n")
    report = pair.ok("sync")
    [conflict] = report["conflicts"]
    assert Path(conflict["saved_to"]).read_text() == "remote edit\n"
    assert pair.ok("status")["open_conflicts"] == ["web/SKILL.md"]
    pair.ok("resolve", "web/SKILL.md", "--keep", "local")
    assert (pair.remote / "web" / "SKILL.md").read_text() == "host edit\n"


def test_reported_bug_through_the_command_transport(pair: ViaPair) -> None:
    pair.ok("push")
    host_lock = (pair.local / ".hub" / "lock.json").read_bytes()
    junk = junk_tree(pair.remote, curator_mb=24)
    write(pair.remote / "pdf" / "SKILL.md", "# pdf\nedited remotely\n")
    write(pair.remote / "newskill" / "SKILL.md", "# new\n")
    write(pair.remote / "newskill" / "scripts" / "run.sh", "echo hi\n", 0o755)
    before = snapshot(pair.local)
    report = pair.ok("pull")
    after = snapshot(pair.local)
    assert {p for p in after if before.get(p) != after[p]} == {
        "pdf/SKILL.md", "newskill/SKILL.md", "newskill/scripts/run.sh"}
    assert (pair.local / ".hub" / "lock.json").read_bytes() == host_lock
    assert not (pair.local / ".curator_backups").exists()
    assert not (pair.local / "pdf" / "node_modules").exists()
    # Everything read from the pipe, listing included, is far below the excluded bytes.
    assert report["bytes_received"] < (1 << 20) < junk


def test_without_python3_the_fallback_works_through_it(
    sshd_factory: Factory, tmp_path: Path
) -> None:
    box = sshd_factory(BOX)
    for directory in ("/usr/local/bin", "/usr/bin"):
        for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
            if re.fullmatch(r"python3(\.\d+)?", name):
                box.whiteout(f"{directory}/{name}")
    pair = make_pair(tmp_path, box)
    assert pair.ok("push", "-v")["uploaded"] == 8
    assert "using the POSIX fallback" in pair.stderr
    junk = junk_tree(pair.remote, curator_mb=4)
    write(pair.remote / "newskill" / "SKILL.md", "# new\n")
    report = pair.ok("pull")
    assert report["downloaded"] == 1 and report["bytes_received"] < (1 << 20) < junk
    assert not (pair.local / ".curator_backups").exists()


def test_failures_are_one_line(pair: ViaPair) -> None:
    write(pair.remote, "a file\n")
    code, report = pair.run("push")
    assert code == 1 and "is not a directory" in report["error"]
    assert pair.stderr.count("\n") == 1
    code, report = Pair.run(pair, "push", "--via", "no-such-command-xyz -i box",
                            remote=pair.spec)
    assert code == 1 and "cannot start 'no-such-command-xyz'" in report["error"]
    assert pair.stderr.count("\n") == 1 and "Traceback" not in pair.stderr
