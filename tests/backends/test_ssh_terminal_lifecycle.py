"""SSHTerminal against a real OpenSSH sshd: remote processes, nested mappings, setup checks,
path parameters.

Remote processes are looked for inside the container (its own pid namespace), by the exact
command line of a ``sleep`` with a number no other test uses.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from synctree import snapshot, write

from filesync import FilesyncError, Mapping
from filesync.backends import SSHTerminal

pytestmark = pytest.mark.sshd

_DEADLINE = 60.0


@pytest.fixture
def box(sshd_factory: Callable[[int], Any]) -> Any:
    return sshd_factory(6)


def _running(box: Any, argv: str) -> list[int]:
    """Pids inside the container whose command line is exactly ``argv``."""
    done = box.run_inside("ps -eo pid=,args=")
    assert done.returncode == 0, done.stderr
    rows = (line.strip().split(None, 1) for line in done.stdout.splitlines() if line.strip())
    return [int(row[0]) for row in rows if len(row) == 2 and row[1] == argv]


async def _until(what: Callable[[], bool], why: str) -> None:
    deadline = time.monotonic() + _DEADLINE
    while not what():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {why}")
        await asyncio.sleep(0.05)


def _term(box: Any, tmp_path: Path, **kwargs: Any) -> SSHTerminal:
    return SSHTerminal(box.alias, ssh_config=box.ssh_config, state_dir=tmp_path / "state",
                       **kwargs)


# -- remote processes -------------------------------------------------------------------------


async def test_background_commands_do_not_outlive_the_terminal(box: Any, tmp_path: Path) -> None:
    plain, grouped, detached, bare = "sleep 31001", "sleep 31002", "sleep 31003", "sleep 31008"
    async with _term(box, tmp_path) as t:
        await t.spawn(plain)
        # The shell exits at once; its child stays in the process group...
        await t.spawn(f"{grouped} >/dev/null 2>&1 </dev/null &")
        # ...or leaves the group altogether...
        await t.spawn(f"setsid {detached} >/dev/null 2>&1 </dev/null &")
        # ...or drops its environment.
        await t.spawn(f"env -i {bare} >/dev/null 2>&1 </dev/null &")
        for argv in (plain, grouped, detached, bare):
            await _until(lambda a=argv: bool(_running(box, a)), f"{argv} runs")
    # SIGKILL is delivered asynchronously: wait for the exit, within a generous deadline.
    for argv in (plain, grouped, detached, bare):
        await _until(lambda a=argv: not _running(box, a), f"{argv} is gone")


async def test_a_killed_background_command_is_gone_at_once(box: Any, tmp_path: Path) -> None:
    async with _term(box, tmp_path) as t:
        p = await t.spawn("sleep 31004 & wait")
        await _until(lambda: bool(_running(box, "sleep 31004")), "the sleep runs")
        p.kill()
        result = await p.wait()
        await _until(lambda: not _running(box, "sleep 31004"), "the sleep is gone")
        assert result.returncode != 0
        assert (await t.run("echo still-open")).stdout == "still-open\n"


async def test_a_cancelled_run_kills_its_remote_command(box: Any, tmp_path: Path) -> None:
    async with _term(box, tmp_path) as t:
        task = asyncio.create_task(t.run("sleep 31005; echo never"))
        await _until(lambda: bool(_running(box, "sleep 31005")), "the sleep runs")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # Killed by the cancellation itself, while the terminal is still open.
        await _until(lambda: not _running(box, "sleep 31005"), "the sleep is gone")
        assert (await t.run("echo after")).stdout == "after\n"


async def test_a_timed_out_run_kills_its_remote_command(box: Any, tmp_path: Path) -> None:
    scopes: list[asyncio.Timeout] = []

    async def bounded(t: SSHTerminal) -> None:
        async with asyncio.timeout(None) as scope:
            scopes.append(scope)
            await t.run("sleep 31006 & sleep 31007; wait")

    async with _term(box, tmp_path) as t:
        task = asyncio.create_task(bounded(t))
        await _until(lambda: bool(_running(box, "sleep 31006") and _running(box, "sleep 31007")),
                     "both sleeps run")
        scopes[0].reschedule(asyncio.get_running_loop().time())  # the deadline is now
        with pytest.raises(TimeoutError):
            await task
        await _until(lambda: not _running(box, "sleep 31006") and not _running(box, "sleep 31007"),
                     "both sleeps are gone")


async def test_the_snapshot_env_carries_no_process_tag(box: Any, tmp_path: Path) -> None:
    async with _term(box, tmp_path) as t:
        assert not [k for k in t.env if k.startswith("FILESYNC_TERMINAL")]
        first = (await t.run("echo $FILESYNC_TERMINAL")).stdout
        second = (await t.run("echo $FILESYNC_TERMINAL")).stdout
        assert first.strip() and second.strip() and first != second  # one tag per command


# -- nested mappings --------------------------------------------------------------------------


async def test_remote_nested_mappings_each_path_lands_in_one_host_dir(
    box: Any, tmp_path: Path,
) -> None:
    outer, inner = tmp_path / "outer", tmp_path / "inner"
    write(outer / "o.txt", "outer\n")
    write(inner / "i.txt", "inner\n")
    mappings = [Mapping(outer, "nest-r"), Mapping(inner, "nest-r/sub")]
    async with _term(box, tmp_path, mappings=mappings) as t:
        assert (await t.run("echo remote > nest-r/sub/new.txt")).returncode == 0
    assert snapshot(inner) == {"i.txt": b"inner\n", "new.txt": b"remote\n"}
    assert snapshot(outer) == {"o.txt": b"outer\n"}  # the inner mapping owns nest-r/sub
    assert (box.home / "nest-r" / "o.txt").read_text() == "outer\n"


async def test_local_nested_mappings_each_path_lands_in_one_remote_dir(
    box: Any, tmp_path: Path,
) -> None:
    outer = tmp_path / "outer"
    write(outer / "o.txt", "outer\n")
    write(outer / "sub" / "i.txt", "inner\n")
    mappings = [Mapping(outer, "nest-l"), Mapping(outer / "sub", "nest-l-inner")]
    async with _term(box, tmp_path, mappings=mappings) as t:
        assert (await t.run("echo remote > nest-l-inner/new.txt")).returncode == 0
        assert not (box.home / "nest-l" / "sub").exists()
    assert snapshot(outer) == {"o.txt": b"outer\n", "sub/i.txt": b"inner\n",
                               "sub/new.txt": b"remote\n"}
    assert not (box.home / "nest-l" / "sub").exists()


# -- setup checks -----------------------------------------------------------------------------


async def test_a_missing_local_root_is_refused_before_anything_is_pushed(
    box: Any, tmp_path: Path,
) -> None:
    present = tmp_path / "present"
    write(present / "a.txt", "a\n")
    missing = tmp_path / "missing"
    term = _term(box, tmp_path, mappings=[Mapping(present, "pushed-p"), Mapping(missing, "m")])
    with pytest.raises(FilesyncError) as caught:
        async with term:
            raise AssertionError("the block must not run")
    message = str(caught.value)
    assert str(missing) in message and "does not exist" in message
    assert "\n" not in message
    assert not (box.home / "pushed-p").exists()
    assert not missing.exists()


# -- path parameters --------------------------------------------------------------------------


async def test_local_path_parameters_take_str_and_expand_the_tilde(
    box: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    home = tmp_path / "home"
    (home / "keys").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    key = home / "keys" / "id"
    shutil.copy2(box.client_key, key)
    key.chmod(0o600)
    # No IdentityFile: the only key offered is identity=.
    write(home / "cfg", f"Host only-identity\n    HostName {box.address}\n    User root\n"
          "    IdentitiesOnly yes\n    BatchMode yes\n    StrictHostKeyChecking yes\n"
          f'    UserKnownHostsFile "{box.known_hosts}"\n    GlobalKnownHostsFile /dev/null\n')
    write(home / "skills" / "s.txt", "skill\n")
    async with SSHTerminal("only-identity", ssh_config="~/cfg", identity="~/keys/id",
                           state_dir="~/state", mappings=[Mapping("~/skills", "tilde-s")],
                           home_mode="profile", profile_home="~/prof") as t:
        r = await t.run('echo "$HOME"')
        assert r.stdout == "/root/prof\n"
    assert (box.home / "tilde-s" / "s.txt").read_text() == "skill\n"
    assert (box.home / "prof" / "tmp").is_dir()
    assert (home / "state").is_dir()
    assert not list(tmp_path.glob("~*")) and not list(home.glob("~*"))


# -- the SSH client -----------------------------------------------------------------------------


async def test_one_login_for_the_whole_terminal_on_either_client(
    box: Any, tmp_path: Path, ssh_client: str
) -> None:
    def logins() -> int:
        return int(box.sshd_log.read_text(errors="replace").count("Accepted publickey"))

    local = tmp_path / "skills"
    write(local / "a.md", "a\n")
    before = logins()
    async with _term(box, tmp_path, mappings=[Mapping(local, "skills")]) as t:
        client = type(t._conduit).__module__.rsplit(".", 1)[-1]
        assert client == {"openssh": "openssh", "asyncssh": "conduit"}[ssh_client]
        await t.run("echo one")
        p = await t.spawn("echo two")
        assert (await p.wait()).stdout.strip().endswith("two")
    # Setup push, env snapshot, commands, kill sweep and teardown pull: one connection.
    assert logins() == before + 1
    assert snapshot(box.home / "skills") == {"a.md": b"a\n"}


async def test_ssh_client_names_are_checked(box: Any, tmp_path: Path) -> None:
    from filesync import UsageError

    with pytest.raises(UsageError, match=r"ssh client .putty. is not a client"):
        async with _term(box, tmp_path, ssh_client="putty"):
            pass
