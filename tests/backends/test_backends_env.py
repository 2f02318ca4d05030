"""PATH restore, shell-init files and the environment snapshot (backends/env.py)."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from filesync.backends.env import (
    SNAPSHOT_MARKER,
    ShellInit,
    background_command,
    expand_init_path,
    parse_env0,
    parse_snapshot,
    path_entries,
    prelude_script,
    restore_path,
    restore_snippet,
    snapshot_script,
    source_snippet,
)

SHELLS = ("sh", "bash")


def all_dirs(_: str) -> bool:
    return True


def sh(shell: str, script: str, env: dict[str, str] | None = None) -> str:
    """Run ``script`` in ``shell`` with exactly ``env``; return stdout (fails on non-zero exit)."""
    argv = [f"/bin/{shell}", "-c", script]
    done = subprocess.run(argv, env=env or {}, capture_output=True, text=True, check=True)
    return done.stdout


# --- path_entries / restore_path -------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "entries"),
    [("", []), ("/a", ["/a"]), ("/a:", ["/a", ""]), (":/a", ["", "/a"]), ("a::b", ["a", "", "b"])],
)
def test_path_entries_edge_cases(value: str, entries: list[str]) -> None:
    assert path_entries(value) == entries


def test_missing_entries_are_appended_in_launch_order() -> None:
    assert restore_path("/c:/a:/b", "/x", all_dirs) == "/x:/c:/a:/b"


def test_login_entries_keep_their_place_and_present_ones_are_not_repeated() -> None:
    assert restore_path("/a:/x:/b:/y", "/y:/x", all_dirs) == "/y:/x:/a:/b"


def test_duplicates_within_launch_path_are_appended_once() -> None:
    assert restore_path("/a:/b:/a:/b", "/x", all_dirs) == "/x:/a:/b"


def test_login_path_duplicates_are_left_alone() -> None:
    assert restore_path("/a", "/x:/x", all_dirs) == "/x:/x:/a"


def test_relative_entries_are_kept_without_existence_check() -> None:
    checked: list[str] = []

    def isdir(p: str) -> bool:
        checked.append(p)
        return False

    assert restore_path("bin:.:~/x:/abs", "/x", isdir) == "/x:bin:.:~/x"
    assert checked == ["/abs"]


def test_missing_absolute_dirs_are_skipped() -> None:
    assert restore_path("/gone:/here", "/x", lambda p: p == "/here") == "/x:/here"


def test_empty_entry_from_trailing_colon_is_kept() -> None:
    assert restore_path("/a:", "/x", all_dirs) == "/x:/a:"


def test_empty_entry_already_in_login_path_is_not_repeated() -> None:
    assert restore_path("::/a:", "/x:", all_dirs) == "/x::/a"


def test_empty_launch_path_changes_nothing() -> None:
    assert restore_path("", "/x:/y", all_dirs) == "/x:/y"


def test_empty_login_path_becomes_the_restored_entries() -> None:
    assert restore_path("/a:/b", "", all_dirs) == "/a:/b"


def test_lone_empty_entry_on_empty_login_path_stays_empty() -> None:
    assert restore_path(":", "", all_dirs) == ""


def test_restore_path_is_idempotent() -> None:
    once = restore_path("/a:rel::/b", "/x", all_dirs)
    assert restore_path("/a:rel::/b", once, all_dirs) == once


# --- restore_snippet ---------------------------------------------------------------------------


@pytest.mark.parametrize("shell", SHELLS)
def test_snippet_restores_launch_dirs_after_profile_reset(shell: str, tmp_path: Path) -> None:
    tools = tmp_path / "my tools"
    tools.mkdir()
    launch = f"{tools}:/usr/bin:{tmp_path}/missing"
    out = sh(shell, f'{restore_snippet(launch)}\nprintf %s "$PATH"', {"PATH": "/usr/bin:/bin"})
    assert out == f"/usr/bin:/bin:{tools}"


def var_names(set_output: str) -> set[str]:
    return set(re.findall(r"^([A-Za-z_][A-Za-z0-9_]*)=", set_output, re.MULTILINE))


@pytest.mark.parametrize("shell", SHELLS)
def test_snippet_leaves_no_helper_variables(shell: str) -> None:
    # The leading ":" makes bash create PIPESTATUS before the first `set`.
    script = f":\nset\necho ==SPLIT==\n{restore_snippet('/usr/bin:rel:')}\nset"
    before, after = sh(shell, script, {"PATH": "/bin"}).split("==SPLIT==\n")
    assert var_names(after) == var_names(before)


@pytest.mark.parametrize("shell", SHELLS)
def test_snippet_exports_path_even_if_it_was_not_exported(shell: str, tmp_path: Path) -> None:
    # With no PATH in the environment, both shells use an internal, unexported default.
    out = sh(shell, f"{restore_snippet(str(tmp_path))}\n/usr/bin/env")
    exported = [line for line in out.splitlines() if line.startswith("PATH=")]
    assert len(exported) == 1
    assert exported[0].endswith(f":{tmp_path}")


@pytest.mark.parametrize("shell", SHELLS)
def test_snippet_runs_under_set_eu(shell: str) -> None:
    script = f'set -eu\n{restore_snippet("/nope:/usr/bin")}\nprintf %s "$PATH"'
    assert sh(shell, script, {"PATH": "/bin"}) == "/bin:/usr/bin"


@dataclass(frozen=True)
class DirPool:
    existing: list[str]
    missing: list[str]


# Names a shell would mangle if the snippet quoted or matched anything wrongly.
AWKWARD = [" sp ace", "qu'ote", 'dq"x', "$HOME", "back\\slash", "star*", "q?", "[ab]", "nl\nx"]


@pytest.fixture(scope="module")
def dir_pool(tmp_path_factory: pytest.TempPathFactory) -> DirPool:
    root = tmp_path_factory.mktemp("pool")
    existing = [root / f"d{i}{name}" for i, name in enumerate(AWKWARD)]
    for d in existing:
        d.mkdir()
    missing = [str(root / f"gone{name}") for name in AWKWARD[:4]]
    return DirPool([str(d) for d in existing], missing)


def path_strategy(pool: DirPool) -> st.SearchStrategy[str]:
    relative = st.text(alphabet="ab .'\"$*?[]\\-~", min_size=1, max_size=5).filter(
        lambda s: not s.startswith("/")
    )
    entry = st.one_of(
        st.sampled_from(pool.existing), st.sampled_from(pool.missing), relative, st.just("")
    )
    return st.lists(entry, max_size=7).map(":".join)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_shell_snippet_agrees_with_python(dir_pool: DirPool, data: st.DataObject) -> None:
    launch = data.draw(path_strategy(dir_pool), label="launch")
    login = data.draw(path_strategy(dir_pool), label="login")
    expected = restore_path(launch, login)
    snippet = restore_snippet(launch)
    script = f"{snippet}\nprintf '%s\\0' \"$PATH\"\n{snippet}\nprintf '%s\\0' \"$PATH\""
    for shell in SHELLS:
        once, twice, _ = sh(shell, script, {"PATH": login}).split("\0")
        assert (shell, once) == (shell, expected)
        assert (shell, twice) == (shell, expected)


# --- ShellInit ---------------------------------------------------------------------------------


def touch(*paths: Path) -> None:
    for p in paths:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("")


def test_auto_sources_profile_bash_profile_bashrc_in_order(tmp_path: Path) -> None:
    touch(tmp_path / ".bashrc", tmp_path / ".profile", tmp_path / ".bash_profile")
    names = [".profile", ".bash_profile", ".bashrc"]
    assert ShellInit().files(str(tmp_path), {}) == [str(tmp_path / n) for n in names]


def test_auto_off_and_no_list_sources_nothing(tmp_path: Path) -> None:
    touch(tmp_path / ".profile")
    assert ShellInit(auto_source_bashrc=False).files(str(tmp_path), {}) == []


def test_explicit_list_takes_over_from_auto(tmp_path: Path) -> None:
    touch(tmp_path / ".profile", tmp_path / ".bashrc", tmp_path / "env.sh")
    init = ShellInit(auto_source_bashrc=True, shell_init_files=["~/env.sh"])
    assert init.files(str(tmp_path), {}) == [str(tmp_path / "env.sh")]


def test_tilde_and_variables_are_expanded_against_given_home_and_env() -> None:
    init = ShellInit(shell_init_files=["~/a", "~", "${CFG}/b", "$CFG/c", "$HOME/d", "x/e"])
    files = init.files("/h", {"CFG": "/etc/cfg", "HOME": "/elsewhere"}, all_dirs)
    assert files == ["/h/a", "/h", "/etc/cfg/b", "/etc/cfg/c", "/h/d", "/h/x/e"]


def test_unknown_variable_and_tilde_user_stay_literal() -> None:
    assert expand_init_path("${NOPE}/x", "/h", {}) == "/h/${NOPE}/x"
    assert expand_init_path("~bob/x", "/h", {}) == "/h/~bob/x"


def test_missing_files_are_skipped(tmp_path: Path) -> None:
    touch(tmp_path / "there.sh")
    init = ShellInit(shell_init_files=["~/gone.sh", "~/there.sh", "${UNSET}/x.sh"])
    assert init.files(str(tmp_path), {}) == [str(tmp_path / "there.sh")]


def test_existence_check_is_injectable_and_sees_expanded_paths() -> None:
    asked: list[str] = []

    def remote_exists(p: str) -> bool:
        asked.append(p)
        return p.endswith("b")

    init = ShellInit(shell_init_files=["~/a", "~/b"])
    assert init.files("/remote/home", {}, remote_exists) == ["/remote/home/b"]
    assert asked == ["/remote/home/a", "/remote/home/b"]


def test_duplicate_init_files_are_sourced_once() -> None:
    init = ShellInit(shell_init_files=["~/a", "$HOME/a"])
    assert init.files("/h", {}, all_dirs) == ["/h/a"]


@pytest.mark.parametrize("shell", SHELLS)
def test_source_snippet_sources_readable_files_in_order(shell: str, tmp_path: Path) -> None:
    first, second = tmp_path / "one file.sh", tmp_path / "it's.sh"
    first.write_text("X=first\nY=from-first\n")
    second.write_text('X="$X,second"\n')
    snippet = source_snippet([str(first), str(tmp_path / "missing.sh"), str(second)])
    assert sh(shell, f'set -e\n{snippet}\necho "$X $Y"') == "first,second from-first\n"


# --- snapshot ----------------------------------------------------------------------------------


def test_parse_env0_keeps_newlines_quotes_and_equals() -> None:
    text = "A=1\0B=line1\nline2\0C=x=y\"'\0D=\0"
    assert parse_env0(text) == {"A": "1", "B": "line1\nline2", "C": "x=y\"'", "D": ""}


def test_parse_snapshot_ignores_profile_noise_and_shell_state() -> None:
    out = f"Welcome!\n\0{SNAPSHOT_MARKER}\0A=1\0_=/usr/bin/env\0PWD=/\0SHLVL=2\0OLDPWD=/x\0"
    assert parse_snapshot(out) == {"A": "1"}


def test_parse_snapshot_without_marker_raises() -> None:
    with pytest.raises(ValueError, match="marker"):
        parse_snapshot("A=1\0")


def run_login_snapshot(home: Path, launch: str, files: list[str]) -> dict[str, str]:
    env = {"HOME": str(home), "PATH": launch}
    script = snapshot_script(launch, files)
    done = subprocess.run(["bash", "-l", "-c", script], env=env, capture_output=True, check=True)
    return parse_snapshot(done.stdout.decode("utf-8", "surrogateescape"))


def test_snapshot_of_login_shell_has_init_vars_and_restored_path(tmp_path: Path) -> None:
    tools = tmp_path / "tools"
    tools.mkdir()
    (tmp_path / ".profile").write_text("echo noise\nPATH=/usr/bin:/bin\n")
    init = tmp_path / "init.sh"
    init.write_text("export TRICKY='a=b\n\"q\" $x'\n")
    env = run_login_snapshot(tmp_path, f"{tools}:/bin", [str(init)])
    assert env["TRICKY"] == 'a=b\n"q" $x'
    assert env["PATH"] == f"/usr/bin:/bin:{tools}"
    assert "SHLVL" not in env


def test_prelude_pins_dirs_first_even_when_they_were_in_the_launch_path(tmp_path: Path) -> None:
    pinned = str(tmp_path)
    script = prelude_script(f"/usr/bin:{pinned}", pin_first=[pinned]) + '\nprintf %s "$PATH"'
    assert sh("sh", script, {"PATH": "/bin"}) == f"{pinned}:/bin:/usr/bin"


def test_prelude_unsets_requested_variables() -> None:
    script = prelude_script("/bin", unset=["XDG_RUNTIME_DIR"]) + '\necho "${XDG_RUNTIME_DIR-gone}"'
    assert sh("sh", script, {"XDG_RUNTIME_DIR": "/run/user/0"}) == "gone\n"


def test_prelude_rejects_bad_variable_names() -> None:
    with pytest.raises(ValueError, match="variable names"):
        prelude_script("/bin", unset=["X; rm -rf ~"])


def test_background_command_runs_prelude_then_command_in_login_interactive_bash() -> None:
    argv = background_command("echo hi", "/opt/bin", ["/h/.profile"])
    assert argv[:2] == ["bash", "-lic"]
    assert argv[2] == prelude_script("/opt/bin", ["/h/.profile"]) + "\necho hi"


def test_background_command_restores_path_in_real_bash(tmp_path: Path) -> None:
    (tmp_path / ".profile").write_text("PATH=/usr/bin:/bin\n")
    tools = tmp_path / "tools"
    tools.mkdir()
    argv = background_command('printf "\\n%s" "$PATH"', f"{tools}:/bin")
    env = {"HOME": str(tmp_path), "PATH": f"{tools}:/bin"}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    assert done.stdout.splitlines()[-1] == f"/usr/bin:/bin:{tools}"


def test_os_path_isdir_is_the_default_check(tmp_path: Path) -> None:
    assert restore_path(f"{tmp_path}:{tmp_path}/nope", "/x") == f"/x:{tmp_path}"
