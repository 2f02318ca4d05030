"""HOME modes, the write-guard home set and the eval sandbox (backends/home.py)."""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
from pathlib import Path

import pytest

from filesync.backends.home import (
    REAL_HOME_ENV_VAR,
    child_env,
    detect_container,
    home_mode_from_env,
    normalize_home_mode,
    protected_homes,
    resolve_home_mode,
    sandbox_bin_dir,
    sandbox_env,
)

# --- modes -------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [None, "", "  ", "auto", "AUTO"])
def test_default_mode_is_auto(value: str | None) -> None:
    assert normalize_home_mode(value) == "auto"


@pytest.mark.parametrize(
    ("value", "mode"),
    [
        ("real", "real"),
        ("profile", "profile"),
        ("isolated", "profile"),
        ("profile_home", "profile"),
        (" Profile ", "profile"),
    ],
)
def test_modes_and_aliases(value: str, mode: str) -> None:
    assert normalize_home_mode(value) == mode


def test_invalid_mode_raises_one_line_message_naming_valid_values() -> None:
    with pytest.raises(ValueError) as err:
        normalize_home_mode("sandboxed")
    message = str(err.value)
    assert "\n" not in message
    assert all(word in message for word in ("'sandboxed'", "auto", "real", "profile"))


def test_explicit_mode_wins_over_environment() -> None:
    assert home_mode_from_env("real", {"TERMINAL_HOME_MODE": "isolated"}) == "real"


def test_environment_mode_used_without_explicit_one() -> None:
    assert home_mode_from_env(None, {"TERMINAL_HOME_MODE": "isolated"}) == "profile"
    assert home_mode_from_env("", {"TERMINAL_HOME_MODE": "real"}) == "real"


def test_no_mode_anywhere_means_auto() -> None:
    assert home_mode_from_env(None, {}) == "auto"


def test_invalid_environment_mode_raises() -> None:
    with pytest.raises(ValueError, match="invalid terminal home mode"):
        home_mode_from_env(None, {"TERMINAL_HOME_MODE": "bogus"})


@pytest.mark.parametrize(
    ("mode", "in_container", "resolved"),
    [
        ("auto", False, "real"),
        ("auto", True, "profile"),
        ("real", True, "real"),
        ("profile", False, "profile"),
        ("isolated", False, "profile"),
    ],
)
def test_resolve_home_mode(mode: str, in_container: bool, resolved: str) -> None:
    assert resolve_home_mode(mode, in_container) == resolved


def test_detect_container(tmp_path: Path) -> None:
    assert not detect_container(tmp_path, {})
    assert detect_container(tmp_path, {"container": "podman"})
    (tmp_path / ".dockerenv").touch()
    assert detect_container(tmp_path, {})


# --- child_env ---------------------------------------------------------------------------------

BASE = {"HOME": "/home/op", "PATH": "/usr/bin", "TMPDIR": "/tmp/op", "TMP": "/tmp/op"}


def test_real_mode_keeps_real_home_and_temp_dirs(tmp_path: Path) -> None:
    env = child_env(BASE, "real", profile_home=tmp_path / "p", in_container=True)
    assert env == BASE
    assert not (tmp_path / "p").exists()


def test_auto_on_host_is_real_home(tmp_path: Path) -> None:
    env = child_env(BASE, "auto", profile_home=tmp_path / "p", in_container=False)
    assert env["HOME"] == "/home/op"


def test_auto_in_container_is_profile_home(tmp_path: Path) -> None:
    env = child_env(BASE, "auto", profile_home=tmp_path / "p", in_container=True)
    assert env["HOME"] == str(tmp_path / "p")


def test_profile_pins_home_and_temp_dirs_and_records_real_home(tmp_path: Path) -> None:
    profile = tmp_path / "p" / "home"
    env = child_env(BASE, "profile", profile_home=profile, in_container=False)
    scratch = str(profile / "tmp")
    assert env["HOME"] == str(profile)
    assert (env["TMPDIR"], env["TMP"], env["TEMP"]) == (scratch, scratch, scratch)
    assert env[REAL_HOME_ENV_VAR] == "/home/op"
    assert BASE["TMPDIR"] == "/tmp/op"  # the caller's mapping is not modified


def test_profile_creates_home_and_private_scratch_dir(tmp_path: Path) -> None:
    profile = tmp_path / "p"
    (profile / "tmp").mkdir(parents=True, mode=0o755)
    (profile / "tmp").chmod(0o755)
    child_env(BASE, "profile", profile_home=profile, in_container=False)
    assert profile.is_dir()
    assert stat.S_IMODE((profile / "tmp").stat().st_mode) == 0o700


def test_profile_without_create_dirs_creates_nothing(tmp_path: Path) -> None:
    env = child_env(
        BASE, "profile", profile_home=tmp_path / "p", in_container=False, create_dirs=False
    )
    assert env["HOME"] == str(tmp_path / "p")
    assert not (tmp_path / "p").exists()


def test_explicit_tmpdir_override_is_kept_in_profile_mode(tmp_path: Path) -> None:
    env = child_env(
        BASE,
        "profile",
        profile_home=tmp_path,
        in_container=False,
        overrides={"TMPDIR": "/scratch/mine"},
    )
    assert env["TMPDIR"] == "/scratch/mine"
    assert env["TMP"] == str(tmp_path / "tmp")


def test_real_home_argument_wins_then_recorded_real_home(tmp_path: Path) -> None:
    nested = {**BASE, "HOME": "/profiles/a", REAL_HOME_ENV_VAR: "/home/op"}
    env = child_env(nested, "real", profile_home=tmp_path, in_container=False)
    assert env["HOME"] == "/home/op"
    env = child_env(
        nested, "profile", profile_home=tmp_path, in_container=False, real_home="/home/given"
    )
    assert env[REAL_HOME_ENV_VAR] == "/home/given"


def test_real_home_falls_back_to_passwd_entry(tmp_path: Path) -> None:
    import pwd

    env = child_env({}, "profile", profile_home=tmp_path, in_container=False)
    assert env[REAL_HOME_ENV_VAR] == pwd.getpwuid(os.getuid()).pw_dir


def test_protected_homes_is_the_union_including_resolved_symlinks(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    homes = protected_homes(
        process_home=str(link),
        real_home="/home/op/",
        subprocess_home=None,
        profile_home=tmp_path / "p",
    )
    assert homes == {str(link), str(real), "/home/op", str(tmp_path / "p")}


def test_protected_homes_ignores_missing_values() -> None:
    assert protected_homes(process_home="", real_home=None) == set()


# --- sandbox -----------------------------------------------------------------------------------


def test_sandbox_puts_shim_dir_first_and_drops_user_bus(tmp_path: Path) -> None:
    bus = {"DBUS_SESSION_BUS_ADDRESS": "unix:path=/run/user/0/bus", "XDG_RUNTIME_DIR": "/run/u"}
    env = {**BASE, **bus, "PATH": f"/usr/bin:{tmp_path}/bin:/bin"}
    out = sandbox_env(env, tmp_path)
    assert out["PATH"] == f"{tmp_path}/bin:/usr/bin:/bin"
    assert not set(bus) & set(out)
    assert "DBUS_SESSION_BUS_ADDRESS" in env  # input untouched
    shim = sandbox_bin_dir(tmp_path) / "crontab"
    assert shim.stat().st_mode & stat.S_IXUSR


def test_sandbox_on_empty_path_adds_no_cwd_entry(tmp_path: Path) -> None:
    assert sandbox_env({}, tmp_path)["PATH"] == str(tmp_path / "bin")


@pytest.fixture
def crontab(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    run_dir = tmp_path / "run"
    env = sandbox_env({"PATH": "/usr/bin:/bin", "USER": "agent", "TMPDIR": str(tmp_path)}, run_dir)
    return run_dir, env


def cron(
    env: dict[str, str], *args: str, stdin: str = "", cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["crontab", *args], input=stdin, env=env, cwd=cwd, capture_output=True, text=True
    )


def test_shim_shadows_system_crontab(crontab: tuple[Path, dict[str, str]]) -> None:
    run_dir, env = crontab
    found = subprocess.run(
        ["sh", "-c", "command -v crontab"], env=env, capture_output=True, text=True
    )
    assert found.stdout.strip() == str(run_dir / "bin" / "crontab")


def test_shim_list_without_table_fails_like_crontab(crontab: tuple[Path, dict[str, str]]) -> None:
    _, env = crontab
    done = cron(env, "-l")
    assert (done.returncode, done.stdout, done.stderr) == (1, "", "no crontab for agent\n")


@pytest.mark.parametrize("args", [("-",), ()])
def test_shim_installs_from_stdin(crontab: tuple[Path, dict[str, str]], args: tuple[str]) -> None:
    run_dir, env = crontab
    assert cron(env, *args, stdin="0 2 * * * /backup.sh\n").returncode == 0
    assert (run_dir / "crontab").read_text() == "0 2 * * * /backup.sh\n"
    assert cron(env, "-l").stdout == "0 2 * * * /backup.sh\n"


def test_shim_installs_from_file(crontab: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    _, env = crontab
    (tmp_path / "my tab").write_text("@reboot /x\n")
    assert cron(env, "my tab", cwd=tmp_path).returncode == 0
    assert cron(env, "-l").stdout == "@reboot /x\n"


def test_shim_missing_file_fails_and_keeps_table(crontab: tuple[Path, dict[str, str]]) -> None:
    _, env = crontab
    cron(env, "-", stdin="keep\n")
    done = cron(env, "/nonexistent/tab")
    assert done.returncode == 1
    assert cron(env, "-l").stdout == "keep\n"


def test_shim_remove(crontab: tuple[Path, dict[str, str]]) -> None:
    run_dir, env = crontab
    cron(env, "-", stdin="x\n")
    assert cron(env, "-r").returncode == 0
    assert not (run_dir / "crontab").exists()
    assert cron(env, "-l").returncode == 1
    assert cron(env, "-r").stderr == "no crontab for agent\n"


def test_shim_edit_runs_editor_on_a_copy_and_stores_it(
    crontab: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    run_dir, env = crontab
    editor = tmp_path / "editor"
    editor.write_text('#!/bin/sh\necho "0 3 * * * /new" >> "$1"\n')
    editor.chmod(0o755)
    cron(env, "-", stdin="0 2 * * * /old\n")
    assert cron({**env, "EDITOR": str(editor)}, "-e").returncode == 0
    assert (run_dir / "crontab").read_text() == "0 2 * * * /old\n0 3 * * * /new\n"


def test_shim_edit_runs_editor_as_a_shell_command_line_like_crontab(
    crontab: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    """crontab runs ``sh -c "$EDITOR FILE"``: quotes, arguments and assignments work."""
    run_dir, env = crontab
    editor = tmp_path / "my editor" / "ed"
    editor.parent.mkdir()
    editor.write_text('#!/bin/sh\necho "0 4 * * * $MARK $1" >> "$2"\n')
    editor.chmod(0o755)
    cron(env, "-", stdin="0 2 * * * /old\n")
    line = f"MARK=/job {shlex.quote(str(editor))} --flag"
    done = cron({**env, "EDITOR": line}, "-e")
    assert done.returncode == 0, done.stderr
    assert (run_dir / "crontab").read_text() == "0 2 * * * /old\n0 4 * * * /job --flag\n"


def test_shim_edit_prefers_visual_and_keeps_table_when_editor_fails(
    crontab: tuple[Path, dict[str, str]],
) -> None:
    run_dir, env = crontab
    cron(env, "-", stdin="old\n")
    done = cron({**env, "VISUAL": "false", "EDITOR": "true"}, "-e")
    assert done.returncode != 0
    assert (run_dir / "crontab").read_text() == "old\n"


def test_shim_accepts_user_option_and_rejects_unknown_options(
    crontab: tuple[Path, dict[str, str]],
) -> None:
    _, env = crontab
    assert cron(env, "-u", "bob", "-l").stderr == "no crontab for bob\n"
    bad = cron(env, "-x")
    assert bad.returncode == 1
    assert "invalid option" in bad.stderr
