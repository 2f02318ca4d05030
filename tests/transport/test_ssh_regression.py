"""The CLI end to end through a real OpenSSH sshd (``alias:path -F ssh_config``).

The key scenarios of test_sync_local.py over SSH, the reported sync-back bug measured on
the wire, and what a user meets when something is wrong: host key refusals, a wrong key,
nothing listening, no route, a remote root that is a file, a read-only remote directory,
a connection cut mid-transfer, each with both SSH clients (the system ``ssh``, the
default, and asyncssh). HOME is an empty temp dir and there is no ssh-agent, so the
machine's own ~/.ssh never decides an outcome.

Tests that change the container's state (network, mounts, python3) use a private
container from ``sshd_factory``; the others use their own directory in the shared one.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncssh
import pytest
from sshd import SshdContainer
from synctree import Pair, junk_tree, skills_tree, snapshot, write

pytestmark = pytest.mark.sshd

Factory = Callable[[int], SshdContainer]
BOX = 13  # sshd_factory index used by this module
BIG = 64 << 20  # a transfer long enough to be cut in the middle


@pytest.fixture(autouse=True, params=["openssh", "asyncssh"])
def ssh_client(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every scenario runs with both SSH clients, and must read the same."""
    client: str = request.param
    monkeypatch.setenv("FILESYNC_SSH_CLIENT", client)
    return client


@pytest.fixture(autouse=True)
def user_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "userhome"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return home


class SshPair(Pair):
    """A Pair whose remote is ``<alias>:<rel>`` in a container, reached with ``-F``."""

    def __init__(self, local: Path, box: SshdContainer, rel: str, state: Path,
                 config: Path | None = None, host: str | None = None) -> None:
        super().__init__(local, box.home / rel, state)
        self.config = config or box.ssh_config
        self.spec = f"{host or box.alias}:{rel}"

    def run(self, command: str, *extra: str, remote: str | None = None) -> tuple[int, Any]:
        return super().run(command, "-F", str(self.config), *extra, remote=remote or self.spec)

    def fails(self, command: str, *extra: str) -> str:
        """Run a command that must fail with exit 1 and one line; that line's message."""
        code, report = self.run(command, *extra)
        assert code == 1, (code, report, self.stderr)
        assert self.stderr.count("\n") == 1 and "Traceback" not in self.stderr, self.stderr
        assert self.stderr.startswith("filesync: error: ")
        message: str = report["error"]
        return message


def make_pair(tmp_path: Path, box: SshdContainer, rel: str | None = None, **kw: Any) -> SshPair:
    local = tmp_path / "host" / "skills"
    skills_tree(local)
    return SshPair(local, box, rel or f"t-{uuid.uuid4().hex[:8]}/skills", tmp_path / "state",
                   **kw)


@pytest.fixture
def pair(sshd: SshdContainer, tmp_path: Path) -> SshPair:
    return make_pair(tmp_path, sshd)


def host_block(name: str, box: SshdContainer, *extra: str, known: Path | None = None,
               key: Path | None = None) -> str:
    lines = [
        f"Host {name}",
        f"    HostName {box.address}",
        "    User root",
        f"    IdentityFile {key or box.client_key}",
        "    IdentitiesOnly yes",
        f"    UserKnownHostsFile {known or box.known_hosts}",
        "    GlobalKnownHostsFile /dev/null",
        "    BatchMode yes",
        *(f"    {line}" for line in extra),
    ]
    return "\n".join(lines) + "\n"


def temps(root: Path) -> list[str]:
    return [p for p in snapshot(root) if re.search(r"(^|/)\.filesync\.", p)]


# --------------------------------------------------------------------------- scenarios


def test_push_then_noop_keeps_content_modes_and_mtimes(pair: SshPair) -> None:
    write(pair.local / "pdf" / "node_modules" / "x.js", "junk")
    report = pair.ok("push")
    expected = {p: b for p, b in snapshot(pair.local).items()
                if not p.startswith(".hub/") and "node_modules" not in p}
    assert snapshot(pair.remote) == expected and report["uploaded"] == len(expected)
    script = pair.remote / "pdf" / "scripts" / "extract.py"
    assert script.stat().st_mode & 0o777 == 0o755
    src = pair.local / "pdf" / "SKILL.md"
    assert (pair.remote / "pdf" / "SKILL.md").stat().st_mtime_ns == src.stat().st_mtime_ns
    again = pair.ok("push")
    assert (again["uploaded"], again["downloaded"], again["conflicts"]) == (0, 0, [])


def test_a_sealed_noop_over_ssh_compares_nothing_and_a_later_edit_is_found(
    pair: SshPair,
) -> None:
    """The seal holds across ssh sessions (one per run): the helper's reply for an
    unchanged tree is the same bytes, and one changed remote file is a new listing."""
    old_ns = 1_600_000_000_000_000_000  # outside the racy window: the pair may be sealed
    for path in pair.local.rglob("*"):
        if path.is_file():
            os.utime(path, ns=(old_ns, old_ns))
    pair.ok("sync")
    pair.ok("sync")  # finds the pair in sync: seals it
    quiet = pair.ok("sync", "-v")
    assert "nothing to compare" in pair.stderr
    assert (quiet["uploaded"], quiet["downloaded"], quiet["excluded"]) == (0, 0, 1)
    write(pair.remote / "pdf" / "SKILL.md", "# pdf\nedited remotely\n")
    report = pair.ok("sync", "-v")
    assert "nothing to compare" not in pair.stderr and report["downloaded"] == 1
    assert (pair.local / "pdf" / "SKILL.md").read_text() == "# pdf\nedited remotely\n"


def test_sync_conflict_then_resolve_both_ways(pair: SshPair) -> None:
    pair.ok("push")
    write(pair.local / "web" / "SKILL.md", "host edit\n")
    write(pair.remote / "web" / "SKILL.md", "remote edit\n")
    write(pair.local / "pdf" / "SKILL.md", "host only edit\n")
    write(pair.remote / "pdf" / "references" / "api.md", "remote only edit\n")
    report = pair.ok("sync")
    [conflict] = report["conflicts"]
    assert conflict["path"] == "web/SKILL.md"
    assert Path(conflict["saved_to"]).read_text() == "remote edit\n"
    assert (pair.local / "web" / "SKILL.md").read_text() == "host edit\n"
    assert (pair.remote / "web" / "SKILL.md").read_text() == "remote edit\n"
    assert (pair.remote / "pdf" / "SKILL.md").read_text() == "host only edit\n"
    assert (pair.local / "pdf" / "references" / "api.md").read_text() == "remote only edit\n"
    assert pair.ok("status")["open_conflicts"] == ["web/SKILL.md"]
    pair.ok("resolve", "web/SKILL.md", "--keep", "remote")
    assert (pair.local / "web" / "SKILL.md").read_text() == "remote edit\n"
    write(pair.local / "web" / "SKILL.md", "host again\n")
    write(pair.remote / "web" / "SKILL.md", "remote again\n")
    pair.ok("sync")
    pair.ok("resolve", "web/SKILL.md", "--keep", "local")
    assert (pair.remote / "web" / "SKILL.md").read_text() == "host again\n"
    status = pair.ok("status")
    assert (status["plan"], status["open_conflicts"]) == ([], [])


def test_pull_keeps_host_on_conflict_and_push_saves_remote_first(pair: SshPair) -> None:
    pair.ok("push")
    write(pair.local / "web" / "SKILL.md", "host edit\n")
    write(pair.remote / "web" / "SKILL.md", "remote edit\n")
    report = pair.ok("pull")
    assert (pair.local / "web" / "SKILL.md").read_text() == "host edit\n"
    assert Path(report["conflicts"][0]["saved_to"]).read_text() == "remote edit\n"
    report = pair.ok("push")
    assert (pair.remote / "web" / "SKILL.md").read_text() == "host edit\n"
    assert Path(report["conflicts"][0]["saved_to"]).read_text() == "remote edit\n"


def test_deletions_propagate_and_undo_restores_the_last_pull(pair: SshPair) -> None:
    pair.ok("push")
    write(pair.remote / "agent-output.txt", "made remotely\n")
    (pair.local / "web" / "SKILL.md").unlink()
    report = pair.ok("push")
    assert report["deleted_remote"] == 1 and not (pair.remote / "web" / "SKILL.md").exists()
    assert (pair.remote / "agent-output.txt").exists()  # push never deletes remote-only files
    (pair.remote / "pdf" / "references" / "api.md").unlink()
    write(pair.remote / "pdf" / "SKILL.md", "pulled\n")
    before = snapshot(pair.local)
    report = pair.ok("pull")
    assert (report["deleted_local"], report["downloaded"]) == (1, 2)
    assert not (pair.local / "pdf" / "references" / "api.md").exists()
    assert (pair.local / "pdf" / "SKILL.md").read_text() == "pulled\n"
    code, _ = pair.run("undo")
    assert code == 0
    assert snapshot(pair.local) == before  # the pulled new file is taken back too


def test_exclusion_rules_over_ssh(pair: SshPair) -> None:
    write(pair.local / "big.log", "log\n")
    write(pair.local / "cache" / "x.bin", "bin\n")
    write(pair.local / ".filesyncignore", "cache/\n")
    write(pair.local / "node_modules" / "kept.js", "js\n")
    pair.ok("push", "--exclude", "*.log", "--no-default-excludes")
    remote = snapshot(pair.remote)
    assert "big.log" not in remote and "cache/x.bin" not in remote
    assert "node_modules/kept.js" in remote and ".hub/lock.json" in remote
    write(pair.remote / "remote.log", "stays remote\n")
    write(pair.remote / "cache" / "y.bin", "stays remote\n")
    pair.ok("pull", "--exclude", "*.log", "--no-default-excludes")
    assert not (pair.local / "remote.log").exists()
    assert not (pair.local / "cache" / "y.bin").exists()


def test_reported_bug_excluded_bytes_never_cross_the_wire(
    pair: SshPair, sshd: SshdContainer
) -> None:
    """After a push, the remote gains bookkeeping next to a real edit and a new skill."""
    pair.ok("push")
    host_lock = (pair.local / ".hub" / "lock.json").read_bytes()
    junk = junk_tree(pair.remote, curator_mb=24)
    write(pair.remote / "pdf" / "SKILL.md", "# pdf\nedited remotely\n")
    write(pair.remote / "newskill" / "SKILL.md", "# new\n")
    write(pair.remote / "newskill" / "scripts" / "run.sh", "echo hi\n", 0o755)
    before = snapshot(pair.local)
    wire = sshd.wire_bytes()
    report = pair.ok("pull")
    moved = sshd.wire_bytes() - wire
    after = snapshot(pair.local)
    assert {p for p in after if before.get(p) != after[p]} == {
        "pdf/SKILL.md", "newskill/SKILL.md", "newskill/scripts/run.sh"}
    assert (pair.local / ".hub" / "lock.json").read_bytes() == host_lock
    assert not (pair.local / ".curator_backups").exists()
    assert not (pair.local / "pdf" / "node_modules").exists()
    assert report["downloaded"] == 3
    assert moved < (1 << 20) < junk, moved
    assert (pair.local / "newskill" / "scripts" / "run.sh").stat().st_mode & 0o777 == 0o755


# --------------------------------------------------------------------------- refusals


def test_unknown_host_key_is_refused_then_accepted_on_request(
    sshd: SshdContainer, tmp_path: Path
) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("")
    config = tmp_path / "config"
    config.write_text(host_block("box", sshd, known=known))
    pair = make_pair(tmp_path, sshd, config=config, host="box")
    before = snapshot(pair.local)
    message = pair.fails("push")
    assert "host key of root@box" in message and "is unknown" in message
    assert f"ssh-keyscan -t ed25519 {sshd.address} >> {known}" in message
    assert "--accept-new-host-key" in message
    assert known.read_text() == "" and not pair.remote.exists()
    assert snapshot(pair.local) == before
    assert pair.ok("push", "--accept-new-host-key")["uploaded"] == 8
    assert known.read_text() == sshd.known_hosts.read_text()


def test_changed_host_key_is_refused_even_with_accept_new(
    sshd: SshdContainer, tmp_path: Path
) -> None:
    impostor = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
    known = tmp_path / "known_hosts"
    known.write_text(f"{sshd.address} {impostor}\n")
    config = tmp_path / "config"
    config.write_text(host_block("box", sshd, known=known))
    pair = make_pair(tmp_path, sshd, config=config, host="box")
    for extra in ((), ("--accept-new-host-key",)):
        message = pair.fails("push", *extra)
        assert "CHANGED" in message and "man-in-the-middle" in message
        assert f"ssh-keygen -R '{sshd.address}' -f {known}" in message
    assert known.read_text() == f"{sshd.address} {impostor}\n"
    assert not pair.remote.exists()


def test_wrong_key_fails_authentication(sshd: SshdContainer, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong_key"
    asyncssh.generate_private_key("ssh-ed25519").write_private_key(wrong)
    config = tmp_path / "config"
    config.write_text(host_block("box", sshd, key=wrong))
    pair = make_pair(tmp_path, sshd, config=config, host="box")
    message = pair.fails("pull")
    assert "authentication as root on root@box" in message and str(wrong) in message
    assert "-i KEY" in message
    assert not pair.remote.exists()


def test_nothing_listening_is_refused(sshd: SshdContainer, tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text(host_block("box", sshd, "Port 2222"))
    pair = make_pair(tmp_path, sshd, config=config, host="box")
    message = pair.fails("push")
    assert f"{sshd.address}:2222) refused" in message


def test_unreachable_network_is_one_line(sshd_factory: Factory, tmp_path: Path) -> None:
    box = sshd_factory(BOX)
    box.link_down()
    pair = make_pair(tmp_path, box)
    message = pair.fails("push")
    # The container's fallback route refuses locally: nothing leaves by the default route.
    assert re.search(r"No route to host|Network is unreachable", message), message
    assert box.address in message and "check the network" in message
    box.link_up()
    assert pair.ok("push")["uploaded"] == 8


def test_remote_root_that_is_a_file(pair: SshPair) -> None:
    write(pair.remote, "I am a file\n")
    message = pair.fails("push")
    assert "is not a directory" in message
    assert pair.remote.read_text() == "I am a file\n"


def test_read_only_remote_directory_fails_that_file_then_converges(
    pair: SshPair, sshd: SshdContainer
) -> None:
    pair.ok("push")
    write(pair.local / "pdf" / "SKILL.md", "host edit\n")
    write(pair.local / "web" / "SKILL.md", "host edit too\n")
    inside = f"/root/{pair.remote.relative_to(sshd.home)}/pdf"
    mounted = sshd.run_inside(f"mount --bind {inside} {inside} && "
                              f"mount -o remount,ro,bind {inside}")
    assert mounted.returncode == 0, mounted.stderr
    try:
        message = pair.fails("push")
        assert message.startswith("upload of pdf/SKILL.md failed: Read-only file system")
        assert (pair.remote / "web" / "SKILL.md").read_text() == "host edit too\n"
        assert (pair.remote / "pdf" / "SKILL.md").read_text() == "# pdf\nextract text\n"
    finally:
        sshd.run_inside(f"umount {inside}")
    assert pair.ok("push")["uploaded"] == 1
    assert (pair.remote / "pdf" / "SKILL.md").read_text() == "host edit\n"
    assert temps(pair.remote) == []


# --------------------------------------------------------------------------- cut connections


def cut_when(box: SshdContainer, ready: Callable[[], bool]) -> threading.Thread:
    """Kill every ssh session of ``box`` as soon as ``ready()`` (polled) is true."""

    def watch() -> None:
        for _ in range(200_000):
            if ready():
                box.kill_sessions()
                return
            threading.Event().wait(0.001)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_connection_cut_mid_push_then_rerun_converges(pair: SshPair, sshd: SshdContainer) -> None:
    pair.ok("push")
    big = os.urandom(BIG)
    write(pair.local / "web" / "assets" / "video.bin", big)
    write(pair.local / "pdf" / "SKILL.md", "host edit\n")
    remote_before = snapshot(pair.remote)

    def uploading() -> bool:
        assets = pair.remote / "web" / "assets"
        return any(p.name.startswith(".filesync.") and p.stat().st_size > 0
                   for p in assets.iterdir())

    watcher = cut_when(sshd, uploading)
    message = pair.fails("push")
    watcher.join()
    assert "lost" in message and "rerun" in message
    # Every remote file holds its old or its new content; the big one is not there half.
    now = snapshot(pair.remote)
    assert "web/assets/video.bin" not in now
    for path, data in now.items():
        if not re.search(r"(^|/)\.filesync\.", path):
            assert data in (remote_before.get(path), (pair.local / path).read_bytes()), path
    report = pair.ok("push")
    assert report["uploaded"] >= 1
    assert (pair.remote / "web" / "assets" / "video.bin").read_bytes() == big
    assert (pair.remote / "pdf" / "SKILL.md").read_text() == "host edit\n"
    assert temps(pair.remote) == []
    assert pair.ok("status")["plan"] == []


def test_connection_cut_mid_pull_then_rerun_converges(pair: SshPair, sshd: SshdContainer) -> None:
    pair.ok("push")
    big = os.urandom(BIG)
    write(pair.remote / "web" / "assets" / "video.bin", big)
    write(pair.remote / "pdf" / "SKILL.md", "remote edit\n")
    local_before = snapshot(pair.local)

    def staging() -> bool:
        return any(p.stat().st_size > 0 for p in pair.state.glob("pairs/*/staging/*/*"))

    watcher = cut_when(sshd, staging)
    message = pair.fails("pull")
    watcher.join()
    assert "lost" in message and "rerun" in message
    assert snapshot(pair.local) == local_before  # nothing applied from a cut pull
    report = pair.ok("pull")
    assert report["downloaded"] == 2
    assert (pair.local / "web" / "assets" / "video.bin").read_bytes() == big
    assert (pair.local / "pdf" / "SKILL.md").read_text() == "remote edit\n"
    assert pair.ok("status")["plan"] == []


# --------------------------------------------------------------------------- the remote's setup


def test_push_into_hermes_skills_leaves_the_remote_home_alone(
    sshd_factory: Factory, tmp_path: Path
) -> None:
    box = sshd_factory(BOX)
    umask = os.umask(0)
    os.umask(umask)
    pair = make_pair(tmp_path, box, rel=".hermes/skills", host=None)
    pair.spec = f"{box.alias}:~/.hermes/skills"
    assert box.home.stat().st_mode & 0o777 == 0o700
    assert pair.ok("push")["uploaded"] == 8
    assert box.home.stat().st_mode & 0o777 == 0o700
    assert (box.home / ".hermes").stat().st_mode & 0o777 == 0o777 & ~umask
    assert (box.home / ".ssh").stat().st_mode & 0o777 == 0o700


def test_remote_without_python3_uses_the_posix_fallback(
    sshd_factory: Factory, tmp_path: Path
) -> None:
    box = sshd_factory(BOX)
    for directory in ("/usr/local/bin", "/usr/bin"):
        for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
            if re.fullmatch(r"python3(\.\d+)?", name):
                box.whiteout(f"{directory}/{name}")
    assert box.run_inside("command -v python3 || echo none").stdout.strip() == "none"
    pair = make_pair(tmp_path, box)
    assert pair.ok("push", "-v")["uploaded"] == 8
    assert "remote has no python3: using the POSIX fallback (sh, find, tar)" in pair.stderr
    write(pair.remote / "pdf" / "SKILL.md", "remote edit\n")
    assert pair.ok("pull")["downloaded"] == 1
    assert (pair.local / "pdf" / "SKILL.md").read_text() == "remote edit\n"


def test_host_alias_from_ssh_config_works_like_ssh(sshd: SshdContainer, tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text(host_block("skills-box", sshd))
    ssh = subprocess.run(["ssh", "-F", str(config), "skills-box", "echo ok; hostname"],
                         capture_output=True, text=True, timeout=60, check=False,
                         stdin=subprocess.DEVNULL)
    assert (ssh.returncode, ssh.stdout) == (0, "ok\nremote\n"), ssh.stderr
    pair = make_pair(tmp_path, sshd, config=config, host="skills-box")
    assert pair.ok("push")["uploaded"] == 8
    write(pair.remote / "web" / "SKILL.md", "remote edit\n")
    # The same tree by URL, absolute path, through the same config.
    url = f"ssh://root@skills-box/root/{pair.remote.relative_to(sshd.home)}"
    code, _report = Pair.run(pair, "pull", "-F", str(config), remote=url)
    assert code == 0, pair.stderr
    assert (pair.local / "web" / "SKILL.md").read_text() == "remote edit\n"
