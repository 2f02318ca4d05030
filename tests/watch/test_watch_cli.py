"""``filesync watch`` as a user runs it (a subprocess) against the real OpenSSH sshd:
JSON Lines, SIGTERM's last pass and exit 0, a vanished root's exit 3, ``--config``,
bad input."""

from __future__ import annotations

import json
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import pytest
from synctree import write

pytestmark = pytest.mark.sshd

DEADLINE = 90.0


class Watcher:
    """A running ``filesync watch``, its stdout lines read as they come."""

    def __init__(self, *argv: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "filesync", "watch", *argv],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        assert self.proc.stdout is not None
        self.reader = threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True)
        self.reader.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self.lines.put(line)

    def wait_lines(self, count: int) -> list[str]:
        end = time.monotonic() + DEADLINE
        while len(self.seen) < count:
            left = end - time.monotonic()
            if left <= 0 or (self.proc.poll() is not None and self.lines.empty()):
                raise AssertionError(f"got {self.seen!r}, waited for {count} lines; "
                                     f"stderr: {self._stderr()}")
            try:
                self.seen.append(self.lines.get(timeout=min(left, 1.0)))
            except queue.Empty:
                continue
        return self.seen

    def finish(self) -> tuple[int, list[str], str]:
        code = self.proc.wait(DEADLINE)
        self.reader.join(DEADLINE)  # it ends at the end of stdout
        while not self.lines.empty():
            self.seen.append(self.lines.get())
        return code, self.seen, self._stderr()

    def _stderr(self) -> str:
        if self.proc.poll() is None or self.proc.stderr is None:
            return "(running)"
        return self.proc.stderr.read()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def until(what: Callable[[], bool], why: str) -> None:
    end = time.monotonic() + DEADLINE
    while not what():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting until {why}")
        time.sleep(0.02)


def _args(sshd: Any, tmp_path: Path) -> list[str]:
    return ["-F", str(sshd.ssh_config), "--state-dir", str(tmp_path / "state")]


def test_sigterm_runs_a_last_pass_and_exits_0(sshd: Any, tmp_path: Path) -> None:
    name = f"watch-cli-{uuid.uuid4().hex[:8]}"
    local, remote = tmp_path / "local", sshd.home / name
    write(local / "a.md", "a")
    w = Watcher(str(local), f"{sshd.alias}:{name}", "--json", *_args(sshd, tmp_path))
    try:
        # The first pass, then the one that catches what changed while the watch was
        # placed; then nothing changes, so no other pass runs before the signal.
        first = w.wait_lines(2)
        assert json.loads(first[0])["uploaded"] == 1
        assert (remote / "a.md").read_text() == "a"
        w.proc.send_signal(signal.SIGTERM)
        code, lines, err = w.finish()
    finally:
        w.kill()
    assert code == 0, err
    assert len(lines) == 3, lines  # the last pass ran after the signal and reported
    docs = [json.loads(line) for line in lines]
    assert all(d["schema"] == 1 and d["pairs"][0]["remote"] == name for d in docs)
    shutil.rmtree(remote)


def test_edits_arrive_and_v_prints_a_line_per_pass(sshd: Any, tmp_path: Path) -> None:
    name = f"watch-cli-{uuid.uuid4().hex[:8]}"
    local, remote = tmp_path / "local", sshd.home / name
    write(local / "a.md", "a")
    w = Watcher(str(local), f"{sshd.alias}:{name}", "-v", *_args(sshd, tmp_path))
    try:
        until(lambda: (remote / "a.md").exists(), "the first pass ran")
        write(remote / "r.md", "r")
        until(lambda: (local / "r.md").exists() and (local / "r.md").read_text() == "r",
              "the remote file arrived")
        w.proc.send_signal(signal.SIGINT)
        code, lines, err = w.finish()
    finally:
        w.kill()
    assert code == 0, err
    summaries = [line for line in lines if line.startswith("watch: ")]
    assert len(summaries) >= 3  # first, the remote file's, the last
    assert "<f r.md\n" in lines
    shutil.rmtree(remote)


def test_a_vanished_root_stops_the_watch_with_exit_3(sshd: Any, tmp_path: Path) -> None:
    name = f"watch-cli-{uuid.uuid4().hex[:8]}"
    local, remote = tmp_path / "local", sshd.home / name
    write(local / "a.md", "a")
    w = Watcher(str(local), f"{sshd.alias}:{name}", *_args(sshd, tmp_path))
    try:
        until(lambda: (remote / "a.md").exists(), "the first pass ran")
        shutil.rmtree(remote)
        code, _lines, err = w.finish()
    finally:
        w.kill()
    assert code == 3, err
    errors = [line for line in err.splitlines() if line.startswith("filesync: error:")]
    assert len(errors) == 1 and "Traceback" not in err
    assert (local / "a.md").read_text() == "a"


def test_config_watches_every_mapping(sshd: Any, tmp_path: Path) -> None:
    base = f"watch-cfg-{uuid.uuid4().hex[:8]}"
    write(tmp_path / "one" / "a.md", "a")
    write(tmp_path / "two" / "b.md", "b")
    config = write(tmp_path / "filesync.toml", (
        f'remotes = ["{sshd.alias}:{base}"]\n'
        '[[mapping]]\nlocal = "one"\nremote = "one"\n'
        '[[mapping]]\nlocal = "two"\nremote = "two"\nexclude = ["*.tmp"]\n'))
    w = Watcher("--config", str(config), *_args(sshd, tmp_path))
    remote = sshd.home / base
    try:
        until(lambda: (remote / "two" / "b.md").exists(), "the first pass ran")
        write(remote / "one" / "r.md", "r")
        write(tmp_path / "two" / "c.md", "c")
        write(tmp_path / "two" / "x.tmp", "x")
        until(lambda: (tmp_path / "one" / "r.md").exists(), "the remote edit came back")
        until(lambda: (remote / "two" / "c.md").exists(), "the host edit crossed")
        w.proc.send_signal(signal.SIGTERM)
        code, _lines, err = w.finish()
    finally:
        w.kill()
    assert code == 0, err
    assert not (remote / "two" / "x.tmp").exists()
    shutil.rmtree(remote)


@pytest.mark.parametrize("argv, needle", [
    (["-n"], "watch changes files"),
    (["--persist", "10"], "--persist"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, argv: list[str], needle: str) -> None:
    (tmp_path / "l").mkdir()
    done = subprocess.run([sys.executable, "-m", "filesync", "watch", str(tmp_path / "l"),
                           str(tmp_path / "r"), *argv], capture_output=True, text=True,
                          timeout=DEADLINE)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and needle in done.stderr, done.stderr
