"""The bench's ``watch`` step: ``filesync watch`` (the real CLI, over the real sshd) with
``unison -repeat 1`` beside it as the peer.

- latency from a write on one side to the file's new bytes on the other, both
  directions, p50 and p95 over ``edits`` edits (one file edited in place, each edit
  waited for before the next);
- a burst of 1,000 new files on the host: the passes it took (JSON Lines counted from
  the burst until 2 s after the last file arrived, echo passes included), every file's
  bytes checked on the remote;
- CPU (client process tree; the remote's sshd session with the helper) and client RSS
  while idle for ``idle`` seconds, on the 3k-file main tree and on the 100k-file tree.

unison runs the latency and idle measures on the 3k-file tree only: its first sync of
100k files alone takes minutes, and ``-repeat 1`` rescans the whole tree every second.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import statistics
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trees
from trees import EXCLUDED_DIRS

#: How long one change may take to arrive before the measure is given up (seconds).
ARRIVAL_DEADLINE = 60.0


class Running:
    """A background command, its stdout lines timestamped as they come."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.argv = argv
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.lines: list[tuple[float, str]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append((time.perf_counter(), line))

    def wait_lines(self, n: int, deadline: float = 600.0) -> None:
        end = time.monotonic() + deadline
        while len(self.lines) < n:
            if self.proc.poll() is not None or time.monotonic() > end:
                err = self.proc.stderr.read() if self.proc.stderr else ""
                raise RuntimeError(f"{self.argv[:2]} gave {len(self.lines)} lines, "
                                   f"waited for {n}: {err[-500:]}")
            time.sleep(0.01)

    def stop(self, sig: int = 15) -> int:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)
        try:
            return self.proc.wait(300)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, 9)
            return self.proc.wait()


def _arrive(path: Path, data: bytes, t0: float | None = None) -> float:
    """Seconds from ``t0`` (now) until ``path`` holds ``data`` (polled every millisecond)."""
    t0 = time.perf_counter() if t0 is None else t0
    end = t0 + ARRIVAL_DEADLINE
    while True:
        with contextlib.suppress(OSError):
            if path.read_bytes() == data:
                return time.perf_counter() - t0
        if time.perf_counter() > end:
            raise RuntimeError(f"{path} did not get the new bytes in {ARRIVAL_DEADLINE:g} s")
        time.sleep(0.001)


def latencies(src: Path, dst: Path, rel: str, edits: int, tag: str) -> list[float]:
    rng = random.Random(tag)
    out = []
    for i in range(edits):
        data = f"{tag} edit {i} {rng.random()}\n".encode() * 40
        target = src / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        target.write_bytes(data)  # in place, as an editor or an agent writes
        out.append(_arrive(dst / rel, data, t0))
        time.sleep(0.05)
    return out


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    return statistics.quantiles(ordered, n=100, method="inclusive")[int(q) - 1]


def summary(values: list[float]) -> dict[str, float]:
    return {"p50": round(pct(values, 50), 4), "p95": round(pct(values, 95), 4),
            "max": round(max(values), 4), "n": len(values)}


def rss_mib(pid: int) -> dict[str, float]:
    out = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = round(int(line.split()[1]) / 1024, 1)
    return out


def idle(seconds: float, client: int, remote: Callable[[], list[int]],
         tree_cpu: Callable[[list[int]], float]) -> dict[str, Any]:
    time.sleep(2.0)  # the last pass and its echo settle
    c0, r0, t0 = tree_cpu([client]), tree_cpu(remote()), time.perf_counter()
    time.sleep(seconds)
    c1, r1, t1 = tree_cpu([client]), tree_cpu(remote()), time.perf_counter()
    wall = t1 - t0
    return {"seconds": round(wall, 1), "client_cpu_pct": round(100 * (c1 - c0) / wall, 3),
            "remote_cpu_pct": round(100 * (r1 - r0) / wall, 3), **rss_mib(client)}


def _watch(bench: Any, box: Any, local: Path, remote_dir: str) -> Running:
    """``filesync watch LOCAL BOX:REMOTE_DIR --json`` with a fresh state, running."""
    return Running([*bench.fs, "watch", str(local), f"{box.alias}:{remote_dir}", "-F",
                    str(box.ssh_config), "--state-dir", str(bench.fresh_state()), "--json"],
                   bench.env)


def run(bench: Any, tree_cpu: Callable[[list[int]], float]) -> dict[str, Any]:
    """The step; returns what goes into ``results["steps"]["watch"]``."""
    cfg, box = bench.cfg, bench.box
    edits = 5 if cfg.smoke else 50
    idle_s = 5.0 if cfg.smoke else 60.0
    big_n = cfg.scale_sizes[1]
    burst_n = 100 if cfg.smoke else 1000
    bench.stop_agent()  # its kept sessions would count as the remote's idle CPU
    out: dict[str, Any] = {"edits": edits, "idle_seconds": idle_s, "burst_files": burst_n}

    local = bench.host / "watch-main"
    shutil.rmtree(local, ignore_errors=True)
    shutil.copytree(bench.main, local, symlinks=True)
    fs_dir = "watch-fs"
    bench.clear_remote(fs_dir)
    fs = _watch(bench, box, local, fs_dir)
    try:
        fs.wait_lines(1)
        remote = bench.remote(fs_dir)
        out["filesync"] = {
            "host_to_remote": summary(latencies(local, remote, "watch/edit.md", edits, "h")),
            "remote_to_host": summary(latencies(remote, local, "watch/redit.md", edits, "r")),
        }
        # A burst: 1,000 new files written as fast as Python writes them.
        time.sleep(2.0)
        before = len(fs.lines)
        t0 = time.perf_counter()
        datas = {f"burst/d{i // 100}/f{i}.txt": f"burst {i}\n".encode() * (1 + i % 50)
                 for i in range(burst_n)}
        for rel, data in datas.items():
            (local / rel).parent.mkdir(parents=True, exist_ok=True)
            (local / rel).write_bytes(data)
        written = time.perf_counter() - t0
        for rel, data in datas.items():
            _arrive(remote / rel, data)
        all_in = time.perf_counter() - t0
        time.sleep(2.0)
        bad = [rel for rel, data in datas.items() if (remote / rel).read_bytes() != data]
        out["filesync"]["burst"] = {"passes": len(fs.lines) - before,
                                    "write_seconds": round(written, 3),
                                    "all_across_seconds": round(all_in, 3), "wrong": len(bad)}
        bench.check("watch: every burst file arrived whole", not bad, ", ".join(bad[:5]))
        n0 = len(fs.lines)
        out["filesync"]["idle_3k"] = idle(idle_s, fs.proc.pid, box.session_pids, tree_cpu)
        out["filesync"]["idle_3k"]["passes"] = len(fs.lines) - n0
    finally:
        code = fs.stop()
    bench.check("watch: SIGTERM ends filesync watch with 0", code == 0, f"exit {code}")
    bench.verify("watch: remote == local after the watch", local, bench.remote(fs_dir))
    bench.clear_remote(fs_dir)

    big = bench.host / "watch-big"
    shutil.rmtree(big, ignore_errors=True)
    trees.make_small_tree(big, big_n)
    big_dir = "watch-big"
    bench.clear_remote(big_dir)
    fs = _watch(bench, box, big, big_dir)
    try:
        fs.wait_lines(2, deadline=1800.0)  # the initial push, then the catch-up pass
        n0 = len(fs.lines)
        report = idle(idle_s, fs.proc.pid, box.session_pids, tree_cpu)
        report["passes"] = len(fs.lines) - n0
        report["files"] = big_n
        # edits in an existing directory on each side: the big tree is watched, not idle
        n = max(3, edits // 5)
        report["host_to_remote"] = summary(latencies(
            big, bench.remote(big_dir), "d000/d00000/edit.txt", n, "hb"))
        report["remote_to_host"] = summary(latencies(
            bench.remote(big_dir), big, "d000/d00001/redit.txt", n, "rb"))
        out["filesync"]["idle_big"] = report
    finally:
        code = fs.stop()
    bench.check("watch: SIGTERM ends the 100k watch with 0", code == 0, f"exit {code}")
    shutil.rmtree(big, ignore_errors=True)
    bench.clear_remote(big_dir)

    out["unison"] = _unison(bench, local, edits, idle_s, tree_cpu)
    shutil.rmtree(local, ignore_errors=True)
    return out


def _unison(bench: Any, local: Path, edits: int, idle_s: float,
            tree_cpu: Callable[[list[int]], float]) -> dict[str, Any]:
    box = bench.box
    if shutil.which("unison") is None or box.run_inside("unison -version").returncode != 0:
        return {"error": "unison is not installed on both sides"}
    un_dir = "watch-unison"
    bench.clear_remote(un_dir)
    shutil.rmtree(Path(bench.env["HOME"]) / ".unison", ignore_errors=True)
    base = ["unison", str(local), f"ssh://{box.alias}//root/{un_dir}", "-batch", "-auto",
            "-silent", "-confirmbigdel=false", "-perms", "0", "-sshargs",
            f"-F {box.ssh_config}"]
    for name in EXCLUDED_DIRS:
        base += ["-ignore", f"Name {name}"]
    first = subprocess.run(base, env=bench.env, capture_output=True, text=True, check=False,
                           timeout=1800)
    if first.returncode not in (0, 1):
        return {"error": f"unison's first sync exited {first.returncode}: "
                         f"{(first.stderr or first.stdout)[-300:]}"}
    un = Running([*base, "-repeat", "1"], bench.env)
    try:
        remote = bench.remote(un_dir)
        out: dict[str, Any] = {
            "host_to_remote": summary(latencies(local, remote, "watch/uedit.md", edits, "uh")),
            "remote_to_host": summary(latencies(remote, local, "watch/uredit.md", edits, "ur")),
        }
        out["idle_3k"] = idle(idle_s, un.proc.pid, box.session_pids, tree_cpu)
    finally:
        un.stop()
    bench.clear_remote(un_dir)
    return out
