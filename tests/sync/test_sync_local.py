"""Push, pull, sync, status, resolve and undo through the local transport.

The local transport runs the same remote helper over stdin/stdout as SSH does, so
these tests exercise the whole engine and protocol end to end.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from gitoracle import GitOracle
from synctree import Pair, junk_tree, skills_tree, snapshot, write

# docs/json.md: the counters and lists of before, with schema, files, pruned, pairs
# (per-pair reports) and remotes (per-pair counters) added.
JSON_KEYS = {"uploaded", "downloaded", "deleted_local", "deleted_remote", "conflicts",
             "excluded", "skipped", "bytes_sent", "bytes_received", "seconds",
             "schema", "files", "pruned", "pairs", "remotes"}


@pytest.fixture
def pair(tmp_path: Path) -> Pair:
    local = tmp_path / "host" / "skills"
    skills_tree(local)
    return Pair(local, tmp_path / "remote" / "skills", tmp_path / "state")


def test_push_copies_content_keeps_modes_and_prunes_excluded(pair: Pair) -> None:
    write(pair.local / "pdf" / "node_modules" / "x.js", "junk")
    write(pair.local / ".git" / "HEAD", "ref")
    report = pair.ok("push")
    assert set(report) == JSON_KEYS
    remote = snapshot(pair.remote)
    local = snapshot(pair.local)
    expected = {p: b for p, b in local.items()
                if not p.startswith((".hub/", ".git/")) and "node_modules" not in p}
    assert remote == expected
    assert report["uploaded"] == len(expected)
    assert report["excluded"] >= 3
    script = pair.remote / "pdf" / "scripts" / "extract.py"
    assert script.stat().st_mode & 0o777 == 0o755
    src = pair.local / "pdf" / "SKILL.md"
    assert (pair.remote / "pdf" / "SKILL.md").stat().st_mtime_ns == src.stat().st_mtime_ns


def test_noop_push_transfers_nothing(pair: Pair) -> None:
    pair.ok("push")
    report = pair.ok("push")
    assert (report["uploaded"], report["downloaded"], report["conflicts"]) == (0, 0, [])


def test_reported_bug_bookkeeping_never_comes_back(pair: Pair) -> None:
    """The sync-back bug: remote .hub, .curator_backups and node_modules stay remote."""
    pair.ok("push")
    host_lock = (pair.local / ".hub" / "lock.json").read_bytes()
    junk = junk_tree(pair.remote, curator_mb=12)
    write(pair.remote / "pdf" / "SKILL.md", "# pdf\nedited remotely\n")
    write(pair.remote / "newskill" / "SKILL.md", "# new\n")
    write(pair.remote / "newskill" / "scripts" / "run.sh", "echo hi\n", 0o755)
    before = snapshot(pair.local)
    report = pair.ok("pull")
    after = snapshot(pair.local)
    changed = {p for p in after if before.get(p) != after[p]}
    assert changed == {"pdf/SKILL.md", "newskill/SKILL.md", "newskill/scripts/run.sh"}
    assert (pair.local / ".hub" / "lock.json").read_bytes() == host_lock
    assert not (pair.local / ".curator_backups").exists()
    assert not (pair.local / "pdf" / "node_modules").exists()
    assert report["downloaded"] == 3
    # None of the excluded bytes crossed: everything received is far below the junk.
    assert report["bytes_received"] < 64 * 1024 < junk
    assert (pair.local / "newskill" / "scripts" / "run.sh").stat().st_mode & 0o111


def test_pull_keeps_host_on_conflict_and_saves_remote(pair: Pair) -> None:
    pair.ok("push")
    write(pair.local / "web" / "SKILL.md", "host edit\n")
    write(pair.remote / "web" / "SKILL.md", "remote edit\n")
    report = pair.ok("pull")
    assert (pair.local / "web" / "SKILL.md").read_text() == "host edit\n"
    [conflict] = report["conflicts"]
    assert conflict["path"] == "web/SKILL.md"
    saved = Path(conflict["saved_to"])
    assert saved.is_absolute() and saved.read_text() == "remote edit\n"
    assert (pair.remote / "web" / "SKILL.md").read_text() == "remote edit\n"


def test_push_saves_remote_version_before_overwriting(pair: Pair) -> None:
    pair.ok("push")
    write(pair.local / "web" / "SKILL.md", "host edit\n")
    write(pair.remote / "web" / "SKILL.md", "remote edit\n")
    report = pair.ok("push")
    assert (pair.remote / "web" / "SKILL.md").read_text() == "host edit\n"
    [conflict] = report["conflicts"]
    assert Path(conflict["saved_to"]).read_text() == "remote edit\n"


def test_push_overwrites_remote_only_edit_but_saves_it(pair: Pair) -> None:
    pair.ok("push")
    write(pair.remote / "web" / "SKILL.md", "remote only edit\n")
    report = pair.ok("push")
    assert (pair.remote / "web" / "SKILL.md").read_bytes() == (
        pair.local / "web" / "SKILL.md").read_bytes()
    assert Path(report["conflicts"][0]["saved_to"]).read_text() == "remote only edit\n"


def test_sync_leaves_conflicts_then_resolve(pair: Pair) -> None:
    pair.ok("push")
    write(pair.local / "web" / "SKILL.md", "host edit\n")
    write(pair.remote / "web" / "SKILL.md", "remote edit\n")
    write(pair.local / "pdf" / "SKILL.md", "host only edit\n")
    write(pair.remote / "pdf" / "references" / "api.md", "remote only edit\n")
    report = pair.ok("sync")
    assert [c["path"] for c in report["conflicts"]] == ["web/SKILL.md"]
    assert (pair.local / "web" / "SKILL.md").read_text() == "host edit\n"
    assert (pair.remote / "web" / "SKILL.md").read_text() == "remote edit\n"
    assert (pair.remote / "pdf" / "SKILL.md").read_text() == "host only edit\n"
    assert (pair.local / "pdf" / "references" / "api.md").read_text() == "remote only edit\n"
    status = pair.ok("status")
    assert status["open_conflicts"] == ["web/SKILL.md"]
    pair.ok("resolve", "web/SKILL.md", "--keep", "remote")
    assert (pair.local / "web" / "SKILL.md").read_text() == "remote edit\n"
    assert pair.ok("status")["open_conflicts"] == []
    assert pair.ok("status")["plan"] == []


def test_resolve_keep_local_uploads(pair: Pair) -> None:
    pair.ok("push")
    write(pair.local / "web" / "SKILL.md", "host edit\n")
    write(pair.remote / "web" / "SKILL.md", "remote edit\n")
    pair.ok("sync")
    pair.ok("resolve", "web/SKILL.md", "--keep", "local")
    assert (pair.remote / "web" / "SKILL.md").read_text() == "host edit\n"
    assert pair.ok("status")["open_conflicts"] == []


def test_resolve_of_a_path_not_in_conflict_fails_cleanly(pair: Pair) -> None:
    pair.ok("push")
    code, report = pair.run("resolve", "web/SKILL.md", "--keep", "local")
    assert code == 1
    assert "not in conflict" in report["error"]
    assert "Traceback" not in pair.stderr


def test_same_content_on_both_sides_is_no_conflict(pair: Pair) -> None:
    pair.ok("push")
    write(pair.local / "web" / "SKILL.md", "same\n")
    write(pair.remote / "web" / "SKILL.md", "same\n")
    report = pair.ok("sync")
    assert report["conflicts"] == [] and report["uploaded"] == report["downloaded"] == 0
    assert pair.ok("status")["plan"] == []


def test_no_ancestor_and_differing_sides_is_a_conflict_never_a_deletion(pair: Pair) -> None:
    write(pair.remote / "web" / "SKILL.md", "pre-existing remote\n")
    write(pair.remote / "only-remote.txt", "keep me\n")
    report = pair.ok("sync")
    assert [c["path"] for c in report["conflicts"]] == ["web/SKILL.md"]
    assert report["deleted_local"] == report["deleted_remote"] == 0
    assert (pair.local / "only-remote.txt").read_text() == "keep me\n"


def test_push_never_deletes_remote_only_files(pair: Pair) -> None:
    pair.ok("push")
    write(pair.remote / "agent-output.txt", "made remotely\n")
    report = pair.ok("push")
    assert (pair.remote / "agent-output.txt").exists()
    assert report["deleted_remote"] == 0


def test_deletions_propagate_only_from_an_unchanged_other_side(pair: Pair) -> None:
    pair.ok("push")
    (pair.local / "web" / "SKILL.md").unlink()
    report = pair.ok("push")
    assert report["deleted_remote"] == 1 and not (pair.remote / "web" / "SKILL.md").exists()
    (pair.remote / "pdf" / "references" / "api.md").unlink()
    report = pair.ok("pull")
    assert report["deleted_local"] == 1
    assert not (pair.local / "pdf" / "references" / "api.md").exists()


def test_delete_against_modify_keeps_the_modification(pair: Pair) -> None:
    pair.ok("push")
    (pair.local / "web" / "SKILL.md").unlink()
    write(pair.remote / "web" / "SKILL.md", "modified remotely\n")
    report = pair.ok("sync")
    assert (pair.local / "web" / "SKILL.md").read_text() == "modified remotely\n"
    assert report["deleted_remote"] == 0


def test_pull_deletes_are_kept_for_undo(pair: Pair) -> None:
    pair.ok("push")
    write(pair.remote / "pdf" / "SKILL.md", "pulled\n")
    (pair.remote / "web" / "SKILL.md").unlink()
    write(pair.remote / "brand-new.txt", "new\n")
    before = snapshot(pair.local)
    pair.ok("pull")
    assert (pair.local / "pdf" / "SKILL.md").read_text() == "pulled\n"
    code, _ = pair.run("undo")
    assert code == 0
    assert snapshot(pair.local) == before


def test_undo_never_overwrites_an_edit_made_after_the_pull(pair: Pair) -> None:
    pair.ok("push")
    write(pair.remote / "pdf" / "SKILL.md", "pulled\n")
    pair.ok("pull")
    write(pair.local / "pdf" / "SKILL.md", "edited after pull\n")
    pair.run("undo")
    assert (pair.local / "pdf" / "SKILL.md").read_text() == "edited after pull\n"


def test_undo_with_nothing_to_undo_is_one_clean_line(pair: Pair) -> None:
    code, _ = pair.run("undo")
    assert code == 1
    assert pair.stderr.count("\n") == 1 and "nothing to undo" in pair.stderr


def test_guard_refuses_pull_from_an_emptied_remote(pair: Pair) -> None:
    pair.ok("push")
    for p in sorted(pair.remote.rglob("*"), reverse=True):
        p.unlink() if p.is_file() else p.rmdir()
    before = snapshot(pair.local)
    code, report = pair.run("pull")
    assert code == 3 and "empty" in report["error"]
    assert snapshot(pair.local) == before
    assert pair.run("sync")[0] == 3
    assert pair.run("pull", "--force")[0] == 0


def test_guard_refuses_push_from_an_emptied_local_root(pair: Pair) -> None:
    pair.ok("push")
    before = snapshot(pair.remote)
    for p in sorted(pair.local.rglob("*"), reverse=True):
        p.unlink() if p.is_file() else p.rmdir()
    code, report = pair.run("push")
    assert code == 3 and "--force" in report["error"]
    assert snapshot(pair.remote) == before


def test_guard_refuses_mass_deletion_without_force(pair: Pair) -> None:
    for i in range(40):
        write(pair.local / "bulk" / f"f{i}.txt", f"{i}\n")
    pair.ok("push")
    for i in range(30):
        (pair.local / "bulk" / f"f{i}.txt").unlink()
    before = snapshot(pair.remote)
    code, report = pair.run("push")
    assert code == 3 and "would delete 30" in report["error"]
    assert snapshot(pair.remote) == before
    report = pair.ok("push", "--force")
    assert report["deleted_remote"] == 30


def test_dry_run_changes_nothing(pair: Pair) -> None:
    report = pair.ok("push", "--dry-run")
    assert not pair.remote.exists() or snapshot(pair.remote) == {}
    assert {row["action"] for row in report["plan"]} == {"upload"}


def test_racy_timestamp_same_size_rewrite_is_detected(pair: Pair) -> None:
    target = pair.local / "web" / "SKILL.md"
    pair.ok("push")
    st = target.stat()
    # Same size, same mtime, same inode: only the racy-timestamp rule can catch it.
    with open(target, "r+b") as f:
        f.write(b"# WEB\n")
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    report = pair.ok("push")
    assert report["uploaded"] == 1
    assert (pair.remote / "web" / "SKILL.md").read_bytes() == b"# WEB\n"


def test_stat_cache_avoids_rereading_old_files(pair: Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    old = time.time_ns() - 3600 * 10**9
    for p in pair.local.rglob("*"):
        if p.is_file():
            os.utime(p, ns=(old, old))
    pair.ok("push")
    import filesync.host.scan as scan

    calls: list[str] = []
    real = scan.hash_file
    monkeypatch.setattr(scan, "hash_file", lambda p, dir_fd=None: calls.append(str(p)) or real(p))
    write(pair.local / "web" / "SKILL.md", "changed\n")
    pair.ok("push")
    assert [Path(c).name for c in calls] == ["SKILL.md"]


def test_symlinks_are_skipped_and_never_followed(pair: Pair, tmp_path: Path) -> None:
    outside = write(tmp_path / "outside" / "secret.txt", "secret\n")
    os.symlink(outside, pair.local / "link-to-secret")
    os.symlink(outside.parent, pair.local / "link-to-dir")
    report = pair.ok("push")
    reasons = {s["path"]: s["reason"] for s in report["skipped"]}
    assert "symlink" in reasons["link-to-secret"] and "symlink" in reasons["link-to-dir"]
    assert not (pair.remote / "link-to-secret").exists()
    assert not (pair.remote / "link-to-dir").exists()


def test_pull_never_writes_through_a_symlinked_host_dir(pair: Pair, tmp_path: Path) -> None:
    pair.ok("push")
    outside = tmp_path / "outside"
    outside.mkdir()
    write(pair.remote / "evil" / "payload.txt", "payload\n")
    os.symlink(outside, pair.local / "evil")
    report = pair.ok("pull")
    assert list(outside.iterdir()) == []
    assert any(s["path"] == "evil/payload.txt" for s in report["skipped"]) or report[
        "conflicts"]


def test_exclude_options_and_filesyncignore(pair: Pair) -> None:
    write(pair.local / "big.log", "log\n")
    write(pair.local / "cache" / "x.bin", "bin\n")
    write(pair.local / ".filesyncignore", "cache/\n# comment\n")
    write(pair.local / "node_modules" / "kept.js", "js\n")
    pair.ok("push", "--exclude", "*.log", "--no-default-excludes")
    remote = snapshot(pair.remote)
    assert "big.log" not in remote and "cache/x.bin" not in remote
    assert "node_modules/kept.js" in remote and ".hub/lock.json" in remote


def test_usage_errors_are_one_line_with_exit_2(pair: Pair, tmp_path: Path) -> None:
    code, report = pair.run("push", "--max-file-size", "lots")
    assert code == 2 and "size" in report["error"]
    afile = write(tmp_path / "elsewhere" / "afile", "x")
    write(pair.remote / "theirs.txt", "remote\n")
    # A file LOCAL is a single-file mapping: a REMOTE that is a directory must say so.
    code, report = Pair(afile, pair.remote, pair.state).run("push")
    assert code == 2 and "is a directory" in report["error"]
    assert "Traceback" not in pair.stderr


def test_remote_root_that_is_a_file_fails_cleanly(pair: Pair, tmp_path: Path) -> None:
    afile = write(tmp_path / "remote-file", "x")
    code, report = pair.run("push", remote=str(afile))
    assert code == 1 and "not a directory" in report["error"]


def test_second_concurrent_run_fails_fast(pair: Pair) -> None:
    from filesync.host.state import PairState

    pair.ok("push")
    [pair_dir] = (pair.state / "pairs").iterdir()
    import json as _json

    info = _json.loads((pair_dir / "pair.json").read_text())
    holder = PairState.open(pair.state, info["local"], info["remote"], info["remote_root"])
    try:
        code, report = pair.run("push")
        assert code == 1 and "--lock-timeout" in report["error"]
    finally:
        holder.close()
    assert pair.run("push")[0] == 0


def test_state_survives_between_processes(pair: Pair) -> None:
    pair.ok("push")
    # A fresh run (new process state) must not re-upload: state lives in SQLite.
    assert pair.ok("push")["uploaded"] == 0
    db = next((pair.state / "pairs").iterdir()) / "state.db"
    assert db.exists() and db.stat().st_size > 0


def test_a_fifo_swapped_in_after_the_scan_is_never_opened(tmp_path: Path) -> None:
    from filesync.host.scan import HashingReader, hash_file

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="not a regular file"):
        hash_file(fifo)
    with pytest.raises(OSError, match="not a regular file"):
        list(HashingReader(fifo)())


def test_overall_deadline_stops_a_hanging_remote_cleanly(pair: Pair, tmp_path: Path) -> None:
    # A "remote shell" that accepts the connection and then never answers.
    code, report = pair.run("push", "--timeout", "1", "--via", "sh -c 'sleep 30' --")
    assert code == 1 and "--timeout 1" in report["error"]
    assert not pair.remote.exists()


def test_a_remote_dir_turned_symlink_deletes_nothing_on_the_host(pair: Pair) -> None:
    pair.ok("push")
    elsewhere = pair.remote.parent / "elsewhere"
    (pair.remote / "pdf").rename(elsewhere)
    os.symlink(elsewhere, pair.remote / "pdf")
    report = pair.ok("pull")
    assert report["deleted_local"] == 0
    assert (pair.local / "pdf" / "SKILL.md").exists()
    assert any(s["path"] == "pdf" and "symlink" in s["reason"] for s in report["skipped"])


def test_a_local_dir_turned_symlink_deletes_nothing_on_the_remote(
    pair: Pair, tmp_path: Path
) -> None:
    pair.ok("push")
    moved = tmp_path / "moved-pdf"
    (pair.local / "pdf").rename(moved)
    os.symlink(moved, pair.local / "pdf")
    report = pair.ok("push")
    assert report["deleted_remote"] == 0
    assert (pair.remote / "pdf" / "SKILL.md").exists()


#: The issue's three examples and git's corner cases, as a Windows editor saves them (CRLF).
GIT_LINES = ["*.log.d", "!keep", "**/sub/", "!ü.md", "b/", "# a comment", "*.tmp  ",
             "!/pdf/keep.tmp", "[[:upper:]]*.md", "x/a**/b", "?.md"]


def test_push_uploads_exactly_what_git_keeps(pair: Pair, tmp_path: Path) -> None:
    """Same lines in .filesyncignore and .gitignore: the push uploads git's untracked set."""
    for rel in ["keep/x.log.d/f", "keep/g", "x.log/ü.md/sub/b", "x.log/ü.md/c",
                "ü.md/b/a/a", "ü.md/c", "pdf/a.tmp", "pdf/keep.tmp", "x/ab", "x/ay/z/b",
                "x/ayb", "a.md", "ä.md"]:
        write(pair.local / rel, rel)
    text = "".join(line + "\r\n" for line in GIT_LINES)
    write(pair.local / ".filesyncignore", text)
    write(pair.local / ".gitignore", text)
    report = pair.ok("push", "--no-default-excludes")
    kept = GitOracle(tmp_path / "git").kept_files(pair.local) | {".gitignore"}
    assert {"keep/x.log.d/f", "x.log/ü.md/sub/b", "ü.md/b/a/a", "pdf/SKILL.md"}.isdisjoint(kept)
    assert {"keep/g", "pdf/keep.tmp", "x/ayb", "ä.md", ".hub/lock.json"} <= kept
    assert set(snapshot(pair.remote)) == kept
    assert report["uploaded"] == len(kept)
