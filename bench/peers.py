"""The peers people would pick instead of filesync, measured beside it (issue 21).

``step_unison``: filesync ``sync`` against unison (two-way, archives on both sides, a
three-way rule like filesync's): first sync into an empty remote, no-op sync, and sync after
edits on both sides.  Both tools get the bench's exclusions and keep mtimes
(``-batch -auto -times``).

``step_disk``: the unison comparisons and the rsync ones (initial push, no-op, pull of edits)
with every tree -- the host tree, the remote tree, filesync's state and unison's archives --
on a real file system (``--disk-dir``, default ``/var/tmp/filesync-bench-disk``) instead of
the bench's tmpfs, at the main tree's size and at ``scale_sizes[1]`` small files.  The
remote sees the same path: the sshd containers share the host's file systems except
``/tmp``, ``/run`` and ``/root``.  Each run works in a directory of its own under
``--disk-dir``, so two runs at once do not share trees.

The initial pushes also run ``rsync --fsync`` (where the rsync has it), which flushes each
file it writes: the nearest a C tool comes to filesync's durability (filesync also flushes
each directory it renamed into), and so the floor of the disk targets.
"""

from __future__ import annotations

import contextlib
import functools
import json
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trees
from trees import EXCLUDED_DIRS

if TYPE_CHECKING:
    from run import Bench, Sample

UNISON = "unison"
FS_SYNC = "filesync sync"
RSYNC_FSYNC = "rsync --fsync"


@functools.cache
def rsync_fsyncs() -> bool:
    """Whether this rsync has ``--fsync`` (3.2.4 and later); the remote runs the same one."""
    out = subprocess.run(["rsync", "--help"], capture_output=True, text=True, check=False)
    return "--fsync" in out.stdout


def unison_available() -> bool:
    return shutil.which(UNISON) is not None


class Pair:
    """One tool's host tree and remote tree, and where its sync state lives."""

    def __init__(self, b: Bench, tool: str, host: Path, remote_spec: str, remote_host: Path,
                 state_base: Path) -> None:
        self.b, self.tool = b, tool
        self.host, self.remote_spec, self.remote_host = host, remote_spec, remote_host
        self.state_base = state_base
        self.state = state_base / "none"
        self.n = 0

    def fresh(self) -> None:
        """An empty remote and no sync state: the next run is a first sync."""
        shutil.rmtree(self.remote_host, ignore_errors=True)
        self.n += 1
        self.state = self.state_base / f"{self.tool.replace(' ', '-')}-{self.n:03d}"
        self.state.mkdir(parents=True)


def unison_argv(b: Bench, pair: Pair, server_env: str = "") -> list[str]:
    """unison between ``pair``'s trees over the bench's ssh config, the same exclusions.

    ``server_env``: ``NAME=value`` words for the remote unison (its archive dir), run
    through ``env`` as the server command.
    """
    ignores = [a for name in EXCLUDED_DIRS for a in ("-ignore", f"Name {name}")]
    server = ["-servercmd", f"env {server_env} unison"] if server_env else []
    return [UNISON, str(pair.host), f"ssh://{b.box.alias}/{pair.remote_spec}", "-batch",
            "-auto", "-times", "-confirmbigdel=false", "-ui", "text", "-sshargs",
            f"-F {shlex.quote(str(b.box.ssh_config))}", *server, *ignores]


def _env_with(b: Bench, archives: Path | None) -> dict[str, str]:
    return {**b.env, "UNISON": str(archives)} if archives else b.env


def two_way(b: Bench, key: str, label: str, fs: Pair, un: Pair, fl: Pair, *,
            reps: dict[str, int], host_archives: Path, remote_archives: str | None) -> None:
    """First sync, no-op sync, sync after edits on both sides: filesync vs unison.

    ``fl`` is the python floor's pair (``bench/floor.py sync``), timed beside both in the
    no-op and edit rounds. It sits out the first sync: a two-way floor that copies a whole
    tree is only as fast as its own pipeline, which bounds nothing.
    """
    server_env = f"UNISON={remote_archives}" if remote_archives else ""
    env = _env_with(b, host_archives)
    outs: list[dict[str, Any]] = []

    def run_fs(_r: int) -> Sample:
        s = b.run(b.fs_argv("sync", fs.host, [f"{b.box.alias}:{fs.remote_spec}"], fs.state))
        outs.append(json.loads(s.out))
        return s

    def run_un(_r: int) -> Sample:
        from run import run_cmd

        return run_cmd(unison_argv(b, un, server_env), env, [b.box], keep=b.own_children())

    def fresh_un() -> None:
        un.fresh()
        shutil.rmtree(host_archives, ignore_errors=True)
        host_archives.mkdir(parents=True)
        if remote_archives:
            shutil.rmtree(remote_archives, ignore_errors=True)
        else:
            shutil.rmtree(b.remote(".unison"), ignore_errors=True)

    def before(_r: int, tool: str) -> None:
        if tool == FS_SYNC:
            fs.fresh()
        else:
            fresh_un()

    tools: dict[str, Callable[[int], Sample]] = {FS_SYNC: run_fs, UNISON: run_un}
    runs = b.ab(f"{key} first", reps["first"], tools, before=before)
    b.record(f"{key}_first", f"First sync into an empty remote, {label}", runs, base=UNISON)
    b.verify(f"{key} first sync: remote == local (filesync sync)", fs.host, fs.remote_host)
    b.verify(f"{key} first sync: remote == local (unison)", un.host, un.remote_host)
    outs.clear()
    # The floors of the no-op and edited syncs, timed in the same rounds as both tools
    # (``run.floors``): two interpreter starts around ssh's login, and the python floor,
    # whose first run (untimed) copies the whole tree and lists it as its state.
    from run import FLOOR, STARTS

    fl.fresh()
    shutil.rmtree(fl.host, ignore_errors=True)
    subprocess.run(["cp", "-a", str(fs.host), str(fl.host)], check=True)
    floor_argv = b.floor_argv("sync", fl.remote_spec, str(fl.host), str(fl.state / "floor.json"),
                              *EXCLUDED_DIRS)
    subprocess.run(floor_argv, env=b.env, check=True, stdout=subprocess.DEVNULL)
    timed = {**tools, STARTS: lambda _r: b.run(b.floor_argv("start")),
             FLOOR: lambda _r: b.run(floor_argv)}
    runs = b.ab(f"{key} no-op", reps["noop"], timed, settle=b.cfg.settle)
    b.record(f"{key}_noop", f"No-op sync, {label}", runs, base=UNISON)
    moved = [(o.get("uploaded"), o.get("downloaded")) for o in outs]
    b.check(f"{key} no-op sync moves nothing (filesync sync)",
            all(m == (0, 0) for m in moved), str(moved))
    outs.clear()
    files = trees.kept_files(fs.host)
    edits = b.cfg.edits

    def setup(r: int) -> None:
        rels = trees.pick(files, 2 * edits, seed=4000 + r)
        trees.edit([fs.host, un.host, fl.host], rels[:edits], seed=4000 + r)
        trees.edit([fs.remote_host, un.remote_host, fl.remote_host], rels[edits:],
                   seed=5000 + r)

    runs = b.ab(f"{key} edits", reps["edit"], timed, setup, settle=b.cfg.settle)
    b.record(f"{key}_edit", f"Sync after {edits} host and {edits} remote edits, {label}", runs,
             base=UNISON)
    moved = [(o.get("uploaded"), o.get("downloaded")) for o in outs]
    b.check(f"{key} sync after edits moves exactly the edited files (filesync sync)",
            all(m == (edits, edits) for m in moved), str(moved))
    b.verify(f"{key} sync after edits: remote == local (filesync sync)", fs.host, fs.remote_host)
    b.verify(f"{key} sync after edits: remote == local (unison)", un.host, un.remote_host)
    b.verify(f"{key} sync after edits: remote == local (python floor)", fl.host, fl.remote_host)


def step_unison(b: Bench) -> None:
    """filesync ``sync`` vs unison on the main tree, everything on the bench's tmpfs."""
    pairs = {}
    for tool, tag in ((FS_SYNC, "ufs"), (UNISON, "uun")):
        host = b.host / f"main-{tag}"
        shutil.rmtree(host, ignore_errors=True)
        subprocess.run(["cp", "-a", str(b.main), str(host)], check=True)
        pairs[tool] = Pair(b, tool, host, tag, b.remote(tag), b.w / "state")
    floor = Pair(b, "floor", b.host / "main-ufl", "ufl", b.remote("ufl"), b.w / "state")
    two_way(b, "unison", "3k files (tmpfs)", pairs[FS_SYNC], pairs[UNISON], floor,
            reps={k: b.cfg.n(f"unison_{k}") for k in ("first", "noop", "edit")},
            host_archives=b.w / "unison-archives", remote_archives=None)


def one_way(b: Bench, key: str, label: str, src: Path, root: Path, *,
            reps: dict[str, int], pull: bool) -> None:
    """Initial push, no-op push and (``pull``) pull of edits: filesync vs rsync, on disk."""
    fs = Pair(b, "filesync", root / "host-fs", str(root / "remote-fs"), root / "remote-fs",
              root / "state")
    rs_host, rs_remote = root / "host-rs", root / "remote-rs"
    rsf_remote = root / "remote-rsf"
    root.mkdir(parents=True, exist_ok=True)
    for d in (fs.host, rs_host):
        shutil.rmtree(d, ignore_errors=True)
        subprocess.run(["cp", "-a", str(src), str(d)], check=True)

    def run_fs(kind: str) -> Sample:
        return b.run(b.fs_argv(kind, fs.host, [f"{b.box.alias}:{fs.remote_spec}"], fs.state))

    def rsync_push(_r: int) -> Sample:
        return b.run(b.rsync_argv(f"{rs_host}/", f"{b.box.alias}:{rs_remote}/"))

    def rsync_fsync_push(_r: int) -> Sample:
        argv = b.rsync_argv(f"{rs_host}/", f"{b.box.alias}:{rsf_remote}/")
        return b.run([argv[0], "--fsync", *argv[1:]])

    def before(_r: int, tool: str) -> None:
        if tool == "filesync":
            fs.fresh()
        else:
            shutil.rmtree(rsf_remote if tool == RSYNC_FSYNC else rs_remote, ignore_errors=True)

    initial: dict[str, Callable[[int], Sample]] = {
        "filesync": lambda r: run_fs("push"), "rsync": rsync_push}
    if rsync_fsyncs():
        initial[RSYNC_FSYNC] = rsync_fsync_push
    runs = b.ab(f"{key} init", reps["initial"], initial, before=before)
    b.record(f"{key}_initial", f"Initial push, {label}", runs, base="rsync")
    b.verify(f"{key} initial push: remote == local (filesync)", fs.host, fs.remote_host)
    b.verify(f"{key} initial push: remote == local (rsync)", rs_host, rs_remote)
    if RSYNC_FSYNC in initial:
        b.verify(f"{key} initial push: remote == local ({RSYNC_FSYNC})", rs_host, rsf_remote)
        shutil.rmtree(rsf_remote, ignore_errors=True)
    runs = b.ab(f"{key} no-op", reps["noop"], {
        "filesync": lambda r: run_fs("push"), "rsync": rsync_push})
    b.record(f"{key}_noop", f"No-op push, {label}", runs, base="rsync")
    if not pull:
        return
    files = trees.kept_files(fs.host)

    def setup(r: int) -> None:
        trees.edit([fs.remote_host, rs_remote], trees.pick(files, b.cfg.edits, seed=6000 + r),
                   seed=6000 + r)

    runs = b.ab(f"{key} pull", reps["pull"], {
        "filesync": lambda r: run_fs("pull"),
        "rsync": lambda r: b.run(b.rsync_argv(f"{b.box.alias}:{rs_remote}/", f"{rs_host}/")),
    }, setup, settle=b.cfg.settle)
    b.record(f"{key}_pull", f"Pull of {b.cfg.edits} remote edits, {label}", runs, base="rsync")
    b.verify(f"{key} pull: local == remote (filesync)", fs.host, fs.remote_host)


def step_disk(b: Bench, disk: Path) -> None:
    """The rsync and unison comparisons with every tree on ``disk`` (a real file system)."""
    made = not disk.exists()
    disk.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="bench-", dir=disk))
    try:
        main = root / "src-main"
        subprocess.run(["cp", "-a", str(b.main), str(main)], check=True)
        n = {k: b.cfg.n(f"disk_{k}") for k in ("initial", "noop", "pull")}
        one_way(b, "disk_3k", "3k files (disk)", main, root / "rs3k", reps=n, pull=True)
        if unison_available():
            pairs = {}
            for tool, tag in ((FS_SYNC, "ufs"), (UNISON, "uun")):
                host = root / f"u-host-{tag}"
                subprocess.run(["cp", "-a", str(main), str(host)], check=True)
                pairs[tool] = Pair(b, tool, host, str(root / f"u-remote-{tag}"),
                                   root / f"u-remote-{tag}", root / "state")
            floor = Pair(b, "floor", root / "u-host-ufl", str(root / "u-remote-ufl"),
                         root / "u-remote-ufl", root / "state")
            two_way(b, "disk_unison", "3k files (disk)", pairs[FS_SYNC], pairs[UNISON], floor,
                    reps={k: b.cfg.n(f"disk_unison_{k}") for k in ("first", "noop", "edit")},
                    host_archives=root / "unison-host",
                    remote_archives=str(root / "unison-remote"))
        big = b.cfg.scale_sizes[1]
        label = b._k(big)
        small = root / f"src-small-{label}"
        trees.make_small_tree(small, big)
        n = {k: b.cfg.n(f"disk_{label}_{k}") for k in ("initial", "noop")}
        one_way(b, f"disk_{label}", f"{label} small files (disk)", small, root / f"rs{label}",
                reps=n, pull=False)
    finally:
        # never kept (not even with --keep): it is outside the work dir, on a real disk
        shutil.rmtree(root, ignore_errors=True)
        if made:
            with contextlib.suppress(OSError):
                disk.rmdir()  # only if nothing else is in it (another run's dir, say)
