#!/usr/bin/env python3
"""filesync benchmarks against rsync, tar and the old sync-back: one command.

    sudo python3 bench/run.py            # full run (~10 min on 2 cores), writes
                                         # bench/results/run-*.json and docs/benchmarks.md
    python3 bench/run.py --smoke         # tiny trees, 1 repetition, a few steps (CI)
    python3 bench/run.py --steps pull,warm --reps 3

Needs root (it mounts a tmpfs and starts namespaced OpenSSH sshd "containers" through
``tests/sshd.py``), ``rsync``, ``ssh`` and ``tar``.  Both the host trees and the remote
homes live on one tmpfs mounted for the run (``--no-tmpfs`` to skip that), so disks do not
decide anything.  Every comparison alternates its tools run by run (A B C, B C A, ...)
and reports medians and ratios from that one run.  CLI figures are the whole-process wall
time of the command (interpreter start included), measured with ``wait4`` together with the
process's CPU time and peak RSS; wire bytes are the host-side veth counters.

See ``docs/benchmarks.md`` for what each step does and the latest figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(BENCH))

import peers  # noqa: E402
import sshd  # noqa: E402  (tests/sshd.py)
import trees  # noqa: E402
from trees import EXCLUDED_DIRS, MiB  # noqa: E402

ALL_STEPS = ("initial", "noop", "edit", "pull", "warm", "scale", "bigfile", "fanout", "watch",
             "unison", "disk")
SMOKE_STEPS = ("initial", "noop", "edit", "pull", "warm", "fanout", "watch", "unison", "disk")
#: Where the disk step puts every tree: a real file system, never a tmpfs (``--disk-dir``).
DISK_DIR = Path("/var/tmp/filesync-bench-disk")
CIPHER = "aes128-gcm@openssh.com"
RUN_TIMEOUT = 900.0
AGENT = "filesync --persist"  # the same CLI through the opt-in persistent agent
ASYNC = "filesync --ssh-client asyncssh"  # the plain CLI over the asyncssh client
# Floors, timed beside the tools: what no tool over the same ssh can go below.
LOGIN = "ssh HOST true"  # ssh's login and one session, with the default key exchange
STARTS = "CPython, ssh, CPython"  # bench/floor.py start: that, between two interpreter starts
FLOOR = "python floor"  # bench/floor.py push, pull, sync: the least a CPython pair does
SSH_CAT = "ssh cat"  # the fan-out's bytes through one plain ssh per host
GNU_TIME = "/usr/bin/time"  # Debian package "time"; without it peak RSS is not reported


class BenchError(RuntimeError):
    pass


# ---------------------------------------------------------------------------------------------
# configuration
# ---------------------------------------------------------------------------------------------


@dataclass
class Config:
    smoke: bool = False
    steps: tuple[str, ...] = ALL_STEPS
    reps: dict[str, int] = field(default_factory=dict)
    settle: float = 2.1
    edits: int = 10
    scale_sizes: tuple[int, int] = (10_000, 100_000)
    big_size: int = 1 << 30
    fan_hosts: int = 8
    spec: trees.TreeSpec = field(default_factory=trees.TreeSpec)
    junk_mib: int = 24
    wait_idle: float = 120.0
    disk: Path = DISK_DIR

    @classmethod
    def full(cls) -> Config:
        # The pull and the unison no-op and edit rounds take 9: their ratios sit within
        # ~0.1x of their limits and floors, and a median of 5 took one run's slow reps
        # whole (run-20261203-0535.json: filesync's pull 290-373 ms).
        return cls(reps={"initial": 5, "noop": 7, "edit": 5, "pull": 9, "warm_noop": 11,
                         "warm_pull": 5, "scale_10k_initial": 3, "scale_10k_noop": 5,
                         "scale_100k_initial": 2, "scale_100k_noop": 3, "bigfile": 5,
                         "fanout": 3, "fanout_noop": 3, "unison_first": 7, "unison_noop": 9,
                         "unison_edit": 9, "disk_initial": 5, "disk_noop": 7, "disk_pull": 5,
                         "disk_unison_first": 3, "disk_unison_noop": 5, "disk_unison_edit": 3,
                         "disk_100k_initial": 3, "disk_100k_noop": 3})

    @classmethod
    def smoke_cfg(cls) -> Config:
        return cls(smoke=True, steps=SMOKE_STEPS, reps={}, settle=2.1, edits=3,
                   scale_sizes=(200, 2000), big_size=8 * MiB, fan_hosts=2,
                   spec=trees.TreeSpec.smoke(), junk_mib=1, wait_idle=0.0)

    def n(self, key: str) -> int:
        return 1 if self.smoke else self.reps.get(key, 3)


# ---------------------------------------------------------------------------------------------
# measuring one command
# ---------------------------------------------------------------------------------------------


@dataclass
class Sample:
    wall: float
    cpu: float = 0.0  # user + sys of the process (and its waited-for children)
    maxrss_mib: float = 0.0
    wire: int = 0
    rc: int = 0
    out: str = ""
    remote_cpu: float | None = None  # sshd + everything it ran, summed over the boxes

    def as_dict(self) -> dict[str, Any]:
        return {"wall": round(self.wall, 4), "cpu": round(self.cpu, 4),
                "remote_cpu": None if self.remote_cpu is None else round(self.remote_cpu, 3),
                "maxrss_mib": round(self.maxrss_mib, 1), "wire": self.wire, "rc": self.rc}


_CLK_TCK = os.sysconf("SC_CLK_TCK")


def reaped_cpu(box: sshd.SshdContainer) -> float:
    """CPU seconds of the per-connection processes the box's sshd has reaped so far.

    The listening sshd waits for each connection's sshd, which waits for the commands it ran,
    so its cutime + cstime grows by the whole remote side of a finished connection.
    """
    fields = Path(f"/proc/{box.ns_pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[13]) + int(fields[14])) / _CLK_TCK


#: Connections that stay open on purpose (the persistent agent's): not waited for.
KEPT_SESSIONS: set[int] = set()


def wait_sessions_gone(boxes: Sequence[sshd.SshdContainer], timeout: float = 2.0) -> bool:
    deadline = time.monotonic() + timeout
    while any(set(b.session_pids()) - KEPT_SESSIONS for b in boxes):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def tree_cpu(pids: Iterable[int]) -> float:
    """CPU seconds of live processes and everything below them (own + reaped children)."""
    table = sshd._process_table()
    every: set[int] = set()
    for pid in pids:
        if pid in table:
            every |= {pid} | sshd._descendants(pid, table)
    total = 0
    for pid in every:
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
            total += sum(int(f) for f in fields[11:15])
    return total / _CLK_TCK


PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux). filesync's ssh
    master daemonizes (``ssh -f``); as an orphan it is reparented here, so its CPU (the
    key exchange and every byte's encryption) is reaped by ``reap_orphans`` and counted as
    the client CPU of the run that started it, as rsync's ssh child is counted for rsync."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    return False


def reap_orphans(keep: Iterable[int] = ()) -> float:
    """Reap the ended orphans reparented here; their CPU seconds (user + sys, with their
    own reaped children). ``keep``: children the bench started and waits for itself (the
    sshd containers); the loop stops at the first of them."""
    kept = set(keep)
    total = 0.0
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            break
        if info is None or info.si_pid in kept:
            break
        _pid, _status, ru = os.wait4(info.si_pid, 0)
        total += ru.ru_utime + ru.ru_stime
    return total


def wire_of(boxes: Iterable[sshd.SshdContainer]) -> int:
    return sum(b.wire_bytes() for b in boxes)


def run_cmd(argv: Sequence[str] | str, env: dict[str, str], boxes: Sequence[sshd.SshdContainer],
            *, stdin: Path | None = None, check: bool = True, remote_cpu: bool = True,
            keep: Iterable[int] = ()) -> Sample:
    """Run one command (a string is a shell command line) and measure it.

    Wall time around fork..wait4; the process's CPU time (with its waited-for children) from
    wait4; its peak RSS from GNU time; the veth counters of ``boxes``; and, with
    ``remote_cpu``, the CPU the boxes' sshd reaped for the connection (see ``reaped_cpu``).
    """
    full: list[str] = ["/bin/sh", "-c", argv] if isinstance(argv, str) else list(argv)
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="run-")))
        out = stack.enter_context((tmp / "out").open("w+b"))
        err = stack.enter_context((tmp / "err").open("w+b"))
        fin = stack.enter_context(stdin.open("rb")) if stdin else subprocess.DEVNULL
        rss_file = tmp / "rss"
        if os.access(GNU_TIME, os.X_OK):
            # GNU time forks the command from a ~1 MiB process: wait4 on our own child would
            # report at least the bench's RSS (the kernel keeps the pre-exec high-water mark).
            full = [GNU_TIME, "-f", "%M", "-o", str(rss_file), "--", *full]
        if remote_cpu:
            wait_sessions_gone(boxes)
            rc0 = sum(reaped_cpu(b) for b in boxes)
        w0 = wire_of(boxes)
        reap_orphans(keep)  # what ended before this run (a stopped agent) is not its CPU
        t0 = time.perf_counter()
        proc = subprocess.Popen(full, env=env, stdin=fin, stdout=out, stderr=err,
                                start_new_session=True)
        timer = threading.Timer(RUN_TIMEOUT, lambda: _kill_group(proc.pid))
        timer.start()
        try:
            _, status, ru = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        # The command's orphans that ended with it: filesync's ssh master (ended by the
        # run before it exits, so it is at most a zombie now).
        orphan_cpu = reap_orphans(keep)
        wire = wire_of(boxes) - w0
        rcpu = None
        if remote_cpu and wait_sessions_gone(boxes):
            rcpu = sum(reaped_cpu(b) for b in boxes) - rc0
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode(errors="replace")
        stderr = err.read().decode(errors="replace")
        maxrss_kib = 0.0
        with contextlib.suppress(OSError, ValueError, IndexError):
            maxrss_kib = float(rss_file.read_text().split()[-1])
    sample = Sample(wall, ru.ru_utime + ru.ru_stime + orphan_cpu, maxrss_kib / 1024, wire,
                    proc.returncode, stdout, rcpu)
    if check and proc.returncode != 0:
        shown = argv if isinstance(argv, str) else shlex.join(argv)
        raise BenchError(f"{shown[:300]} exited {proc.returncode}: {stderr.strip()[-1500:]}")
    return sample


def _vm_hwm_mib(pid: int) -> float:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, 9)


def cpu_busy(interval: float = 1.0) -> float:
    """Fraction of the machine's CPU time that was busy over ``interval`` seconds."""
    def sample() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        return sum(fields), idle
    t0, i0 = sample()
    time.sleep(interval)
    t1, i1 = sample()
    return 1.0 - (i1 - i0) / max(1, t1 - t0)


def wait_idle(limit: float, threshold: float = 0.15) -> tuple[float, float]:
    """Wait (up to ``limit`` s) until other processes leave the CPU idle; (busy, waited)."""
    start = time.monotonic()
    busy = cpu_busy()
    while busy > threshold and time.monotonic() - start < limit:
        print(f"  (machine {busy:.0%} busy with other work; waiting)", flush=True)
        time.sleep(4)
        busy = cpu_busy()
    return busy, time.monotonic() - start


def median(values: Iterable[float]) -> float:
    vals = list(values)
    return statistics.median(vals) if vals else float("nan")


# ---------------------------------------------------------------------------------------------
# the bench
# ---------------------------------------------------------------------------------------------


class Bench:
    def __init__(self, cfg: Config, work: Path, keep: bool) -> None:
        self.cfg = cfg
        self.w = work
        self.keep = keep
        self.host = work / "host"
        self.boxes: list[sshd.SshdContainer] = []
        self.results: dict[str, Any] = {"steps": {}, "checks": [], "errors": {}}
        self.env = self._env()
        self.fs = self._filesync_cmd()
        self.state_n = 0
        self.box: sshd.SshdContainer  # the primary container, set in start()
        # the opt-in persistent agent (--persist): its own socket, in a 0700 dir
        self.agent_env = {**self.env, "FILESYNC_AGENT_SOCKET": str(work / "agent" / "a.sock")}
        self._agent_pid = 0

    # -- environment --------------------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        home = self.w / "userhome"
        home.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("SSH_", "FILESYNC_", "PYTHON"))}
        env["HOME"] = str(home)
        env["LC_ALL"] = "C.UTF-8"
        # temp files (the old sync-back's tar and staging dir) on the tmpfs like everything else
        tmp = self.w / "tmp"
        tmp.mkdir(exist_ok=True)
        env["TMPDIR"] = str(tmp)
        return env

    @staticmethod
    def _filesync_cmd() -> list[str]:
        script = Path(sys.executable).parent / "filesync"
        if script.exists():
            return [str(script)]
        return [sys.executable, "-m", "filesync.cli"]

    def fresh_state(self) -> Path:
        self.state_n += 1
        path = self.w / "state" / f"s{self.state_n:03d}"
        path.mkdir(parents=True)
        return path

    def check(self, name: str, ok: bool, detail: str = "") -> None:
        self.results["checks"].append({"name": name, "ok": bool(ok), "detail": detail[:2000]})
        mark = "ok " if ok else "FAIL"
        print(f"    check {mark} {name}" + (f": {detail[:300]}" if detail and not ok else ""),
              flush=True)

    def start_boxes(self, count: int) -> list[sshd.SshdContainer]:
        """Start containers on free indexes (tests may hold some) until ``count`` run."""
        index = 0
        while len(self.boxes) < count:
            if index > sshd.MAX_INDEX:
                raise BenchError(f"could not start {count} sshd containers (indexes in use)")
            if any(b.index == index for b in self.boxes):
                index += 1
                continue
            box = sshd.SshdContainer(self.w / "boxes" / f"box{index}", index)
            try:
                box.start()
            except RuntimeError as exc:
                if "in use" not in str(exc):
                    raise
                index += 1
                continue
            self.boxes.append(box)
            index += 1
        self.box = self.boxes[0]
        return self.boxes[:count]

    def stop_boxes(self) -> None:
        for box in self.boxes:
            with contextlib.suppress(Exception):
                box.stop()

    # -- commands -----------------------------------------------------------------------------

    def fsx_argv(self, cmd: str, local: Path, remote_dir: str, state: Path) -> list[str]:
        """The plain CLI over the asyncssh client, for the both-clients comparison."""
        return [*self.fs_argv(cmd, local, [f"{self.box.alias}:{remote_dir}"], state),
                "--ssh-client", "asyncssh"]

    def floor_argv(self, mode: str, *args: str) -> list[str]:
        """``bench/floor.py MODE`` against the primary container (see its module doc)."""
        return [sys.executable, "-S", str(BENCH / "floor.py"), mode, str(self.box.ssh_config),
                self.box.alias, *args]

    def fs_argv(self, cmd: str, local: Path, remotes: Sequence[str], state: Path,
                cfg: Path | None = None) -> list[str]:
        return [*self.fs, cmd, str(local), *remotes, "-F", str(cfg or self.box.ssh_config),
                "--state-dir", str(state), "--json"]

    # -- the persistent agent -----------------------------------------------------------------

    def agent_pid(self) -> int:
        if self._agent_pid and Path(f"/proc/{self._agent_pid}").exists():
            return self._agent_pid
        out = subprocess.run([*self.fs, "agent", "status", "--json"], env=self.agent_env,
                             capture_output=True, text=True, check=False).stdout
        self._agent_pid = int(json.loads(out).get("pid", 0)) if out.strip() else 0
        return self._agent_pid

    def agent_warmup(self, boxes: Sequence[sshd.SshdContainer], cfg: Path | None = None) -> None:
        """Start a fresh agent and open its connections to ``boxes`` (untimed).

        Fresh per step: what one step's trees left in the agent (a 100k-file tree's
        watches and caches) is not charged to the next step's memory figures.
        """
        self.stop_agent()
        KEPT_SESSIONS.clear()
        self._agent_pid = 0
        empty = self.w / "agent-warmup"
        empty.mkdir(exist_ok=True)
        self.fsa(self.fs_argv("push", empty, [f"{b.alias}:agent-warmup" for b in boxes],
                              self.w / "agent-warmup-state", cfg), boxes)
        for b in boxes:
            KEPT_SESSIONS.update(b.session_pids())

    def fsa(self, argv: list[str], boxes: Sequence[sshd.SshdContainer] | None = None) -> Sample:
        """A CLI run through the persistent agent (``--persist``).

        The client's wall time is the figure; the agent's CPU and peak RSS during the run, and
        the remote CPU of its kept connections, are counted in.
        """
        boxes = boxes or [self.box]
        pid = self.agent_pid()
        if pid:
            with contextlib.suppress(OSError):  # restart the agent's peak-RSS counter
                Path(f"/proc/{pid}/clear_refs").write_text("5")
        kept = [k for b in boxes for k in b.session_pids() if k in KEPT_SESSIONS]
        a0, r0 = (tree_cpu([pid]) if pid else 0.0), tree_cpu(kept)
        sample = run_cmd([*argv, "--persist", "1800"], self.agent_env, boxes, remote_cpu=False,
                         keep=self.own_children())
        pid = pid or self.agent_pid()
        if pid:
            sample.cpu += tree_cpu([pid]) - a0
            sample.maxrss_mib = max(sample.maxrss_mib, _vm_hwm_mib(pid))
        if kept:
            sample.remote_cpu = tree_cpu(kept) - r0
        return sample

    def stop_agent(self) -> None:
        """Stop the agent and wait for it to exit (its socket is on the tmpfs to unmount)."""
        pid = self.agent_pid()
        subprocess.run([*self.fs, "agent", "stop"], env=self.agent_env, capture_output=True,
                       check=False)
        deadline = time.monotonic() + 30
        while pid and Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.02)

    def ssh_e(self, box: sshd.SshdContainer | None = None, extra: Sequence[str] = ()) -> str:
        box = box or self.box
        return shlex.join(["ssh", "-F", str(box.ssh_config), *extra])

    def rsync_argv(self, src: str, dst: str, ssh_extra: Sequence[str] = (),
                   box: sshd.SshdContainer | None = None) -> list[str]:
        excludes = [f"--exclude={name}/" for name in EXCLUDED_DIRS]
        return ["rsync", "-a", *excludes, "-e", self.ssh_e(box, ssh_extra), src, dst]

    def tar_cmd(self, local: Path, remote_dir: str) -> str:
        excludes = " ".join(f"--exclude={shlex.quote(n)}" for n in EXCLUDED_DIRS)
        inner = f"mkdir -p {shlex.quote(remote_dir)} && tar -x -C {shlex.quote(remote_dir)}"
        return (f"tar -c -C {shlex.quote(str(local))} {excludes} . | "
                f"{self.ssh_e()} {self.box.alias} {shlex.quote(inner)}")

    def run(self, argv: Sequence[str] | str, *, boxes: Sequence[sshd.SshdContainer] | None = None,
            stdin: Path | None = None, remote_cpu: bool = True) -> Sample:
        return run_cmd(argv, self.env, boxes if boxes is not None else [self.box], stdin=stdin,
                       remote_cpu=remote_cpu, keep=self.own_children())

    def own_children(self) -> set[int]:
        """The children the bench waits for itself: the sshd containers' processes."""
        return {b._proc.pid for b in self.boxes if b._proc is not None}

    def remote(self, name: str, box: sshd.SshdContainer | None = None) -> Path:
        """Host path of ``~/name`` on the remote."""
        return (box or self.box).home / name

    def clear_remote(self, name: str, box: sshd.SshdContainer | None = None) -> None:
        shutil.rmtree(self.remote(name, box), ignore_errors=True)

    # -- A/B loop -----------------------------------------------------------------------------

    def ab(self, step: str, reps: int, tools: dict[str, Callable[[int], Sample]],
           setup: Callable[[int], None] | None = None, settle: float = 0.0,
           before: Callable[[int, str], None] | None = None,
           warmup: bool = False) -> dict[str, list[dict[str, Any]]]:
        """Run every tool ``reps`` times, rotating the order each repetition.

        ``setup(rep)`` runs (untimed) once per repetition, ``before(rep, tool)`` before each
        single run; ``warmup`` adds one unrecorded round first (rep -1).
        """
        runs: dict[str, list[dict[str, Any]]] = {t: [] for t in tools}
        names = list(tools)
        if warmup and not self.cfg.smoke:
            if setup is not None:
                setup(-1)
            for name in names:
                if before is not None:
                    before(-1, name)
                tools[name](-1)
        for r in range(reps):
            if setup is not None:
                setup(r)
            if settle:
                time.sleep(settle)
            order = names[r % len(names):] + names[: r % len(names)]
            for name in order:
                if before is not None:
                    before(r, name)
                sample = tools[name](r)
                runs[name].append(sample.as_dict())
                print(f"  {step:<18} rep {r + 1}/{reps} {name:<22} {sample.wall:8.3f} s "
                      f"cpu {sample.cpu:6.2f} s  remote cpu "
                      f"{'  -  ' if sample.remote_cpu is None else f'{sample.remote_cpu:5.2f}'} s "
                      f"rss {sample.maxrss_mib:6.1f} MiB  "
                      f"wire {sample.wire / MiB:8.2f} MiB", flush=True)
        return runs

    def record(self, key: str, title: str, runs: dict[str, list[dict[str, Any]]],
               base: str | None = None,
               **extra: Any) -> dict[str, Any]:
        walls = {t: median(s["wall"] for s in rs) for t, rs in runs.items()}
        med: dict[str, dict[str, float | None]] = {
            t: {"wall": walls[t], **{k: median(s[k] for s in rs)
                                     for k in ("cpu", "maxrss_mib", "wire")}}
            for t, rs in runs.items()}
        for t, rs in runs.items():
            rcpu = [s["remote_cpu"] for s in rs if s.get("remote_cpu") is not None]
            med[t]["remote_cpu"] = median(rcpu) if rcpu else None
            med[t]["min_wall"] = min(s["wall"] for s in rs)
        ratios = {f"{t}/{base}": walls[t] / walls[base] for t in runs
                  if base is not None and t != base}
        step = {"title": title, "reps": len(next(iter(runs.values()))), "runs": runs,
                "median": med, "ratios": ratios, **extra}
        self.results["steps"][key] = step
        return step

    # -- trees --------------------------------------------------------------------------------

    def build_main(self) -> None:
        t0 = time.perf_counter()
        self.main = self.host / "main"
        info = trees.make_main_tree(self.main, self.cfg.spec, seed=1)
        self.main_files = trees.kept_files(self.main)
        self.results["trees"] = {"main": info.as_dict()}
        print(f"main tree: {info.kept_files} files / {info.kept_bytes / MiB:.1f} MiB kept, "
              f"{info.excluded_files} files / {info.excluded_bytes / MiB:.1f} MiB excluded "
              f"({time.perf_counter() - t0:.1f} s)", flush=True)

    def verify(self, name: str, local: Path, remote: Path) -> None:
        problems = trees.compare_trees(local, remote)
        self.check(name, not problems, "; ".join(problems[:10]))

    # ------------------------------------------------------------------------------------------
    # steps
    # ------------------------------------------------------------------------------------------

    def step_initial(self) -> None:
        """1. Initial push of the main tree: filesync vs rsync -a vs tar | ssh tar -x."""
        self.fs_state = self.fsa_state = self.w / "none"
        # the agent's pair has a host tree of its own: a pull into the shared one would
        # leave the other pair nothing to do
        self.main_agent = self.host / "main-agent"
        subprocess.run(["cp", "-a", str(self.main), str(self.main_agent)], check=True)
        self.main_x = self.host / "main-asyncssh"
        subprocess.run(["cp", "-a", str(self.main), str(self.main_x)], check=True)
        self.agent_warmup([self.box])

        def setup(_r: int) -> None:
            for d in ("fs", "fsa", "fsx", "rs", "tar"):
                self.clear_remote(d)

        def fs(_r: int) -> Sample:
            self.fs_state = self.fresh_state()
            return self.run(self.fs_argv("push", self.main, [f"{self.box.alias}:fs"],
                                         self.fs_state))

        def fsa(_r: int) -> Sample:
            self.fsa_state = self.fresh_state()
            return self.fsa(self.fs_argv("push", self.main_agent, [f"{self.box.alias}:fsa"],
                                         self.fsa_state))

        def fsx(_r: int) -> Sample:
            self.fsx_state = self.fresh_state()
            return self.run(self.fsx_argv("push", self.main_x, "fsx", self.fsx_state))

        tools = {
            "filesync": fs,
            AGENT: fsa,
            ASYNC: fsx,
            "rsync": lambda r: self.run(self.rsync_argv(f"{self.main}/", f"{self.box.alias}:rs/")),
            "tar": lambda r: self.run(self.tar_cmd(self.main, "tar")),
        }
        runs = self.ab("initial push", self.cfg.n("initial"), tools, setup)
        self.record("initial", "Initial push (3k files + 20 MiB binaries)", runs, base="rsync")
        self.verify("initial push: remote == local (filesync)", self.main, self.remote("fs"))
        self.verify("initial push: remote == local (filesync --persist)", self.main_agent,
                    self.remote("fsa"))
        self.verify("initial push: remote == local (filesync, asyncssh)", self.main_x,
                    self.remote("fsx"))
        self.verify("initial push: remote == local (rsync)", self.main, self.remote("rs"))
        self.verify("initial push: remote == local (tar)", self.main, self.remote("tar"))
        junk = [p for p in ("node_modules", ".curator_backups")
                if any(n == p for _, dirs, _ in os.walk(self.remote("fs")) for n in dirs)]
        self.check("initial push: excluded dirs not sent (filesync)", not junk, str(junk))

    def step_noop(self) -> None:
        """2. No-op push vs rsync no-op."""
        outs: list[dict[str, Any]] = []

        def fs(_r: int) -> Sample:
            s = self.run(self.fs_argv("push", self.main, [f"{self.box.alias}:fs"], self.fs_state))
            outs.append(json.loads(s.out))
            return s

        def fsa(_r: int) -> Sample:
            s = self.fsa(self.fs_argv("push", self.main_agent, [f"{self.box.alias}:fsa"],
                                      self.fsa_state))
            outs.append(json.loads(s.out))
            return s

        def fsx(_r: int) -> Sample:
            s = self.run(self.fsx_argv("push", self.main_x, "fsx", self.fsx_state))
            outs.append(json.loads(s.out))
            return s

        tools = {
            "filesync": fs,
            AGENT: fsa,
            ASYNC: fsx,
            "rsync": lambda r: self.run(self.rsync_argv(f"{self.main}/", f"{self.box.alias}:rs/")),
            LOGIN: lambda r: self.run(["ssh", "-F", str(self.box.ssh_config), self.box.alias,
                                       "true"]),
            STARTS: lambda r: self.run(self.floor_argv("start")),
        }
        runs = self.ab("no-op push", self.cfg.n("noop"), tools)
        self.record("noop", "No-op push", runs, base="rsync")
        moved = [(o.get("uploaded"), o.get("bytes_sent")) for o in outs]
        self.check("no-op push uploads nothing (filesync)",
                   all(m[0] == 0 for m in moved), str(moved))

    def step_edit(self) -> None:
        """3. Push after 10 edited files."""
        changed: list[int] = []

        def setup(r: int) -> None:
            rels = trees.pick(self.main_files, self.cfg.edits, seed=1000 + r)
            changed.append(trees.edit([self.main, self.main_agent, self.main_x], rels,
                                      seed=1000 + r))

        outs: list[str] = []

        def fs(_r: int) -> Sample:
            s = self.run(self.fs_argv("push", self.main, [f"{self.box.alias}:fs"], self.fs_state))
            outs.append(s.out)
            return s

        def fsa(_r: int) -> Sample:
            s = self.fsa(self.fs_argv("push", self.main_agent, [f"{self.box.alias}:fsa"],
                                      self.fsa_state))
            outs.append(s.out)
            return s

        def fsx(_r: int) -> Sample:
            s = self.run(self.fsx_argv("push", self.main_x, "fsx", self.fsx_state))
            outs.append(s.out)
            return s

        tools = {
            "filesync": fs,
            AGENT: fsa,
            ASYNC: fsx,
            "rsync": lambda r: self.run(self.rsync_argv(f"{self.main}/", f"{self.box.alias}:rs/")),
        }
        runs = self.ab("edit push", self.cfg.n("edit"), tools, setup, settle=self.cfg.settle)
        self.record("edit", f"Push after {self.cfg.edits} edited files", runs, base="rsync",
                    changed_bytes=median(changed))
        uploaded = [json.loads(o).get("uploaded") for o in outs]
        self.check(f"edit push uploads exactly the {self.cfg.edits} edited files (filesync)",
                   all(u == self.cfg.edits for u in uploaded), str(uploaded))
        self.verify("edit push: remote == local (filesync)", self.main, self.remote("fs"))
        self.verify("edit push: remote == local (filesync --persist)", self.main_agent,
                    self.remote("fsa"))
        self.verify("edit push: remote == local (rsync)", self.main, self.remote("rs"))

    # -- pull ---------------------------------------------------------------------------------

    def _remote_edit(self, r: int, dirs: Sequence[str], seed_base: int) -> int:
        """Edit ``edits`` files and grow ``junk_mib`` MiB of excluded junk in each remote dir."""
        rels = trees.pick(self.main_files, self.cfg.edits, seed=seed_base + r)
        roots = [self.remote(d) for d in dirs]
        changed = trees.edit(roots, rels, seed=seed_base + r)
        junk = random.Random(seed_base + r).randbytes(self.cfg.junk_mib * MiB)
        for root in roots:
            jd = root / ".curator_backups"
            shutil.rmtree(jd, ignore_errors=True)
            jd.mkdir()
            for k in range(self.cfg.junk_mib):
                (jd / f"junk-{r:02d}-{k:02d}.tar").write_bytes(junk[k * MiB:(k + 1) * MiB])
        return changed

    def _write_pushed(self, local: Path, remote_root: str) -> Path:
        """The old system's in-memory pushed hashes, handed to oldsync.py."""
        pushed = trees.digest_tree(local)
        path = self.w / "old-pushed.json"
        path.write_text(json.dumps({"host_root": str(local), "remote_root": remote_root,
                                    "pushed": pushed}))
        return path

    def step_pull(self) -> None:
        """4. Pull after the remote edited 10 files and grew 24 MiB of excluded junk."""
        self.pull_rs = self.host / "pull-rs"
        self.pull_old = self.host / "pull-old"
        pull_floor = self.host / "pull-floor"
        for d in (self.pull_rs, self.pull_old, pull_floor):
            shutil.rmtree(d, ignore_errors=True)
            subprocess.run(["cp", "-a", f"{self.main}", str(d)], check=True)
        for name in ("old", "flr"):
            shutil.rmtree(self.remote(name), ignore_errors=True)
            subprocess.run(["cp", "-a", str(self.remote("fs")), str(self.remote(name))],
                           check=True)
        # The python floor keeps the listing of its last run as its state: its first run,
        # untimed, fetches everything.
        floor_state = self.w / "floor-pull.json"
        floor_state.unlink(missing_ok=True)
        floor_argv = self.floor_argv("pull", "flr", str(pull_floor), str(floor_state),
                                     *EXCLUDED_DIRS)
        subprocess.run(floor_argv, env=self.env, check=True, stdout=subprocess.DEVNULL)
        changed: list[int] = []
        state_file: list[Path] = []
        reports: list[dict[str, Any]] = []
        old_stats: list[dict[str, Any]] = []

        def setup(r: int) -> None:
            # the old system's host tree: drop what its last sync-back copied in by mistake,
            # and take the pushed hashes of what is there now (as if just pushed)
            shutil.rmtree(self.pull_old / ".curator_backups", ignore_errors=True)
            state_file[:] = [self._write_pushed(self.pull_old, str(Path("/root/old")))]
            changed.append(self._remote_edit(r, ("fs", "rs", "old", "fsa", "fsx", "flr"), 2000))

        def fs(_r: int) -> Sample:
            s = self.run(self.fs_argv("pull", self.main, [f"{self.box.alias}:fs"], self.fs_state))
            reports.append(json.loads(s.out))
            return s

        def fsa(_r: int) -> Sample:
            s = self.fsa(self.fs_argv("pull", self.main_agent, [f"{self.box.alias}:fsa"],
                                      self.fsa_state))
            reports.append(json.loads(s.out))
            return s

        def old(_r: int) -> Sample:
            s = self.run([sys.executable, str(BENCH / "oldsync.py"), "--ssh-config",
                          str(self.box.ssh_config), "--host", self.box.alias,
                          "--state", str(state_file[0])])
            old_stats.append(json.loads(s.out))
            return s

        def fsx(_r: int) -> Sample:
            s = self.run(self.fsx_argv("pull", self.main_x, "fsx", self.fsx_state))
            reports.append(json.loads(s.out))
            return s

        tools = {
            "filesync": fs,
            AGENT: fsa,
            ASYNC: fsx,
            "rsync": lambda r: self.run(self.rsync_argv(f"{self.box.alias}:rs/",
                                                        f"{self.pull_rs}/")),
            "old sync-back": old,
            FLOOR: lambda r: self.run(floor_argv),
        }
        runs = self.ab("pull", self.cfg.n("pull"), tools, setup, settle=self.cfg.settle)
        cb = median(changed)
        self.record("pull", f"Pull after {self.cfg.edits} remote edits + "
                    f"{self.cfg.junk_mib} MiB excluded junk", runs, base="rsync",
                    changed_bytes=cb, wire_limit=1.2 * cb + 64 * 1024,
                    old_stats=old_stats[-1] if old_stats else {})
        step = self.results["steps"]["pull"]
        for tool in ("filesync", AGENT):
            step["ratios"][f"{tool}/old sync-back"] = (
                step["median"][tool]["wall"] / step["median"]["old sync-back"]["wall"])
        dl = [rep.get("downloaded") for rep in reports]
        self.check(f"pull downloads exactly the {self.cfg.edits} edited files (filesync)",
                   all(d == self.cfg.edits for d in dl), str(dl))
        self.verify("pull: local == remote (filesync)", self.main, self.remote("fs"))
        self.verify("pull: local == remote (filesync --persist)", self.main_agent,
                    self.remote("fsa"))
        self.verify("pull: local == remote (rsync)", self.pull_rs, self.remote("rs"))
        self.verify("pull: local == remote (python floor)", pull_floor, self.remote("flr"))
        leaked = [p.name for p in (self.main / ".curator_backups").glob("junk-*")]
        self.check("pull: excluded remote junk not brought home (filesync)", not leaked,
                   str(leaked[:5]))
        if old_stats:
            self.check("old sync-back copied the excluded junk (the bug it is known for)",
                       old_stats[-1].get("copied", 0) >= self.cfg.junk_mib,
                       str(old_stats[-1]))

    # -- warm ---------------------------------------------------------------------------------

    def step_warm(self) -> None:
        """5. Warm connection: library API on an open connection vs rsync over ControlMaster."""
        from filesync.core.exclude import ExcludeRule
        from filesync.core.reconcile import Direction
        from filesync.sync.engine import Options, run_pass
        from filesync.sync.warm import WarmState
        from filesync.transport.ssh.conduit import SshTarget, connect

        if not hasattr(self, "pull_rs"):
            raise BenchError("the warm step needs the pull step's trees (run --steps pull,warm)")
        cm_dir = Path(tempfile.mkdtemp(prefix="cm-", dir="/tmp"))  # short socket path
        cm = ["-o", "ControlMaster=auto", "-o", f"ControlPath={cm_dir}/%C",
              "-o", "ControlPersist=60"]
        loop = asyncio.new_event_loop()
        conduit = loop.run_until_complete(connect(SshTarget(self.box.alias),
                                                  ssh_config=self.box.ssh_config))
        rule = ExcludeRule.build(root=self.main)
        warm = WarmState(watch=True)  # the library's warm passes: one owner for all of them
        box = self.box
        reports: list[Any] = []

        def fs_pass(direction: Direction) -> Sample:
            w0 = box.wire_bytes()
            c0 = time.process_time()
            t0 = time.perf_counter()
            rep = loop.run_until_complete(run_pass(
                conduit, self.main, "fs",
                Options(direction, rule=rule, state_dir=self.fs_state), warm=warm))
            wall = time.perf_counter() - t0
            reports.append(rep)
            return Sample(wall, time.process_time() - c0, 0.0, box.wire_bytes() - w0, 0)

        rs_noop = self.rsync_argv(f"{self.pull_rs}/", f"{box.alias}:rs/", cm)
        rs_pull = self.rsync_argv(f"{box.alias}:rs/", f"{self.pull_rs}/", cm)

        def rsync_cm(argv: list[str]) -> Sample:
            # the master's server-side session stays open: no reaped remote CPU to read
            return self.run(argv, remote_cpu=False)

        try:
            # warm-up: starts the ControlMaster; settles filesync's racy-timestamp window
            rsync_cm(rs_noop)
            fs_pass(Direction.SYNC)
            time.sleep(self.cfg.settle)
            fs_pass(Direction.SYNC)
            reports.clear()
            runs = self.ab("warm no-op sync", self.cfg.n("warm_noop"), {
                "filesync (open connection)": lambda r: fs_pass(Direction.SYNC),
                "rsync (ControlMaster)": lambda r: rsync_cm(rs_noop),
            })
            self.record("warm_noop", "Warm no-op sync (library, open connection)", runs,
                        base="rsync (ControlMaster)")
            moved = [(x.uploaded, x.downloaded) for x in reports]
            self.check("warm no-op sync moves nothing (filesync)",
                       all(m == (0, 0) for m in moved), str(moved))
            reports.clear()
            changed: list[int] = []
            runs = self.ab("warm pull", self.cfg.n("warm_pull"), {
                "filesync (open connection)": lambda r: fs_pass(Direction.PULL),
                "rsync (ControlMaster)": lambda r: rsync_cm(rs_pull),
            }, setup=lambda r: changed.append(self._remote_edit(r, ("fs", "rs"), 3000)),
                settle=self.cfg.settle)
            self.record("warm_pull", f"Warm pull ({self.cfg.edits} remote edits + "
                        f"{self.cfg.junk_mib} MiB junk)", runs, base="rsync (ControlMaster)",
                        changed_bytes=median(changed))
            dl = [x.downloaded for x in reports]
            self.check("warm pull downloads exactly the edited files (filesync)",
                       all(d == self.cfg.edits for d in dl), str(dl))
            self.verify("warm pull: local == remote (filesync)", self.main, self.remote("fs"))
        finally:
            loop.run_until_complete(warm.close())
            loop.run_until_complete(conduit.close())
            loop.close()
            subprocess.run(["ssh", "-F", str(box.ssh_config), *cm, "-O", "exit", box.alias],
                           env=self.env, capture_output=True, check=False)
            shutil.rmtree(cm_dir, ignore_errors=True)

    # -- scale --------------------------------------------------------------------------------

    def step_scale(self) -> None:
        """6. 10k and 100k small files: initial and no-op push, vs rsync; growth factor."""
        sizes = self.cfg.scale_sizes
        self.agent_warmup([self.box])
        labels = [self._k(n) for n in sizes]
        for n, label in zip(sizes, labels, strict=True):
            local = self.host / f"small-{label}"
            t0 = time.perf_counter()
            info = trees.make_small_tree(local, n)
            self.results["trees"][f"small_{label}"] = info.as_dict()
            print(f"small tree {label}: {info.kept_files} files / "
                  f"{info.kept_bytes / MiB:.1f} MiB ({time.perf_counter() - t0:.1f} s)",
                  flush=True)
            fs_dir, rs_dir, fsa_dir = f"s{label}-fs", f"s{label}-rs", f"s{label}-fsa"
            state = [self.w, self.w]

            floor_dir = f"s{label}-floor"

            def setup(_r: int, fs_dir: str = fs_dir, rs_dir: str = rs_dir,
                      fsa_dir: str = fsa_dir, floor_dir: str = floor_dir) -> None:
                self.clear_remote(fs_dir)
                self.clear_remote(rs_dir)
                self.clear_remote(fsa_dir)
                self.clear_remote(floor_dir)

            # A push into the state the last one left (a fresh state first: the initial push)
            def fs_push(_r: int, local: Path = local, fs_dir: str = fs_dir,
                        state: list[Path] = state) -> Sample:
                return self.run(self.fs_argv("push", local, [f"{self.box.alias}:{fs_dir}"],
                                             state[0]))

            def fsa_push(_r: int, local: Path = local, fsa_dir: str = fsa_dir,
                         state: list[Path] = state) -> Sample:
                return self.fsa(self.fs_argv("push", local, [f"{self.box.alias}:{fsa_dir}"],
                                             state[1]))

            def fs_init(r: int, state: list[Path] = state,
                        push: Callable[[int], Sample] = fs_push) -> Sample:
                state[0] = self.fresh_state()
                return push(r)

            def fsa_init(r: int, state: list[Path] = state,
                         push: Callable[[int], Sample] = fsa_push) -> Sample:
                state[1] = self.fresh_state()
                return push(r)

            def rsync_push(_r: int, local: Path = local, rs_dir: str = rs_dir) -> Sample:
                return self.run(self.rsync_argv(f"{local}/", f"{self.box.alias}:{rs_dir}/"))

            def floor_push(_r: int, local: Path = local, floor_dir: str = floor_dir) -> Sample:
                return self.run(self.floor_argv("push", floor_dir, str(local)))

            runs = self.ab(f"scale {label} init", self.cfg.n(f"scale_{label}_initial"), {
                "filesync": fs_init, AGENT: fsa_init, "rsync": rsync_push, FLOOR: floor_push,
            }, setup)
            self.record(f"scale_{label}_initial", f"Initial push, {label} small files", runs,
                        base="rsync", files=n)
            floored = sum(len(files) for _d, _s, files in os.walk(self.remote(floor_dir)))
            self.check(f"scale {label}: the python floor wrote every file", floored == n,
                       f"{floored} of {n}")
            self.verify(f"scale {label}: remote == local (filesync)", local,
                        self.remote(fs_dir))
            runs = self.ab(f"scale {label} no-op", self.cfg.n(f"scale_{label}_noop"), {
                "filesync": fs_push, AGENT: fsa_push, "rsync": rsync_push,
            })
            self.record(f"scale_{label}_noop", f"No-op push, {label} small files", runs,
                        base="rsync", files=n)
            shutil.rmtree(local, ignore_errors=True)
            self.clear_remote(fs_dir)
            self.clear_remote(rs_dir)
            self.clear_remote(fsa_dir)
        steps = self.results["steps"]
        growth: dict[str, float] = {}
        a, b = labels
        for kind in ("initial", "noop"):
            for tool in ("filesync", AGENT, "rsync"):
                growth[f"{kind} {tool}"] = (steps[f"scale_{b}_{kind}"]["median"][tool]["wall"]
                                            / steps[f"scale_{a}_{kind}"]["median"][tool]["wall"])
        self.results["scale_growth"] = {"from": a, "to": b, "factor": sizes[1] / sizes[0],
                                        "growth": growth}

    @staticmethod
    def _k(n: int) -> str:
        return f"{n // 1000}k" if n % 1000 == 0 else str(n)

    # -- one big file -------------------------------------------------------------------------

    def step_bigfile(self) -> None:
        """7. One 1 GiB file: filesync push vs ssh 'cat > /dev/null' (aes128-gcm)."""
        local = self.host / "big"
        trees.make_big_file(local, self.cfg.big_size)
        src = local / "big.bin"
        # The same cipher for every tool ("throughput >= 80 % of ssh cat, same cipher"):
        # filesync takes it from the user's config, as it never overrides one; ssh cat gets
        # the same config (and -c, which says the same).
        cfg = self.w / "big_ssh_config"
        cfg.write_text(f"Host *\n    Ciphers {CIPHER}\n\n" + self.box.ssh_config.read_text())
        self.agent_warmup([self.box], cfg)

        def setup(_r: int) -> None:
            self.clear_remote("big-fs")
            self.clear_remote("big-fsa")
            self.remote("big-cat.bin").unlink(missing_ok=True)

        tools = {
            "filesync": lambda r: self.run(self.fs_argv("push", local,
                                                        [f"{self.box.alias}:big-fs"],
                                                        self.fresh_state(), cfg=cfg)),
            AGENT: lambda r: self.fsa(self.fs_argv("push", local, [f"{self.box.alias}:big-fsa"],
                                                   self.fresh_state(), cfg=cfg)),
            "ssh cat": lambda r: self.run(
                ["ssh", "-F", str(cfg), "-c", CIPHER, self.box.alias,
                 "cat > /dev/null"], stdin=src),
            # informational: the same stream, but stored like filesync must
            "ssh cat > file": lambda r: self.run(
                ["ssh", "-F", str(cfg), "-c", CIPHER, self.box.alias,
                 "cat > big-cat.bin"], stdin=src),
        }
        # warm-up round: the first GiB written to fresh tmpfs pages is slower on this VM
        runs = self.ab("big file", self.cfg.n("bigfile"), tools, setup, warmup=True)
        step = self.record("bigfile", f"One {self.cfg.big_size / MiB:.0f} MiB file", runs,
                           base="ssh cat", size=self.cfg.big_size)
        step["throughput_mib_s"] = {t: self.cfg.big_size / MiB / m["wall"]
                                    for t, m in step["median"].items()}
        step["peak_rss_mib"] = {t: max(s["maxrss_mib"] for s in rs) for t, rs in runs.items()}
        self.verify("1 GiB push: remote == local (filesync)", local, self.remote("big-fs"))
        shutil.rmtree(local, ignore_errors=True)
        self.clear_remote("big-fs")
        self.clear_remote("big-fsa")
        self.remote("big-cat.bin").unlink(missing_ok=True)

    # -- fan-out ------------------------------------------------------------------------------

    def cli_fans_out(self) -> bool:
        out = subprocess.run([*self.fs, "push", "--help"], capture_output=True, text=True,
                             env=self.env, check=False).stdout
        return "REMOTE ..." in out

    def step_fanout(self) -> None:
        """8. Push to N containerised hosts at once vs one host."""
        n = self.cfg.fan_hosts
        boxes = self.start_boxes(n)
        cfg = self.w / "fan_ssh_config"
        cfg.write_text("".join(b.ssh_config.read_text() + "\n" for b in boxes))
        via_cli = self.cli_fans_out()
        self.agent_warmup(boxes, cfg)

        def argv(bs: Sequence[sshd.SshdContainer], state: Path) -> list[str]:
            if via_cli:
                return self.fs_argv("push", self.main, [f"{b.alias}:fan" for b in bs], state,
                                    cfg=cfg)
            return [sys.executable, str(BENCH / "fanout.py"), str(self.main), str(cfg),
                    str(state), *[f"{b.alias}:fan" for b in bs]]

        def before(_r: int, _tool: str) -> None:
            # every run starts from empty remotes (a run onto the previous run's files would
            # be a different operation: fetch-and-compare instead of upload)
            for b in boxes:
                self.clear_remote("fan", b)

        states: dict[tuple[int, bool], Path] = {}

        def push(bs: Sequence[sshd.SshdContainer], fresh: bool, agent: bool = False) -> Sample:
            if fresh:
                states[len(bs), agent] = self.fresh_state()
            if agent:
                return self.fsa(argv(bs, states[len(bs), agent]), boxes=bs)
            return self.run(argv(bs, states[len(bs), agent]), boxes=bs)

        many, one = f"filesync {n} hosts", "filesync 1 host"
        a_many, a_one = f"{AGENT} {n} hosts", f"{AGENT} 1 host"
        reps = self.cfg.n("fanout")

        def push_many(r: int) -> Sample:
            sample = push(boxes, True)
            if r == reps - 1:  # checked right after the last N-host run, before any clearing
                for b in boxes:
                    self.verify(f"fan-out: {b.alias} == local", self.main, self.remote("fan", b))
            return sample

        # The floor: the tree's kept bytes through one plain ssh per host, all at once (each
        # host's login and encryption, which no fan-out can share).
        blob = self.w / "fan_blob"
        blob.write_bytes(random.Random(7).randbytes(self.results["trees"]["main"]["kept_bytes"]))

        def ssh_cat(bs: Sequence[sshd.SshdContainer]) -> Sample:
            script = f'for h in "$@"; do ssh -F {shlex.quote(str(cfg))} "$h" "cat > /dev/null" ' \
                     f'< {shlex.quote(str(blob))} & done; wait'
            return self.run(["sh", "-c", script, "sh", *[b.alias for b in bs]], boxes=bs)

        runs = self.ab("fan-out push", reps, {
            many: push_many,
            one: lambda r: push(boxes[:1], True),
            a_many: lambda r: push(boxes, True, agent=True),
            a_one: lambda r: push(boxes[:1], True, agent=True),
            f"{SSH_CAT} {n} hosts": lambda r: ssh_cat(boxes),
            f"{SSH_CAT} 1 host": lambda r: ssh_cat(boxes[:1]),
        }, before=before)
        step = self.record("fanout", f"Initial push to {n} hosts at once vs 1 host", runs,
                           base=one, hosts=n, via="cli" if via_cli else "library (asyncio.gather)")
        self._agent_fan_ratio(step, a_many, a_one)
        # (the floor is read by CPU, in ``floors``: no wall ratio against filesync)
        step["ratios"] = {k: v for k, v in step["ratios"].items() if not k.startswith(SSH_CAT)}
        # the no-op below needs every host in sync with its state again
        before(0, many)
        push(boxes, True)
        push(boxes, True, agent=True)
        if not self.cfg.smoke:
            runs = self.ab("fan-out no-op", self.cfg.n("fanout_noop"), {
                many: lambda r: push(boxes, False),
                one: lambda r: push(boxes[:1], False),
                a_many: lambda r: push(boxes, False, agent=True),
                a_one: lambda r: push(boxes[:1], False, agent=True),
            })
            step = self.record("fanout_noop", f"No-op push to {n} hosts at once vs 1 host", runs,
                               base=one, hosts=n, via="cli" if via_cli else "library")
            self._agent_fan_ratio(step, a_many, a_one)

    @staticmethod
    def _agent_fan_ratio(step: dict[str, Any], many: str, one: str) -> None:
        """Through the agent, N hosts are compared with one host through the agent."""
        med = step["median"]
        step["ratios"] = {k: v for k, v in step["ratios"].items() if not k.startswith(AGENT)}
        step["ratios"][f"{many}/{one}"] = med[many]["wall"] / med[one]["wall"]

    def step_watch(self) -> None:
        """9. ``filesync watch`` and ``unison -repeat 1``: latency both ways, a burst,
        idle CPU and RSS on the 3k and 100k trees (bench/watchstep.py)."""
        import watchstep

        self.results["steps"]["watch"] = watchstep.run(self, tree_cpu)

    # -- driver -------------------------------------------------------------------------------

    def run_all(self) -> None:
        self.results["meta"] = meta(self.cfg, self.w)
        self.build_main()
        self.start_boxes(1)
        steps: dict[str, Callable[[], None]] = {
            "initial": self.step_initial, "noop": self.step_noop, "edit": self.step_edit,
            "pull": self.step_pull, "warm": self.step_warm, "scale": self.step_scale,
            "bigfile": self.step_bigfile, "fanout": self.step_fanout,
            "watch": self.step_watch,
            "unison": lambda: peers.step_unison(self),
            "disk": lambda: peers.step_disk(self, self.cfg.disk)}
        needs_initial = {"noop", "edit", "pull", "warm"}
        selected = list(self.cfg.steps)
        if needs_initial & set(selected) and "initial" not in selected:
            selected.insert(0, "initial")
        t_all = time.perf_counter()
        for name in ALL_STEPS:
            if name not in selected:
                continue
            t0 = time.perf_counter()
            print(f"== {name}", flush=True)
            if self.cfg.wait_idle:
                busy, waited = wait_idle(self.cfg.wait_idle)
                self.results["meta"].setdefault("busy_before_step", {})[name] = {
                    "busy": round(busy, 3), "waited_s": round(waited, 1)}
            try:
                steps[name]()
            except Exception as exc:
                self.results["errors"][name] = f"{type(exc).__name__}: {exc}"
                print(f"  step {name} FAILED: {exc}", flush=True)
            print(f"   ({time.perf_counter() - t0:.1f} s)", flush=True)
        self.results["meta"]["seconds"] = round(time.perf_counter() - t_all, 1)
        # other processes on the machine (a test run, say) skew timings: recorded, not fixed
        self.results["meta"]["loadavg_end_5min"] = os.getloadavg()[1]
        self.results["targets"] = evaluate_targets(self.results)


# ---------------------------------------------------------------------------------------------
# targets
# ---------------------------------------------------------------------------------------------


def target_row(name: str, target: str, value: float | None, limit: float,
               unit: str = "x") -> dict[str, Any]:
    """One row of the targets table: met when ``value`` is at most ``limit``; unmeasured
    (``met`` None) when the step did not run."""
    if value is None:
        return {"name": name, "target": target, "measured": None, "met": None}
    shown = f"{value:.2f}x" if unit == "x" else f"{value:.1f} {unit}"
    return {"name": name, "target": target, "value": round(value, 4), "limit": limit,
            "measured": shown, "met": value <= limit}


def step_ratio(steps: dict[str, Any], step: str, key: str) -> float | None:
    """``step``'s ratio ``key`` (such as ``filesync/rsync``); None if it was not measured."""
    value = steps.get(step, {}).get("ratios", {}).get(key)
    return None if value is None else float(value)


def evaluate_targets(res: dict[str, Any]) -> list[dict[str, Any]]:
    steps = res["steps"]
    out: list[dict[str, Any]] = []

    def add(name: str, target: str, value: float | None, limit: float, unit: str = "x") -> None:
        out.append(target_row(name, target, value, limit, unit))

    def ratio(step: str, key: str) -> float | None:
        return step_ratio(steps, step, key)

    # The OpenSSH-transport issue's targets: the plain CLI (no agent, no master of the
    # user's), over both clients where the step runs both, plus the two --persist targets.
    clients = (("filesync", ""), (ASYNC, " [asyncssh]"))
    for tool, tag in clients:
        add(f"cold initial push{tag}", "<= 0.7x rsync", ratio("initial", f"{tool}/rsync"), 0.7)
    for tool, tag in clients:
        add(f"cold no-op push{tag}", "<= 0.9x rsync", ratio("noop", f"{tool}/rsync"), 0.9)
    for tool, tag in clients:
        add(f"cold pull of 10 remote edits{tag}", "<= 0.9x rsync",
            ratio("pull", f"{tool}/rsync"), 0.9)
    scale = [k for k in steps if k.startswith("scale_") and k.endswith("_noop")]
    top = max(scale, key=lambda k: steps[k].get("files", 0)) if scale else "scale_100k_noop"
    label = top[len("scale_"):-len("_noop")]
    big_noop, big_init = top, f"scale_{label}_initial"
    add(f"{label}-file no-op push", "<= 1.2x rsync", ratio(big_noop, "filesync/rsync"), 1.2)
    add(f"{label}-file no-op push [--persist]", "<= 0.5x rsync",
        ratio(big_noop, f"{AGENT}/rsync"), 0.5)
    add(f"{label}-file initial push", "<= 1.0x rsync", ratio(big_init, "filesync/rsync"), 1.0)
    init = steps.get(big_init, {}).get("median", {}).get("filesync")
    add(f"{label}-file initial push, client peak RSS", "<= 150 MiB",
        init["maxrss_mib"] if init else None, 150, "MiB")
    bf = steps.get("bigfile")
    if bf and "filesync" in bf["throughput_mib_s"]:
        share = bf["throughput_mib_s"]["filesync"] / bf["throughput_mib_s"]["ssh cat"]
        out.append({"name": "1 GiB push throughput (same cipher)",
                    "target": ">= 80% of ssh cat", "value": round(share, 4), "limit": 0.8,
                    "higher_is_better": True,
                    "measured": f"{share * 100:.0f}% ({bf['throughput_mib_s']['filesync']:.0f} "
                    f"vs {bf['throughput_mib_s']['ssh cat']:.0f} MiB/s)",
                    "met": share >= 0.8})
    else:
        add("1 GiB push throughput (same cipher)", ">= 80% of ssh cat", None, 0)
    add("1 GiB push, client peak RSS", "<= 100 MiB",
        bf["peak_rss_mib"].get("filesync") if bf else None, 100, "MiB")
    fan = steps.get("fanout")
    n = (fan or {}).get("hosts", 8)
    many = (fan or {}).get("median", {}).get(f"filesync {n} hosts")
    one = (fan or {}).get("median", {}).get("filesync 1 host")
    add(f"{n}-host fan-out, client CPU vs 1 host", "<= 2.5x",
        many["cpu"] / one["cpu"] if many and one and one["cpu"] else None, 2.5)
    add("--persist no-op push", "<= 0.35x rsync", ratio("noop", f"{AGENT}/rsync"), 0.35)
    out.extend(peer_targets(steps, label))
    out.extend(floors(steps, big_init))
    # Per-file cost, reported (the issue asks for the client CPU per 1,000 files).
    for kind, key in (("initial", big_init), ("no-op", big_noop)):
        med = steps.get(key, {}).get("median", {}).get("filesync")
        files = steps.get(key, {}).get("files")
        if med and files:
            out.append({"name": f"client CPU per 1,000 files, {label} {kind} push",
                        "target": "reported", "value": med["cpu"] / files * 1000,
                        "measured": f"{med['cpu'] / files * 1000 * 1000:.1f} ms", "met": None,
                        "info": True})
    return out


def peer_targets(steps: dict[str, Any], label: str) -> list[dict[str, Any]]:
    """Issue 21's targets: filesync ``sync`` against unison, and the disk step against rsync."""
    out: list[dict[str, Any]] = []

    def add(name: str, target: str, value: float | None, limit: float) -> None:
        out.append(target_row(name, target, value, limit))

    def ratio(step: str, key: str) -> float | None:
        return step_ratio(steps, step, key)

    un = f"{peers.FS_SYNC}/{peers.UNISON}"
    add("no-op sync vs unison, 3k files", "<= 1.0x unison", ratio("unison_noop", un), 1.0)
    add("sync after 10 + 10 edits vs unison, 3k files", "<= 1.0x unison",
        ratio("unison_edit", un), 1.0)
    add("first sync vs unison, 3k files", "<= 0.5x unison", ratio("unison_first", un), 0.5)
    add("disk: initial push vs rsync, 3k files", "<= 1.1x rsync",
        ratio("disk_3k_initial", "filesync/rsync"), 1.1)
    scaled = [k for k in steps if k.startswith("disk_") and k.endswith("_initial")
              and k != "disk_3k_initial"] or ["disk_100k_initial"]
    disk_label = scaled[0][len("disk_"):-len("_initial")]
    add(f"disk: initial push vs rsync, {disk_label} files", "<= 1.3x rsync",
        ratio(scaled[0], "filesync/rsync"), 1.3)
    add("tmpfs: no-op push vs rsync, 3k files", "<= 1.1x rsync",
        ratio("noop", "filesync/rsync"), 1.1)
    add("tmpfs: pull of 10 edits vs rsync, 3k files", "<= 1.1x rsync",
        ratio("pull", "filesync/rsync"), 1.1)
    # The first no-op after the push is the no-op step's first repetition (filesync runs
    # first in it); later repetitions find the pair sealed.
    noop = steps.get(f"scale_{label}_noop", {}).get("runs", {})
    first = None
    if noop.get("filesync") and noop.get("rsync"):
        first = noop["filesync"][0]["wall"] / median(r["wall"] for r in noop["rsync"])
    add(f"{label}-file first no-op after a push (tmpfs)", "<= 1.3x rsync", first, 1.3)
    return out


def floors(steps: dict[str, Any], big_init: str) -> list[dict[str, Any]]:
    """What no tool over the same ssh, or no CPython pipeline, goes below, from this run:
    informational rows beside the targets they bound."""
    out: list[dict[str, Any]] = []

    def med(step: str, tool: str, key: str = "wall") -> float | None:
        m = steps.get(step, {}).get("median", {}).get(tool)
        return m[key] if m else None

    def info(name: str, value: float | None, shown: str) -> None:
        if value is not None:
            out.append({"name": name, "target": "floor", "value": round(value, 4),
                        "measured": shown, "met": None, "info": True})

    for step, what in (("initial", "cold initial push"), ("noop", "cold no-op push"),
                       ("pull", "cold pull of 10 remote edits")):
        rsync = med(step, "rsync")
        for tool in (LOGIN, STARTS):
            fixed = med("noop", tool)
            if fixed is not None and rsync:
                info(f"floor of the {what}: `{tool}` alone vs rsync", fixed / rsync,
                     f"{fixed / rsync:.2f}x")
    fl, rs = med("pull", FLOOR), med("pull", "rsync")
    if fl is not None and rs:
        info(f"floor of the cold pull of 10 remote edits: `{FLOOR}` (a stateful CPython "
             "pull, nothing durable, no host walk) vs rsync", fl / rs, f"{fl / rs:.2f}x")
    tar, rsync = med("initial", "tar"), med("initial", "rsync")
    if tar is not None and rsync:
        info("floor of the cold initial push: `tar | ssh tar -x` (C, no state, no checks) "
             "vs rsync", tar / rsync, f"{tar / rsync:.2f}x")
    # The starts are timed in the unison steps' own rounds (``peers.two_way``).
    starts = med("unison_noop", STARTS)
    un_noop, un_edit = med("unison_noop", peers.UNISON), med("unison_edit", peers.UNISON)
    if starts is not None and un_noop:
        info(f"floor of the no-op sync vs unison, 3k files: `{STARTS}` alone vs unison",
             starts / un_noop, f"{starts / un_noop:.2f}x")
    for step, what in (("unison_noop", "no-op sync"),
                       ("unison_edit", "sync after 10 + 10 edits")):
        fl, un = med(step, FLOOR), med(step, peers.UNISON)
        if fl is not None and un:
            info(f"floor of the {what} vs unison, 3k files: `{FLOOR}` (a stateful CPython "
                 "two-way sync, nothing durable) vs unison", fl / un, f"{fl / un:.2f}x")
    edit_starts = med("unison_edit", STARTS)
    if edit_starts is not None and un_noop and un_edit:
        # The edits cost any tool what they cost unison at least: its own edited sync
        # beyond its no-op (none when its spread makes that negative), on top of the
        # interpreter starts around ssh's login.
        edit_floor = (edit_starts + max(0.0, un_edit - un_noop)) / un_edit
        info("floor of the sync after 10 + 10 edits vs unison, 3k files: "
             f"`{STARTS}` plus unison's own cost of the edits (its edited sync beyond its "
             "no-op) vs unison", edit_floor, f"{edit_floor:.2f}x")
    for step in [k for k in steps if k.startswith("disk_") and k.endswith("_initial")]:
        fsynced, rs = med(step, peers.RSYNC_FSYNC), med(step, "rsync")
        if fsynced is not None and rs:
            size = step[len("disk_"):-len("_initial")]
            info(f"floor of the disk initial push, {size} files: `{peers.RSYNC_FSYNC}` "
                 "(each file flushed, C) vs rsync", fsynced / rs, f"{fsynced / rs:.2f}x")
    fl, rs = med(big_init, FLOOR), med(big_init, "rsync")
    if fl is not None and rs:
        info(f"floor of the {big_init[len('scale_'):-len('_initial')]}-file initial push: "
             f"`{FLOOR}` vs rsync", fl / rs, f"{fl / rs:.2f}x")
    fan = steps.get("fanout", {})
    n = fan.get("hosts", 8)
    one_fs = med("fanout", "filesync 1 host", "cpu")
    ssh_many = med("fanout", f"{SSH_CAT} {n} hosts", "cpu")
    ssh_one = med("fanout", f"{SSH_CAT} 1 host", "cpu")
    if one_fs and ssh_many is not None and ssh_one is not None:
        # One host's filesync run, plus only the ssh cost of each further host.
        bound = (one_fs + ssh_many - ssh_one) / one_fs
        info(f"floor of the {n}-host fan-out CPU ratio: one host's run plus each other "
             f"host's `{SSH_CAT}` CPU", bound, f"{bound:.2f}x")
    bf = steps.get("bigfile")
    if bf and "ssh cat > file" in bf.get("throughput_mib_s", {}):
        thr = bf["throughput_mib_s"]
        share = thr["ssh cat > file"] / thr["ssh cat"]
        info("1 GiB: `ssh cat > file` (storing alone) vs `ssh cat`", share,
             f"{share * 100:.0f}%")
    return out


# ---------------------------------------------------------------------------------------------
# metadata, tmpfs, main
# ---------------------------------------------------------------------------------------------


def _first_line(argv: list[str]) -> str:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=10)
    except OSError:
        return "?"
    return " ".join(((p.stdout or p.stderr).strip().splitlines() or ["?"])[0].split())


def meta(cfg: Config, work: Path) -> dict[str, Any]:
    import asyncssh

    cpu = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    git = _first_line(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"])
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "filesync"],
                           capture_output=True, text=True, check=False).stdout.strip()
    return {
        "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "smoke": cfg.smoke,
        "steps": list(cfg.steps),
        "settle_s": cfg.settle,
        "edits": cfg.edits,
        "git": git,
        "filesync_dirty_files": len(dirty.splitlines()) if dirty else 0,
        "python": platform.python_version(),
        "asyncssh": asyncssh.__version__,
        "rsync": _first_line(["rsync", "--version"]),
        "ssh": _first_line(["ssh", "-V"]),
        "kernel": platform.release(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "mem_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)),
        "workdir_fs": "tmpfs" if _is_tmpfs(work) else "disk",
        "loadavg_start": os.getloadavg()[0],
    }


def _is_tmpfs(path: Path) -> bool:
    best, fstype = "", ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/mounts").read_text().splitlines():
            _dev, mnt, typ, *_ = line.split()
            if str(path).startswith(mnt) and len(mnt) > len(best):
                best, fstype = mnt, typ
    return fstype == "tmpfs"


def ensure_unison() -> bool:
    """unison, the two-way peer: installed from Debian's package (as root) when missing."""
    if shutil.which("unison") is not None:
        return True
    if os.geteuid() == 0 and shutil.which("apt-get") is not None:
        print("bench: installing unison (apt-get)", flush=True)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], env=env, check=False)
        subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "unison"],
                       env=env, check=False, stdout=subprocess.DEVNULL)
    return shutil.which("unison") is not None


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="filesync benchmarks (needs root)")
    ap.add_argument("--smoke", action="store_true", help="tiny trees, 1 repetition (CI)")
    ap.add_argument("--steps", help=f"comma-separated subset of {','.join(ALL_STEPS)}")
    ap.add_argument("--reps", type=int, help="repetitions for every step (override)")
    ap.add_argument("--out", type=Path, help="result JSON (default bench/results/run-*.json)")
    ap.add_argument("--workdir", type=Path, help="work dir (default: a new dir under /tmp)")
    ap.add_argument("--no-tmpfs", action="store_true", help="do not mount a tmpfs on it")
    ap.add_argument("--disk-dir", type=Path, default=DISK_DIR,
                    help="a dir on a real file system (not a tmpfs, not under /tmp, which "
                    f"the sshd containers hide) for the disk step, which works in a new "
                    f"dir of its own under it (default {DISK_DIR})")
    ap.add_argument("--keep", action="store_true", help="leave the work dir (needs --no-tmpfs)")
    ap.add_argument("--wait-idle", type=float, metavar="SECONDS",
                    help="before each step wait up to this long for other processes to leave "
                    "the CPU idle (default 120 for full runs, 0 for --smoke)")
    ap.add_argument("--docs", action=argparse.BooleanOptionalAction, default=None,
                    help="rewrite docs/benchmarks.md and its charts (default: full runs only)")
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    ok, why = sshd.sshd_available()
    if not ok:
        print(f"bench: cannot start sshd containers: {why}", file=sys.stderr)
        return 2
    missing = [t for t in ("rsync", "ssh", "tar") if shutil.which(t) is None]
    if not missing and not ensure_unison():
        missing = ["unison"]
    if missing:
        print(f"bench: missing tools: {', '.join(missing)}", file=sys.stderr)
        return 2
    if not become_subreaper():
        print("bench: cannot become a child subreaper; filesync's daemonized ssh master "
              "will be missing from its client CPU", file=sys.stderr)
    cfg = Config.smoke_cfg() if args.smoke else Config.full()
    if args.steps:
        cfg.steps = tuple(s.strip() for s in args.steps.split(",") if s.strip())
        unknown = set(cfg.steps) - set(ALL_STEPS)
        if unknown:
            print(f"bench: unknown steps {sorted(unknown)}", file=sys.stderr)
            return 2
    if args.reps:
        cfg.reps = {k: args.reps for k in Config.full().reps}
        cfg.smoke = cfg.smoke and args.reps == 1
    if args.wait_idle is not None:
        cfg.wait_idle = args.wait_idle
    cfg.disk = args.disk_dir.resolve()
    if "disk" in cfg.steps and (_is_tmpfs(cfg.disk) or cfg.disk.is_relative_to("/tmp")):
        print(f"bench: --disk-dir {cfg.disk} is on a tmpfs or under /tmp; give a dir on a "
              "real disk", file=sys.stderr)
        return 2
    if args.keep and not args.no_tmpfs:
        print("bench: --keep needs --no-tmpfs (the tmpfs goes away)", file=sys.stderr)
        return 2
    work = (args.workdir or Path(tempfile.mkdtemp(prefix="filesync-bench-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    mounted = False
    if not args.no_tmpfs:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16g,mode=755", "tmpfs", str(work)],
                       check=True)
        mounted = True
    bench = Bench(cfg, work, args.keep)
    print(f"bench: work dir {work} ({'tmpfs' if mounted else 'no tmpfs'}), "
          f"steps {','.join(cfg.steps)}", flush=True)
    try:
        bench.run_all()
    finally:
        bench.stop_agent()
        bench.stop_boxes()
        if mounted:
            subprocess.run(["umount", str(work)], check=False)
            if _is_tmpfs(work):
                subprocess.run(["umount", "-l", str(work)], check=False)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    res = bench.results
    out = args.out or (BENCH / "results" /
                       f"run-{time.strftime('%Y%m%d-%H%M%S')}{'-smoke' if cfg.smoke else ''}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1) + "\n")
    print(f"bench: results in {out}", flush=True)
    import report

    print(report.targets_table(res))
    write_docs = args.docs if args.docs is not None else not cfg.smoke
    if write_docs:
        doc = report.write_docs(res, out)
        print(f"bench: wrote {doc}", flush=True)
    failed = [c["name"] for c in res["checks"] if not c["ok"]]
    if failed or res["errors"]:
        print(f"bench: FAILED checks {failed} errors {res['errors']}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
