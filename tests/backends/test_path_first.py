"""``path_first``: chosen dirs first on PATH after the profile ran, in order and once, for
foreground and background commands, locally and over a real sshd (the venv's ``python3``
wins over ``/usr/bin/python3``)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from synctree import write

from filesync.backends import LocalTerminal, SSHTerminal
from filesync.backends.env import first_snippet, path_entries, put_first

AWKWARD = [" sp ace", "qu'ote", 'dq"x', "$HOME", "back\\slash", "star*", "q?", "[ab]", "nl\nx"]

PY3 = shutil.which("python3", path="/usr/bin")


def test_dirs_come_first_in_order_once_and_leave_the_rest_in_place() -> None:
    path = "/usr/bin:/venv/bin:/bin::rel:/home/u/.local/bin:/usr/bin"
    out = put_first(["/venv/bin", "/home/u/.local/bin", "/venv/bin"], path, lambda _d: True)
    assert out == "/venv/bin:/home/u/.local/bin:/usr/bin:/bin::rel:/usr/bin"
    assert put_first(["/venv/bin", "/home/u/.local/bin"], out, lambda _d: True) == out


def test_missing_dirs_are_skipped_and_an_empty_path_gets_no_trailing_colon() -> None:
    assert put_first(["/gone", "/there"], "", lambda d: d == "/there") == "/there"
    assert put_first(["/gone"], "/usr/bin:", lambda _d: False) == "/usr/bin:"
    assert put_first(["/there"], "a:", lambda _d: True) == "/there:a:"


@pytest.mark.parametrize("bad", ["venv/bin", "/a:b", ""])
def test_a_relative_dir_or_one_with_a_colon_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="absolute"):
        put_first([bad], "/usr/bin")


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], list[str]]:
    root = tmp_path_factory.mktemp("first")
    existing = [root / f"d{i}{name}" for i, name in enumerate(AWKWARD)]
    for d in existing:
        d.mkdir()
    return [str(d) for d in existing], [str(root / f"gone{n}") for n in AWKWARD[:3]]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_shell_snippet_agrees_with_python(
    pool: tuple[list[str], list[str]], data: st.DataObject
) -> None:
    existing, missing = pool
    any_dir = st.sampled_from(existing + missing)
    entry = st.one_of(any_dir, st.text(alphabet="ab .'*?-~", min_size=1, max_size=4)
                      .filter(lambda s: not s.startswith("/")), st.just(""))
    path = data.draw(st.lists(entry, max_size=7).map(":".join), label="PATH")
    dirs = data.draw(st.lists(any_dir, max_size=4), label="dirs")
    expected = put_first(dirs, path)
    snippet = first_snippet(dirs)
    script = f"set -eu\n{snippet}\nprintf '%s\\0' \"$PATH\"\n{snippet}\nprintf '%s\\0' \"$PATH\""
    for shell in ("/bin/sh", "/bin/bash"):
        done = subprocess.run([shell, "-c", script], env={"PATH": path}, capture_output=True,
                              text=True, check=True)
        once, twice, _ = done.stdout.split("\0")
        assert (shell, once, twice) == (shell, expected, expected)


def _venv(root: Path) -> Path:
    """A venv-like dir whose python3 and pip say where they come from."""
    bin_dir = root / "venv" / "bin"
    write(bin_dir / "python3", "#!/bin/sh\necho venv-python3\n", 0o755)
    write(bin_dir / "pip", "#!/bin/sh\necho venv-pip\n", 0o755)
    return bin_dir


@pytest.mark.skipif(PY3 is None, reason="needs /usr/bin/python3 to lose against")
async def test_the_venv_wins_over_usr_bin_in_a_local_terminal(tmp_path: Path) -> None:
    home = tmp_path / "home"
    bin_dir = _venv(tmp_path)
    local_bin = home / ".local" / "bin"
    local_bin.mkdir(parents=True)
    # The profile puts /usr/bin first and the venv last, as Debian's does with a launch PATH.
    write(home / ".profile", f'PATH="/usr/bin:/bin:{bin_dir}"; export PATH\n')
    env = {"HOME": str(home), "PATH": f"{bin_dir}:/usr/bin:/bin"}
    async with LocalTerminal(env=env, home_mode="real",
                             path_first=[bin_dir, local_bin, bin_dir]) as t:
        path = t.env["PATH"]
        assert path_entries(path)[:2] == [str(bin_dir), str(local_bin)]
        assert path_entries(path).count(str(bin_dir)) == 1
        assert (await t.run("python3; pip")).stdout == "venv-python3\nvenv-pip\n"
        bg = await (await t.spawn("python3; command -v pip")).wait()
        assert bg.stdout.splitlines()[-2:] == ["venv-python3", str(bin_dir / "pip")]
    async with LocalTerminal(env=env, home_mode="real") as t:  # without it, /usr/bin wins
        assert (await t.run("command -v python3")).stdout.strip() == "/usr/bin/python3"



@pytest.fixture
def box(sshd_factory: Callable[[int], Any]) -> Any:
    return sshd_factory(9)


@pytest.mark.sshd
async def test_the_venv_wins_over_usr_bin_over_a_real_sshd(
    box: Any, tmp_path: Path, ssh_client: str | None,
) -> None:
    bin_dir = _venv(box.home / "app")
    (box.home / ".local" / "bin").mkdir(parents=True, exist_ok=True)
    write(box.home / ".profile", 'PATH="/usr/bin:/bin:$HOME/app/venv/bin"; export PATH\n')
    try:
        async with SSHTerminal(box.alias, ssh_config=box.ssh_config,
                               state_dir=tmp_path / "state",
                               path_first=["~/app/venv/bin", "~/.local/bin"]) as t:
            entries = path_entries(t.env["PATH"])
            assert entries[:2] == ["/root/app/venv/bin", "/root/.local/bin"], entries
            assert entries.count("/root/app/venv/bin") == 1
            assert (await t.run("python3; pip")).stdout == "venv-python3\nvenv-pip\n"
            bg = await (await t.spawn("python3")).wait()
            assert bg.stdout.splitlines()[-1] == "venv-python3"
        async with SSHTerminal(box.alias, ssh_config=box.ssh_config,
                               state_dir=tmp_path / "state") as t:
            assert (await t.run("command -v python3")).stdout.strip() == "/usr/bin/python3"
    finally:
        os.unlink(box.home / ".profile")
        assert bin_dir.exists()
