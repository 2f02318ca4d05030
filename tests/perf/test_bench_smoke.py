"""The benchmark in --smoke mode: it runs end to end and filesync's transfers are right.

Runs ``bench/run.py --smoke`` (tiny trees, one repetition, steps initial/no-op/edit/pull/
warm/fan-out/unison/disk against real namespaced OpenSSH sshd containers) and checks the
structure of its result JSON and that every correctness check inside the bench passed --
then compares the trees it left behind itself.  No timing is asserted: figures from a CI
machine mean nothing.  Needs root and namespaces like the sshd tests; under CI (``CI`` set)
a missing capability fails instead of skipping.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))

import peers  # noqa: E402
import sshd  # noqa: E402
import trees  # noqa: E402

AGENT = "filesync --persist"  # the CLI through the opt-in agent, measured next to it
ASYNC = "filesync --ssh-client asyncssh"  # the plain CLI over the other SSH client

pytestmark = [pytest.mark.sshd, pytest.mark.timeout(900)]

SMOKE_STEPS = ("initial", "noop", "edit", "pull", "warm_noop", "warm_pull", "fanout",
               "unison_first", "unison_noop", "unison_edit", "disk_3k_initial", "disk_3k_noop",
               "disk_3k_pull", "disk_unison_first", "disk_unison_noop", "disk_unison_edit",
               "disk_2k_initial", "disk_2k_noop")


def _require() -> None:
    ok, why = sshd.sshd_available()
    missing = [t for t in ("rsync", "ssh", "tar", "unison") if shutil.which(t) is None]
    if ok and not missing:
        return
    reason = why or f"missing tools: {', '.join(missing)}"
    if os.environ.get("CI"):
        pytest.fail(f"bench smoke test cannot run in CI: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    _require()
    base = tmp_path_factory.mktemp("bench")
    work, out = base / "work", base / "result.json"
    # The disk step's trees: on a real file system the containers see (not under /tmp).
    disk = Path("/var/tmp") / f"filesync-bench-smoke-{os.getpid()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SSH_")}
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "run.py"), "--smoke", "--no-tmpfs", "--keep",
         "--workdir", str(work), "--out", str(out), "--no-docs",
         "--disk-dir", str(disk)],
        capture_output=True, text=True, timeout=870, env=env, check=False,
    )
    assert out.exists(), f"no result JSON\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    # the disk step worked in a dir of its own under --disk-dir, and removed both
    assert not disk.exists()
    result = json.loads(out.read_text())
    assert proc.returncode == 0, (
        f"bench exited {proc.returncode}; errors {result.get('errors')}; failed checks "
        f"{[c for c in result.get('checks', []) if not c['ok']]}\n{proc.stderr[-3000:]}"
    )
    return result, work


def test_result_has_every_smoke_step_with_medians_and_ratios(
    smoke: tuple[dict[str, Any], Path],
) -> None:
    result, _ = smoke
    assert result["meta"]["smoke"] is True
    assert not result["errors"]
    for key in SMOKE_STEPS:
        step = result["steps"][key]
        assert step["reps"] == 1
        assert step["runs"].keys() == step["median"].keys()
        for tool, runs in step["runs"].items():
            assert len(runs) == 1, tool
            assert runs[0]["rc"] == 0, tool
            assert runs[0]["wall"] > 0, tool
            assert {"wall", "min_wall", "cpu", "remote_cpu", "maxrss_mib", "wire"} <= set(
                step["median"][tool])
        assert step["ratios"], key
        assert all(v > 0 for v in step["ratios"].values()), key
    assert set(result["steps"]["initial"]["runs"]) == {"filesync", AGENT, ASYNC, "rsync", "tar"}
    assert set(result["steps"]["pull"]["runs"]) == {"filesync", AGENT, ASYNC, "rsync",
                                                    "old sync-back", "python floor"}
    assert {"filesync/old sync-back", f"{AGENT}/old sync-back", f"{AGENT}/rsync"} <= set(
        result["steps"]["pull"]["ratios"])
    fan = result["steps"]["fanout"]["ratios"]
    assert set(fan) == {"filesync 2 hosts/filesync 1 host", f"{AGENT} 2 hosts/{AGENT} 1 host"}
    # the agent's own CPU is counted into its runs, not left out
    assert all(r["cpu"] > 0 for r in result["steps"]["initial"]["runs"][AGENT])
    assert result["steps"]["fanout"]["hosts"] == 2
    # the floors are timed beside the tools
    assert {"ssh HOST true", "CPython, ssh, CPython"} <= set(result["steps"]["noop"]["runs"])
    assert {"ssh cat 2 hosts", "ssh cat 1 host"} <= set(result["steps"]["fanout"]["runs"])
    # the peers people would pick instead: unison beside filesync sync, on tmpfs and on disk
    # (the no-op and edited syncs time their floors, the interpreter starts and the python
    # two-way floor, in their rounds)
    for key in ("unison_first", "disk_unison_first"):
        assert set(result["steps"][key]["runs"]) == {"filesync sync", "unison"}, key
        assert set(result["steps"][key]["ratios"]) == {"filesync sync/unison"}, key
    for key in ("unison_noop", "unison_edit", "disk_unison_noop", "disk_unison_edit"):
        assert set(result["steps"][key]["runs"]) == {"filesync sync", "unison",
                                                     "CPython, ssh, CPython",
                                                     "python floor"}, key
        assert set(result["steps"][key]["ratios"]) == {"filesync sync/unison",
                                                       "CPython, ssh, CPython/unison",
                                                       "python floor/unison"}, key
    # the initial pushes on disk also run rsync --fsync, the floor of durable writes in C
    fsyncs = {"rsync --fsync"} if peers.rsync_fsyncs() else set()
    for key in ("disk_3k_initial", "disk_2k_initial"):
        assert set(result["steps"][key]["runs"]) == {"filesync", "rsync", *fsyncs}, key
    for key in ("disk_3k_noop", "disk_3k_pull", "disk_2k_noop"):
        assert set(result["steps"][key]["runs"]) == {"filesync", "rsync"}, key


def test_targets_are_evaluated_or_marked_not_run(smoke: tuple[dict[str, Any], Path]) -> None:
    result, _ = smoke
    targets = {t["name"]: t for t in result["targets"]}
    assert len(targets) >= 22
    # issue 21's: against unison and on disk, judged from this run
    for name in ("no-op sync vs unison, 3k files", "sync after 10 + 10 edits vs unison, 3k files",
                 "first sync vs unison, 3k files", "disk: initial push vs rsync, 3k files",
                 "disk: initial push vs rsync, 2k files", "tmpfs: no-op push vs rsync, 3k files",
                 "tmpfs: pull of 10 edits vs rsync, 3k files"):
        assert targets[name]["met"] in (True, False), name
    # the OpenSSH-transport issue's targets, over both clients where the step runs both
    for name in ("cold initial push", "cold no-op push", "cold pull of 10 remote edits"):
        assert targets[name]["met"] in (True, False), name
        assert targets[f"{name} [asyncssh]"]["met"] in (True, False), name
    for name in ("--persist no-op push", "2-host fan-out, client CPU vs 1 host"):
        assert targets[name]["met"] in (True, False), name
    # steps the smoke run leaves out are reported as not run, never as met
    for name in ("1 GiB push throughput (same cipher)", "1 GiB push, client peak RSS",
                 "100k-file no-op push", "100k-file no-op push [--persist]",
                 "100k-file initial push", "100k-file initial push, client peak RSS"):
        assert targets[name]["met"] is None, name
    # floors are reported beside the targets they bound, never judged
    floors = {n: t for n, t in targets.items() if t["target"] == "floor"}
    assert {"floor of the cold initial push: `ssh HOST true` alone vs rsync",
            "floor of the cold no-op push: `ssh HOST true` alone vs rsync",
            "floor of the cold pull of 10 remote edits: `ssh HOST true` alone vs rsync",
            "floor of the cold pull of 10 remote edits: `python floor` (a stateful CPython "
            "pull, nothing durable, no host walk) vs rsync",
            "floor of the cold no-op push: `CPython, ssh, CPython` alone vs rsync",
            "floor of the cold initial push: `tar | ssh tar -x` (C, no state, no checks) "
            "vs rsync",
            "floor of the 2-host fan-out CPU ratio: one host's run plus each other host's "
            "`ssh cat` CPU",
            "floor of the no-op sync vs unison, 3k files: `CPython, ssh, CPython` alone vs "
            "unison",
            "floor of the sync after 10 + 10 edits vs unison, 3k files: `CPython, ssh, "
            "CPython` plus unison's own cost of the edits (its edited sync beyond its no-op) "
            "vs unison",
            "floor of the no-op sync vs unison, 3k files: `python floor` (a stateful CPython "
            "two-way sync, nothing durable) vs unison",
            "floor of the sync after 10 + 10 edits vs unison, 3k files: `python floor` (a "
            "stateful CPython two-way sync, nothing durable) vs unison"} <= set(floors)
    if peers.rsync_fsyncs():
        assert {f"floor of the disk initial push, {size} files: `rsync --fsync` (each file "
                "flushed, C) vs rsync" for size in ("3k", "2k")} <= set(floors)
    assert all(t["met"] is None and t["value"] > 0 for t in floors.values())


def test_every_correctness_check_in_the_bench_passed(smoke: tuple[dict[str, Any], Path]) -> None:
    result, _ = smoke
    names = [c["name"] for c in result["checks"]]
    assert any("remote == local (filesync)" in n for n in names)
    assert any("pull downloads exactly" in n for n in names)
    assert any("(unison)" in n for n in names)
    assert "unison sync after edits: remote == local (python floor)" in names
    assert any(n.startswith("disk_3k initial push: remote == local") for n in names)
    assert [c for c in result["checks"] if not c["ok"]] == []


def test_filesync_trees_left_behind_are_identical(smoke: tuple[dict[str, Any], Path]) -> None:
    _, work = smoke
    local = work / "host" / "main"
    # Indexes held by other containers (the session's sshd) leave empty box dirs behind.
    boxes = sorted((b for b in (work / "boxes").iterdir() if (b / "home" / "fan").exists()),
                   key=lambda p: int(p.name[3:]))
    assert len(boxes) == 2
    # after push, edit push, pull and warm pull the remote copy equals the host tree
    assert trees.compare_trees(local, boxes[0] / "home" / "fs") == []
    # the same through the agent, on its own pair
    assert trees.compare_trees(work / "host" / "main-agent", boxes[0] / "home" / "fsa") == []
    # fan-out reached both hosts with the whole tree
    for box in boxes:
        assert trees.compare_trees(local, box / "home" / "fan") == []
    # excluded dirs were neither pushed nor pulled back
    assert not (boxes[0] / "home" / "fs" / "node_modules").exists()
    assert not list((local / ".curator_backups").glob("junk-*"))
    assert trees.kept_files(local) and len(trees.kept_files(local)) == 62


def test_the_watch_step_measures_both_ways_idle_and_a_burst(
    smoke: tuple[dict[str, Any], Path],
) -> None:
    result, _ = smoke
    watch = result["steps"]["watch"]
    fs = watch["filesync"]
    for way in ("host_to_remote", "remote_to_host"):
        assert fs[way]["n"] == watch["edits"] and 0 < fs[way]["p50"] <= fs[way]["p95"], way
    assert fs["burst"]["wrong"] == 0 and fs["burst"]["passes"] >= 1
    for tree in ("idle_3k", "idle_big"):
        assert fs[tree]["client_cpu_pct"] >= 0 and fs[tree]["VmRSS"] > 0, tree
    # unison is the peer wherever it is installed; without it the step says so
    assert "host_to_remote" in watch["unison"] or "error" in watch["unison"]
