"""The /etc/profile.d snippet that prepends image directories missing from PATH."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from filesync.profile_d import profile_snippet

SHELLS = ("sh", "bash")


def source_twice(shell: str, snippet_file: Path, env: dict[str, str]) -> tuple[str, str]:
    """Source the snippet twice; return PATH after each time."""
    script = '. "$1"; printf "%s\\0" "$PATH"; . "$1"; printf "%s\\0" "$PATH"'
    done = subprocess.run(
        [f"/bin/{shell}", "-c", script, "sh", str(snippet_file)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    once, twice, _ = done.stdout.split("\0")
    return once, twice


def installed(tmp_path: Path, dirs: list[str]) -> Path:
    f = tmp_path / "filesync.sh"
    f.write_text(profile_snippet(dirs))
    return f


@pytest.mark.parametrize("shell", SHELLS)
def test_missing_dirs_are_prepended_in_given_order_once(shell: str, tmp_path: Path) -> None:
    f = installed(tmp_path, ["/opt/a", "/opt/b", "/opt/a", "/opt/c"])
    once, twice = source_twice(shell, f, {"PATH": "/usr/bin:/bin"})
    assert once == "/opt/a:/opt/b:/opt/c:/usr/bin:/bin"
    assert twice == once


@pytest.mark.parametrize("shell", SHELLS)
def test_dirs_already_on_path_stay_where_they_are(shell: str, tmp_path: Path) -> None:
    f = installed(tmp_path, ["/opt/a", "/bin", "/opt/c"])
    once, twice = source_twice(shell, f, {"PATH": "/usr/bin:/bin"})
    assert once == "/opt/a:/opt/c:/usr/bin:/bin"
    assert twice == once


@pytest.mark.parametrize("shell", SHELLS)
def test_awkward_names_are_matched_literally(shell: str, tmp_path: Path) -> None:
    dirs = ["/opt/my tools", "/opt/it's", "/opt/$HOME", "/opt/*", "/opt/back\\slash"]
    once, twice = source_twice(shell, installed(tmp_path, dirs), {"PATH": "/opt/x:/bin"})
    assert once == ":".join([*dirs, "/opt/x", "/bin"])
    assert twice == once


@pytest.mark.parametrize("shell", SHELLS)
def test_empty_path_gets_no_trailing_colon(shell: str, tmp_path: Path) -> None:
    once, twice = source_twice(shell, installed(tmp_path, ["/opt/a", "/opt/b"]), {"PATH": ""})
    assert (once, twice) == ("/opt/a:/opt/b", "/opt/a:/opt/b")


@pytest.mark.parametrize("shell", SHELLS)
def test_no_helper_variable_survives_and_path_is_exported(shell: str, tmp_path: Path) -> None:
    f = installed(tmp_path, ["/opt/a"])
    script = f'. "{f}"; echo "${{__filesync_pp-none}}"; /usr/bin/env'
    done = subprocess.run(
        [f"/bin/{shell}", "-c", script],
        env={"PATH": "/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    lines = done.stdout.splitlines()
    assert lines[0] == "none"
    assert "PATH=/opt/a:/bin" in lines[1:]


@pytest.mark.parametrize("bad", ["relative/bin", "", "/opt/a:/opt/b"])
def test_rejects_relative_empty_and_colon_dirs(bad: str) -> None:
    with pytest.raises(ValueError, match="absolute"):
        profile_snippet(["/opt/ok", bad])


def test_rejects_a_single_string() -> None:
    with pytest.raises(TypeError):
        profile_snippet("/opt/a")
