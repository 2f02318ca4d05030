"""Bad input gets one line ``filesync: error: ...`` and its exit code, never a traceback.

Every case runs the real CLI as a subprocess (``python -m filesync.cli``), as a user would.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from synctree import write

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "filesync.cli"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("FILESYNC_") and k != "XDG_RUNTIME_DIR"}
    return {**env, **extra}


def cli(*argv: str, cwd: Path = REPO, env: dict[str, str] | None = None,
        prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*prefix, *CLI, *argv], cwd=cwd, env=env or _env(),
                          capture_output=True, text=True, timeout=120, check=False)


def one_line(done: subprocess.CompletedProcess[str], code: int, kind: str = "error") -> str:
    """The single stderr line of a run that exited with ``code``."""
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"filesync: {kind}: "), done.stderr
    assert done.returncode == code, (done.returncode, done.stderr)
    return lines[0]


# -- filesync.toml -------------------------------------------------------------------------

MAPPING = '[[mapping]]\nlocal = "skills"\nremote = "skills"\n'


@pytest.mark.parametrize("body,needles", [
    (b'remotes = ["x:"]\n# caf\xe9\n' + MAPPING.encode(), ["not UTF-8"]),
    (b'remotes = ["x:"]\nmapping = 3\n', ["mapping must be [[mapping]] tables"]),
    (b'remotes = ["x:"]\nvia = 7\n' + MAPPING.encode(), ["via must be a string"]),
    (b'remotes = ["x:"]\nvia = "\'"\n' + MAPPING.encode(), ["--via", "not a command line"]),
    (b'remotes = ["x:"]\nremote = "y:"\n' + MAPPING.encode(), ["remotes or remote"]),
    (b'remotes = ["x:"]\nexcludes = ["*.key"]\n' + MAPPING.encode(),
     ["unknown key 'excludes'"]),
    ((f'remotes = ["x:"]\n{MAPPING}exclude = [1, 2]\n').encode(),
     ["mapping 1", "exclude must be a list of pattern strings"]),
    ((f'remotes = ["x:"]\n{MAPPING}excludes = ["*.key"]\n').encode(),
     ["mapping 1", "unknown key 'excludes'"]),
    ((f'remotes = ["x:"]\n{MAPPING}mode = 2\n').encode(), ["mapping 1", "mode must be a string"]),
    (b'remotes = ["x:"]\n[[mapping]]\nlocal = 1\nremote = "r"\n',
     ["mapping 1", "local must be a string"]),
])
def test_config_errors_name_the_file_and_the_key(
        tmp_path: Path, body: bytes, needles: list[str]) -> None:
    cfg = tmp_path / "filesync.toml"
    cfg.write_bytes(body)
    line = one_line(cli("push", "--config", str(cfg)), 2)
    for needle in [str(cfg), *needles]:
        assert needle in line, line


def test_config_that_is_a_directory(tmp_path: Path) -> None:
    assert "cannot read config file" in one_line(cli("push", "--config", str(tmp_path)), 2)


def test_config_and_local_remote_together(tmp_path: Path) -> None:
    cfg = write(tmp_path / "f.toml", f'remotes = ["{tmp_path / "r"}"]\n{MAPPING}')
    done = cli("push", str(tmp_path), str(tmp_path / "r"), "--config", str(cfg))
    assert "not both" in one_line(done, 2)


def test_relative_paths_in_the_config_are_relative_to_its_directory(tmp_path: Path) -> None:
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    write(project / "skills" / "a" / "SKILL.md", "a\n")
    elsewhere.mkdir()
    cfg = write(project / "filesync.toml", f'remotes = ["backup"]\n{MAPPING}')
    done = cli("push", "--config", "../project/filesync.toml",
               "--state-dir", str(tmp_path / "state"), cwd=elsewhere)
    assert done.returncode == 0, done.stderr
    assert (project / "backup" / "skills" / "a" / "SKILL.md").read_text() == "a\n"
    assert list(elsewhere.iterdir()) == []
    assert cfg.exists()


def test_command_line_via_overrides_the_files(tmp_path: Path) -> None:
    project = tmp_path / "project"
    write(project / "skills" / "f.txt", "x\n")
    remote = tmp_path / "remote"
    cfg = write(project / "f.toml", f'remotes = ["{remote}"]\nvia = "false"\n{MAPPING}')
    done = cli("push", "--config", str(cfg), "--via", "env", "--state-dir",
               str(tmp_path / "state"))
    assert done.returncode == 0, done.stderr
    assert (remote / "skills" / "f.txt").read_text() == "x\n"


# -- numbers -------------------------------------------------------------------------------

@pytest.mark.parametrize("option,value", [
    ("--max-file-size", "-5"), ("--max-file-size", "0"), ("--max-file-size", "inf"),
    ("--max-file-size", "nan"), ("--max-pull-bytes", "-1K"), ("--max-pull-bytes", "0"),
    ("--timeout", "-3"), ("--timeout", "nan"), ("--timeout", "inf"),
    ("--lock-timeout", "-1"), ("--lock-timeout", "soon"),
])
def test_sizes_and_timeouts_out_of_range_are_usage_errors(
        tmp_path: Path, option: str, value: str) -> None:
    local = write(tmp_path / "local" / "f.txt", "x\n").parent
    done = cli("push", str(local), str(tmp_path / "remote"), f"{option}={value}",
               "--state-dir", str(tmp_path / "state"))
    line = one_line(done, 2)
    assert f"argument {option}:" in line and repr(value) in line, line
    assert not (tmp_path / "remote").exists()


def test_zero_timeouts_keep_their_meaning_of_no_limit(tmp_path: Path) -> None:
    local = write(tmp_path / "local" / "f.txt", "x\n").parent
    done = cli("push", str(local), str(tmp_path / "remote"), "--timeout", "0",
               "--lock-timeout", "0", "--max-file-size", "1", "--state-dir",
               str(tmp_path / "state"))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "remote" / "f.txt").read_text() == "x\n"


# -- --via ---------------------------------------------------------------------------------

@pytest.mark.parametrize("via,code,needle", [
    ("sh -c", 1, "through --via 'sh -c': the remote helper did not start"),
    ("false", 1, "through --via 'false': "),
    ("/nonexistent/filesync-via", 1, "through --via '/nonexistent/filesync-via': cannot start"),
    ("'", 2, "--via \"'\" is not a command line"),
    ("", 2, "--via needs a command"),
])
def test_via_errors_name_the_via_command(tmp_path: Path, via: str, code: int,
                                         needle: str) -> None:
    local = write(tmp_path / "local" / "f.txt", "x\n").parent
    # In tmp_path: what a broken --via command leaves in its working dir stays out of the repo.
    done = cli("push", str(local), str(tmp_path / "remote"), f"--via={via}",
               "--state-dir", str(tmp_path / "state"), cwd=tmp_path)
    assert needle in one_line(done, code)
    assert not (tmp_path / "remote").exists()


def test_via_errors_of_a_fan_out_name_the_via_command(tmp_path: Path) -> None:
    local = write(tmp_path / "local" / "f.txt", "x\n").parent
    done = cli("push", str(local), "r1", "r2", "--via", "sh -c",
               "--state-dir", str(tmp_path / "state"), cwd=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 2 and all("through --via 'sh -c'" in line for line in lines), lines


# -- the agent dir of another user -----------------------------------------------------------

def _need_root() -> None:
    if os.geteuid() != 0:  # like the sshd tests: a hole in CI, a skip elsewhere
        if os.environ.get("CI"):
            pytest.fail("CI must run as root")
        pytest.skip("needs root to make a directory owned by another user")


def test_squatted_default_agent_dir_warns_and_runs_directly(tmp_path: Path) -> None:
    """``/tmp/filesync-UID`` made by another user (no XDG_RUNTIME_DIR): one warning naming
    the real problem, then the run as without --persist. The test's own ``/tmp`` is a bind
    mount in a private mount namespace, so the machine's ``/tmp`` is never touched."""
    _need_root()
    fake_tmp = tmp_path / "tmp"
    squat = fake_tmp / f"filesync-{os.getuid()}"
    squat.mkdir(parents=True)
    shutil.chown(squat, "nobody")
    squat.chmod(0o700)
    write(fake_tmp / "local" / "f.txt", "direct\n")
    # The real /tmp stays reachable as /tmp/.real, and a checkout living under /tmp (a CI
    # clone) is bound back at its own path: the interpreter and the package stay found.
    isolated = ("unshare", "--mount", "--propagation", "private", "sh", "-c",
                'mkdir -p "$0/.real" && mount --bind /tmp "$0/.real" && mount --rbind "$0" /tmp'
                ' && case "$1" in /tmp/*) r=${1#/tmp/}; mkdir -p "/tmp/$r"'
                ' && mount --bind "/tmp/.real/$r" "/tmp/$r";; esac && shift && exec "$@"',
                str(fake_tmp), str(REPO))
    done = cli("push", "/tmp/local", "/tmp/remote", "--persist", "60", "--state-dir",
               "/tmp/state", prefix=isolated)
    line = one_line(done, 0, kind="warning")
    for needle in (f"/tmp/filesync-{os.getuid()}", "belongs to another user",
                   "XDG_RUNTIME_DIR", "FILESYNC_AGENT_SOCKET", "running without the agent"):
        assert needle in line, line
    assert "chmod" not in line
    assert (fake_tmp / "remote" / "f.txt").read_text() == "direct\n"
    assert list(squat.iterdir()) == []  # no agent socket, log or lock was made there


def test_explicit_agent_socket_in_another_users_dir_warns_and_runs_directly(
        tmp_path: Path) -> None:
    _need_root()
    squat = tmp_path / "squat"
    squat.mkdir(mode=0o700)
    shutil.chown(squat, "nobody")
    local = write(tmp_path / "local" / "f.txt", "x\n").parent
    done = cli("status", str(local), str(tmp_path / "remote"), "--persist", "60",
               "--state-dir", str(tmp_path / "state"),
               env=_env(FILESYNC_AGENT_SOCKET=str(squat / "agent.sock")))
    assert "belongs to another user" in one_line(done, 0, kind="warning")
    assert "upload" in done.stdout and list(squat.iterdir()) == []
