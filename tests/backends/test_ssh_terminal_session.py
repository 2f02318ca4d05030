"""SSHTerminal syncs through the library's session, against a real OpenSSH sshd: single-file
mappings, nested mappings owning a file, the self-sync guard, watch mode between passes,
and sync-back failures that keep the other mappings pulling."""

from __future__ import annotations

import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from synctree import snapshot, write

from filesync import Mapping, SelfSync
from filesync.backends import SSHTerminal

pytestmark = pytest.mark.sshd


@pytest.fixture
def box(sshd_factory: Callable[[int], Any]) -> Any:
    return sshd_factory(7)


def _term(box: Any, tmp_path: Path, mappings: list[Mapping]) -> SSHTerminal:
    return SSHTerminal(box.alias, ssh_config=box.ssh_config, state_dir=tmp_path / "state",
                       mappings=mappings)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# -- single-file mappings ---------------------------------------------------------------------


async def test_an_upload_only_file_is_pushed_with_its_mode_and_never_pulled(
    box: Any, tmp_path: Path,
) -> None:
    cfg = tmp_path / "cfg"
    write(cfg / "token", "secret\n", 0o600)
    write(cfg / "unrelated.txt", "stays local\n")
    remote = box.home / "cred-u"
    write(remote / "keep.txt", "remote only\n")
    async with _term(box, tmp_path, [Mapping(cfg / "token", "cred-u/token", "upload-only")]) as t:
        assert (remote / "token").read_text() == "secret\n"
        assert _mode(remote / "token") == 0o600
        assert [r.uploaded for r in t.reports] == [1]
        r = await t.run("echo changed > cred-u/token && echo new > cred-u/new.txt")
        assert r.returncode == 0
    assert snapshot(cfg) == {"token": b"secret\n", "unrelated.txt": b"stays local\n"}
    assert snapshot(remote) == {"keep.txt": b"remote only\n", "token": b"changed\n",
                                "new.txt": b"new\n"}


async def test_a_two_way_file_comes_back_and_its_neighbours_stay_put(
    box: Any, tmp_path: Path,
) -> None:
    notes = tmp_path / "notes"
    write(notes / "todo.md", "one\n", 0o640)
    write(notes / "private.md", "local neighbour\n")
    remote = box.home / "notes-r"
    write(remote / "theirs.md", "remote neighbour\n")
    async with _term(box, tmp_path, [Mapping(notes / "todo.md", "notes-r/todo.md")]) as t:
        assert _mode(remote / "todo.md") == 0o640
        r = await t.run("echo two >> notes-r/todo.md && echo x > notes-r/fresh.md "
                        "&& rm notes-r/theirs.md")
        assert r.returncode == 0
    assert snapshot(notes) == {"todo.md": b"one\ntwo\n", "private.md": b"local neighbour\n"}
    assert snapshot(remote) == {"todo.md": b"one\ntwo\n", "fresh.md": b"x\n"}
    assert [r.downloaded for r in t.reports] == [0, 1]  # the setup push, the teardown pull


# -- nested mappings --------------------------------------------------------------------------


async def test_an_inner_credential_file_is_never_pulled_into_the_outer_tree(
    box: Any, tmp_path: Path,
) -> None:
    outer, creds = tmp_path / "outer", tmp_path / "creds"
    write(outer / "o.txt", "outer\n")
    write(creds / "token", "secret\n", 0o600)
    mappings = [Mapping(outer, "nest-f"), Mapping(creds / "token", "nest-f/token", "upload-only")]
    async with _term(box, tmp_path, mappings) as t:
        assert (box.home / "nest-f" / "token").read_text() == "secret\n"
        assert (await t.run("echo leaked > nest-f/token; echo r > nest-f/r.txt")).returncode == 0
    # The inner mapping owns nest-f/token: the outer two-way pull leaves it on the remote.
    assert snapshot(outer) == {"o.txt": b"outer\n", "r.txt": b"r\n"}
    assert snapshot(creds) == {"token": b"secret\n"}


# -- the self-sync guard ----------------------------------------------------------------------


@pytest.mark.parametrize("remote", ["same", "wrap"], ids=["is-local", "contains-local"])
async def test_a_remote_root_that_is_the_local_tree_is_refused_at_setup_when_asked(
    box: Any, tmp_path: Path, remote: str,
) -> None:
    # The container's /root is box.home on this machine: the same tree reached twice.
    local = box.home / "same" if remote == "same" else box.home / "wrap" / "in"
    write(local / "a.txt", "a\n")
    before = _without_helper_cache(snapshot(box.home))
    term = SSHTerminal(box.alias, ssh_config=box.ssh_config, state_dir=tmp_path / "state",
                       mappings=[Mapping(local, remote)], on_self_sync="raise")
    with pytest.raises(SelfSync) as caught:
        async with term:
            raise AssertionError("the block must not run")
    assert "same tree" in str(caught.value) and "\n" not in str(caught.value)
    # nothing pushed, no check file left behind
    assert _without_helper_cache(snapshot(box.home)) == before


def _without_helper_cache(files: dict[str, bytes]) -> dict[str, bytes]:
    """The helper's compiled code, kept in the remote home (docs/ssh.md), is the one
    file a helper start may leave there."""
    return {k: v for k, v in files.items() if not k.startswith(".cache/filesync/helper-")}


async def test_a_loopback_target_keeps_the_terminal_working_with_sync_off(
    box: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    # A user pointing the terminal at its own home (127.0.0.1 from cron): by default
    # sync turns off with one warning, and commands run.
    local = box.home / "loop"
    write(local / "a.txt", "a\n")
    mappings = [Mapping(local, "loop"), Mapping(local / "a.txt", "loop-a.txt", "upload-only")]
    before = _without_helper_cache(snapshot(box.home))
    caplog.set_level("WARNING", logger="filesync.backends")
    async with SSHTerminal(box.alias, ssh_config=box.ssh_config, state_dir=tmp_path / "state",
                           mappings=mappings, sync_before_run=True, sync_interval=0.0) as t:
        assert not t.sync_enabled
        r = await t.run("echo remote > loop/b.txt && echo ok")
        assert (r.returncode, r.stdout) == (0, "ok\n")
        assert (await (await t.spawn("cat loop/a.txt")).wait()).stdout.endswith("a\n")
    warnings = [r for r in caplog.records if "sync is off" in r.getMessage()]
    assert len(warnings) == 1 and "same tree" in warnings[0].getMessage()
    assert t.reports == [] and t.sync_back_errors == []
    assert _without_helper_cache(snapshot(box.home)) == {**before, "loop/b.txt": b"remote\n"}


# -- watch mode -------------------------------------------------------------------------------


def _inotify_watches(box: Any) -> int:
    """inotify watches held by every process of the container."""
    done = box.run_inside("cat /proc/[0-9]*/fdinfo/* 2>/dev/null | grep -c '^inotify wd:'")
    return int(done.stdout.strip() or "0")


async def test_the_remote_helper_keeps_the_trees_watched_between_passes(
    box: Any, tmp_path: Path,
) -> None:
    tree = tmp_path / "tree"
    for d in ("a", "b", "a/c"):
        write(tree / d / "f.txt", f"{d}\n")
    before = _inotify_watches(box)
    async with SSHTerminal(box.alias, ssh_config=box.ssh_config, state_dir=tmp_path / "state",
                           mappings=[Mapping(tree, "watched")], sync_before_run=True,
                           sync_interval=0.0) as t:
        # The setup push made the remote root; the push before this command lists it
        # with its three directories, and the helper keeps all four watched after it.
        assert (await t.run("echo remote > watched/a/c/g.txt")).returncode == 0
        assert _inotify_watches(box) >= before + 4
    assert (tree / "a" / "c" / "g.txt").read_text() == "remote\n"


# -- sync-back failures -----------------------------------------------------------------------


async def test_a_failed_sync_back_is_kept_and_the_other_mappings_still_pull(
    box: Any, tmp_path: Path,
) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    write(first / "f.txt", "first\n")
    write(second / "s.txt", "second\n")
    term = _term(box, tmp_path, [Mapping(first, "fail-1"), Mapping(second, "fail-2")])
    async with term as t:
        # The guard refuses to pull an emptied root; the second mapping is pulled anyway.
        assert (await t.run("rm -rf fail-1 && echo edit > fail-2/s.txt")).returncode == 0
    assert len(term.sync_back_errors) == 1 and "empty" in str(term.sync_back_errors[0])
    assert snapshot(first) == {"f.txt": b"first\n"}
    assert snapshot(second) == {"s.txt": b"edit\n"}
    assert [r.downloaded for r in term.reports] == [0, 0, 1]


# -- pushes before commands -------------------------------------------------------------------


async def test_a_failed_push_before_a_command_is_logged_and_retried_at_the_next_one(
    box: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    # (The interval rule itself is the shared policy's, tested with an injected clock in
    # test_backend_sync.py: a failed push is retried before the interval has passed.)
    vault = tmp_path / "vault"
    write(vault / "v1.json", "v1\n", 0o600)
    link = tmp_path / "gh.json"
    link.symlink_to(vault / "v1.json")
    caplog.set_level("WARNING", logger="filesync.backends.sync")
    async with SSHTerminal(box.alias, ssh_config=box.ssh_config, state_dir=tmp_path / "state",
                           mappings=[Mapping(link, "retry/gh_token.json", "upload-only")],
                           sync_before_run=True, sync_interval=0.0) as t:
        link.unlink()
        link.symlink_to(vault / "v2.json")  # not written yet: the push cannot run
        r = await t.run("cat retry/gh_token.json")
        assert (r.returncode, r.stdout) == (0, "v1\n")  # the command ran anyway
        assert any(str(link) in rec.getMessage() for rec in caplog.records)
        write(vault / "v2.json", "v2\n", 0o600)
        assert (await t.run("cat retry/gh_token.json")).stdout == "v2\n"
