"""SSHTerminal against a real OpenSSH sshd: PATH restore, HOME mode, sync at teardown."""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from synctree import junk_tree, skills_tree, snapshot, write

from filesync import Mapping
from filesync.backends import SSHTerminal

pytestmark = pytest.mark.sshd

TOOL_DIR = "/root/tools/bin"


@pytest.fixture
def box(sshd_factory: Callable[[int], Any]) -> Any:
    """A container whose login profile resets PATH like Debian's /etc/profile does."""
    container = sshd_factory(5)
    home: Path = container.home
    write(home / "tools" / "bin" / "mytool", "#!/bin/sh\necho tool-ran\n", 0o755)
    # The session's own PATH (before any profile) holds the tool dir...
    write(home / ".ssh" / "environment", f"PATH={TOOL_DIR}:/usr/local/bin:/usr/bin:/bin\n")
    # ...and the login profile throws it away.
    write(home / ".profile", "PATH=/usr/bin:/bin\nexport PATH\n")
    return container


def _ssh(box: Any, command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ssh", "-F", str(box.ssh_config), box.alias, command],
                          capture_output=True, text=True, timeout=60)


def test_profile_really_drops_the_tool_without_the_restore(box: Any) -> None:
    plain = _ssh(box, "command -v mytool")
    login = _ssh(box, "bash -lc 'command -v mytool'")
    assert plain.returncode == 0 and login.returncode != 0


async def test_foreground_and_background_see_the_restored_path(box: Any, tmp_path: Path) -> None:
    async with SSHTerminal(box.alias, ssh_config=box.ssh_config, state_dir=tmp_path) as t:
        r = await t.run("mytool")
        assert (r.returncode, r.stdout.strip()) == (0, "tool-ran")
        p = await t.spawn("mytool")
        bg = await p.wait()
        assert bg.returncode == 0 and bg.stdout.strip().endswith("tool-ran")
        path = (await t.run("echo $PATH")).stdout.strip().split(":")
        # The profile's choice stays in front; the lost dirs come back after it, in order.
        assert path == ["/usr/bin", "/bin", TOOL_DIR, "/usr/local/bin"]


async def test_profile_mode_pins_home_and_tmpdir(box: Any, tmp_path: Path) -> None:
    profile = "/root/.agent-profile"
    async with SSHTerminal(box.alias, ssh_config=box.ssh_config, home_mode="profile",
                           profile_home=profile, state_dir=tmp_path) as t:
        r = await t.run('echo "$HOME|$TMPDIR|$TERMINAL_REAL_HOME"; test -d "$TMPDIR"')
        assert r.returncode == 0
        assert r.stdout.strip() == f"{profile}|{profile}/tmp|/root"
        bg = await (await t.spawn('echo "$HOME"')).wait()
        assert bg.stdout.strip().endswith(profile)
    assert (box.home / ".agent-profile" / "tmp").is_dir()


async def test_teardown_syncs_back_edits_and_leaves_bookkeeping(box: Any, tmp_path: Path) -> None:
    local = tmp_path / "skills"
    skills_tree(local)
    creds = tmp_path / "creds"
    write(creds / "token", "secret\n", 0o600)
    mappings = [Mapping(str(local), ".hermes/skills"),
                Mapping(str(creds), ".hermes/creds", mode="upload-only")]
    async with SSHTerminal(box.alias, ssh_config=box.ssh_config, mappings=mappings,
                           state_dir=tmp_path / "state") as t:
        remote = box.home / ".hermes" / "skills"
        assert (remote / "pdf" / "SKILL.md").exists()
        assert (box.home / ".hermes" / "creds" / "token").stat().st_mode & 0o777 == 0o600
        r = await t.run("cd ~/.hermes/skills && echo remote-edit > pdf/SKILL.md "
                        "&& mkdir -p fresh && echo new > fresh/SKILL.md "
                        "&& echo changed > ~/.hermes/creds/token")
        assert r.returncode == 0
        junk_tree(remote, curator_mb=1)
    assert (local / "pdf" / "SKILL.md").read_text() == "remote-edit\n"
    assert (local / "fresh" / "SKILL.md").read_text() == "new\n"
    assert not (local / ".curator_backups").exists()
    assert (local / ".hub" / "lock.json").read_text() == '{"host": true}\n'
    assert (creds / "token").read_text() == "secret\n"  # upload-only: never written back
    assert (box.home / ".hermes" / "skills" / ".curator_backups").exists()


async def test_exception_in_block_still_syncs_back(box: Any, tmp_path: Path) -> None:
    local = tmp_path / "skills"
    skills_tree(local)
    with pytest.raises(RuntimeError, match="agent crashed"):
        async with SSHTerminal(box.alias, ssh_config=box.ssh_config,
                               mappings=[Mapping(str(local), "skills-x")],
                               state_dir=tmp_path / "state") as t:
            await t.run("echo saved-before-crash > ~/skills-x/web/SKILL.md")
            raise RuntimeError("agent crashed")
    assert (local / "web" / "SKILL.md").read_text() == "saved-before-crash\n"


async def test_sync_back_failure_is_kept_and_never_masks(box: Any, tmp_path: Path) -> None:
    local = tmp_path / "skills"
    skills_tree(local)
    term = SSHTerminal(box.alias, ssh_config=box.ssh_config,
                       mappings=[Mapping(str(local), "skills-y")], state_dir=tmp_path / "state")
    with pytest.raises(KeyError):
        async with term as t:
            await t.run("rm -rf ~/skills-y")  # the guard refuses to pull an emptied root
            raise KeyError("block error")
    assert len(term.sync_back_errors) == 1
    assert "empty" in str(term.sync_back_errors[0])
    assert snapshot(local)["web/SKILL.md"] == b"# web\n"


async def test_new_session_pushes_only_what_changed(box: Any, tmp_path: Path) -> None:
    local = tmp_path / "skills"
    skills_tree(local)
    kwargs: dict[str, Any] = dict(ssh_config=box.ssh_config, state_dir=tmp_path / "state",
                                  mappings=[Mapping(str(local), "skills-z")])
    async with SSHTerminal(box.alias, **kwargs):
        pass
    write(local / "web" / "SKILL.md", "one change\n")
    async with SSHTerminal(box.alias, **kwargs) as t:
        assert t.reports[0].uploaded == 1
    assert (box.home / "skills-z" / "web" / "SKILL.md").read_text() == "one change\n"


async def test_sync_before_run_pushes_rate_limited(box: Any, tmp_path: Path) -> None:
    local = tmp_path / "skills"
    skills_tree(local)
    async with SSHTerminal(box.alias, ssh_config=box.ssh_config, sync_before_run=True,
                           sync_interval=0.0, mappings=[Mapping(str(local), "skills-w")],
                           state_dir=tmp_path / "state") as t:
        write(local / "web" / "SKILL.md", "edited between commands\n")
        r = await t.run(f"cat {shlex.quote('skills-w/web/SKILL.md')}")
        assert r.stdout == "edited between commands\n"
