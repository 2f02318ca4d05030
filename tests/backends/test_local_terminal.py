"""LocalTerminal: one login-shell snapshot per session, PATH restore, HOME mode, sandbox."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from filesync.backends import LocalTerminal, RunResult
from filesync.backends._session import SnapshotError


@dataclass(frozen=True)
class Launch:
    home: Path
    tools: Path
    env: dict[str, str]


@pytest.fixture
def launch(tmp_path: Path) -> Launch:
    """A HOME whose .profile resets PATH like Debian's /etc/profile, and a launch PATH with a tool
    directory the login shell does not know about."""
    home, tools = tmp_path / "home", tmp_path / "my tools"
    home.mkdir()
    tools.mkdir()
    (home / ".profile").write_text("PATH=/usr/bin:/bin\necho 'welcome from .profile'\n")
    tool = tools / "mytool"
    tool.write_text("#!/bin/sh\necho mytool-ran\n")
    tool.chmod(0o755)
    env = {"HOME": str(home), "PATH": f"{tools}:/usr/bin:/bin", "USER": "agent"}
    return Launch(home, tools, env)


def terminal(launch: Launch, **kwargs: object) -> LocalTerminal:
    options: dict[str, object] = {"home_mode": "real", "env": launch.env, "in_container": False}
    options.update(kwargs)
    return LocalTerminal(**options)  # type: ignore[arg-type]


def test_without_restore_the_login_shell_loses_the_tool(launch: Launch) -> None:
    done = subprocess.run(
        ["bash", "-l", "-c", "mytool"], env=launch.env, capture_output=True, text=True
    )
    assert done.returncode == 127


async def test_foreground_finds_launch_path_tool(launch: Launch) -> None:
    async with terminal(launch) as t:
        result = await t.run("mytool")
    assert result == RunResult(0, "mytool-ran\n", "")


async def test_background_finds_launch_path_tool(launch: Launch) -> None:
    async with terminal(launch) as t:
        result = await (await t.spawn("mytool")).wait()
    assert result.returncode == 0
    assert result.stdout.endswith("mytool-ran\n")


async def test_foreground_and_background_agree_on_path(launch: Launch) -> None:
    async with terminal(launch) as t:
        fg = await t.run('printf "%s" "$PATH"')
        bg = await (await t.spawn('printf "\\n%s" "$PATH"')).wait()
    assert fg.stdout == f"/usr/bin:/bin:{launch.tools}"
    assert bg.stdout.splitlines()[-1] == fg.stdout


async def test_snapshot_is_taken_once_per_session(launch: Launch) -> None:
    counter = launch.home / "sourced"
    with (launch.home / ".profile").open("a") as f:
        f.write(f"echo x >> '{counter}'\n")
    async with terminal(launch) as t:
        after_enter = counter.read_text()
        for _ in range(3):
            await t.run("true")
        assert counter.read_text() == after_enter


async def test_explicit_init_files_reach_foreground_and_background(launch: Launch) -> None:
    (launch.home / "env.sh").write_text("export TOOLCHAIN='from env.sh'\n")
    async with terminal(launch, shell_init_files=["~/env.sh", "~/missing.sh"]) as t:
        fg = await t.run('echo "$TOOLCHAIN"')
        bg = await (await t.spawn('echo "$TOOLCHAIN"')).wait()
    assert fg.stdout == "from env.sh\n"
    assert bg.stdout.endswith("from env.sh\n")


async def test_profile_mode_pins_home_and_tmpdir(launch: Launch, tmp_path: Path) -> None:
    profile = tmp_path / "profile"
    async with terminal(launch, home_mode="profile", profile_home=profile) as t:
        fg = await t.run('echo "$HOME $TMPDIR $TERMINAL_REAL_HOME"')
        bg = await (await t.spawn('echo "$HOME $TMPDIR"')).wait()
    assert fg.stdout == f"{profile} {profile}/tmp {launch.home}\n"
    assert bg.stdout.endswith(f"{profile} {profile}/tmp\n")


async def test_home_mode_comes_from_environment_when_not_given(
    launch: Launch, tmp_path: Path
) -> None:
    env = {**launch.env, "TERMINAL_HOME_MODE": "isolated"}
    profile = tmp_path / "profile"
    async with terminal(launch, home_mode=None, env=env, profile_home=profile) as t:
        assert (await t.run("echo $HOME")).stdout == f"{profile}\n"


async def test_explicit_tmpdir_survives_profile_mode(launch: Launch, tmp_path: Path) -> None:
    async with terminal(
        launch,
        home_mode="profile",
        profile_home=tmp_path / "p",
        env_overrides={"TMPDIR": "/scratch/mine"},
    ) as t:
        assert (await t.run("echo $TMPDIR")).stdout == "/scratch/mine\n"


async def test_sandbox_shim_shadows_crontab_after_login_shell(
    launch: Launch, tmp_path: Path
) -> None:
    env = {**launch.env, "XDG_RUNTIME_DIR": "/run/user/0"}
    async with terminal(launch, env=env, sandbox_dir=tmp_path / "run") as t:
        fg = await t.run('command -v crontab; echo "${XDG_RUNTIME_DIR-unset}"')
        bg = await (await t.spawn("command -v crontab")).wait()
    shim = f"{tmp_path}/run/bin/crontab"
    assert fg.stdout == f"{shim}\nunset\n"
    assert bg.stdout.endswith(f"{shim}\n")


async def test_run_uses_cwd_and_input(launch: Launch, tmp_path: Path) -> None:
    async with terminal(launch, cwd=tmp_path) as t:
        assert (await t.run("pwd")).stdout == f"{tmp_path}\n"
        assert (await t.run("pwd", cwd=launch.home)).stdout == f"{launch.home}\n"
        assert (await t.run("cat", input="fed")).stdout == "fed"


async def test_failing_command_reports_status_and_stderr(launch: Launch) -> None:
    async with terminal(launch) as t:
        assert await t.run("echo oops >&2; exit 3") == RunResult(3, "", "oops\n")


async def test_leaving_the_session_kills_background_commands(launch: Launch) -> None:
    async with terminal(launch) as t:
        proc = await t.spawn("sleep 300")
    assert proc.returncode is not None and proc.returncode < 0


async def test_profile_that_exits_fails_the_snapshot(launch: Launch) -> None:
    (launch.home / ".profile").write_text("echo broken >&2\nexit 3\n")
    with pytest.raises(SnapshotError, match="broken"):
        async with terminal(launch):
            pass


async def test_bash_is_found_when_the_launch_path_lacks_it(launch: Launch) -> None:
    env = {"HOME": str(launch.home), "PATH": "/nonexistent"}
    async with terminal(launch, env=env) as t:
        assert (await t.run("echo ok")).stdout == "ok\n"


async def test_use_outside_the_session_is_an_error(launch: Launch) -> None:
    with pytest.raises(RuntimeError, match="async with"):
        await terminal(launch).run("true")


async def test_path_parameters_take_str_and_pathlike_and_expand_the_tilde(
    launch: Launch, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    caller = tmp_path / "caller"
    (caller / "work").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(caller))  # ``~`` is the caller's home, as for expanduser
    monkeypatch.chdir(tmp_path)
    async with terminal(launch, home_mode="profile", profile_home="~/prof",
                        sandbox_dir="~/sandbox", cwd="~/work") as t:
        r = await t.run('echo "$HOME|$PWD"; command -v crontab')
        bg = await (await t.spawn("pwd", cwd="~")).wait()
        here = await t.run("pwd", cwd=Path("~/work"))
    assert r.stdout == f"{caller}/prof|{caller}/work\n{caller}/sandbox/bin/crontab\n"
    assert bg.stdout.endswith(f"{caller}\n")
    assert here.stdout == f"{caller}/work\n"
    assert (caller / "prof" / "tmp").is_dir()
    assert not list(tmp_path.rglob("~*"))  # no directory named after the tilde


async def test_profile_home_as_a_path_object(launch: Launch, tmp_path: Path) -> None:
    async with terminal(launch, home_mode="profile", profile_home=tmp_path / "p") as t:
        assert t.env["HOME"] == str(tmp_path / "p")
