"""The OpenSSH client as filesync's transport, against real sshd containers (needs root).

Each test runs the CLI as a subprocess (``python -m filesync.cli``, own session, no tty,
HOME a temp dir, no ssh-agent unless the test starts one) with ``-F CONFIG``, so that only
the config the test writes decides. What is checked is what ``ssh`` users rely on: their
config applies in full (Include, Match exec, Match final, ProxyJump, ControlMaster,
certificates, hashed known_hosts, KnownHostsCommand, an agent), one login per run, and the
refusals read as one line with the fix.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sshd import SshdContainer
from synctree import skills_tree, snapshot

from filesync.transport.ssh import openssh

pytestmark = pytest.mark.sshd

Factory = Callable[[int], SshdContainer]
REPO = Path(__file__).resolve().parents[2]
BOX = 9  # sshd_factory indexes used by this module
JUMP = 10


def run_cli(home: Path, *args: str, env: dict[str, str] | None = None,
            code: str | None = None) -> subprocess.CompletedProcess[str]:
    """``filesync ARGS`` (or ``python -c CODE ARGS``) in a subprocess without a terminal."""
    full = {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"}
    full.update(HOME=str(home), FILESYNC_SSH_CLIENT="openssh")
    full.update(env or {})
    argv = [sys.executable, "-c", code, *args] if code else [
        sys.executable, "-m", "filesync.cli", *args]
    return subprocess.run(argv, cwd=REPO, env=full, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, start_new_session=True, timeout=300,
                          check=False)


class Run:
    """One local tree, one remote dir in a container, one state dir, one ssh config."""

    def __init__(self, tmp: Path, box: SshdContainer, config: str, host: str,
                 rel: str = "skills") -> None:
        self.home = tmp / "home"
        self.home.mkdir(exist_ok=True)
        self.local = tmp / "local"
        skills_tree(self.local)
        self.config = tmp / "ssh_config"
        self.config.write_text(config)
        self.state = tmp / "state"
        self.remote = box.home / f"{tmp.name}-{rel}"
        self.spec = f"{host}:{self.remote.name}"

    def cli(self, command: str, *extra: str, spec: str | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return run_cli(self.home, command, str(self.local), spec or self.spec, "--json",
                       "--state-dir", str(self.state), "-F", str(self.config), *extra, env=env)

    def ok(self, command: str, *extra: str, **kw: object) -> dict[str, object]:
        done = self.cli(command, *extra, **kw)  # type: ignore[arg-type]
        assert done.returncode == 0, (done.stdout, done.stderr)
        report: dict[str, object] = json.loads(done.stdout)
        return report

    def fails(self, command: str, *extra: str, **kw: object) -> str:
        """The one stderr line of a run that must fail with exit 1."""
        done = self.cli(command, *extra, **kw)  # type: ignore[arg-type]
        assert done.returncode == 1, (done.stdout, done.stderr)
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.startswith("filesync: error: "), done.stderr
        return done.stderr.removeprefix("filesync: error: ").strip()


def block(name: str, box: SshdContainer, *extra: str, hostname: bool = True,
          known: Path | str | None = None, key: Path | None = None) -> str:
    lines = [f"Host {name}"]
    if hostname:
        lines.append(f"    HostName {box.address}")
    lines += [
        "    User root",
        f"    IdentityFile {key or box.client_key}",
        "    IdentitiesOnly yes",
        f"    UserKnownHostsFile {known or box.known_hosts}",
        "    GlobalKnownHostsFile /dev/null",
        *(f"    {line}" for line in extra),
    ]
    return "\n".join(lines) + "\n"


def logins(box: SshdContainer) -> int:
    return box.sshd_log.read_text(errors="replace").count("Accepted publickey")


def expected(run: Run) -> dict[str, bytes]:
    return {p: b for p, b in snapshot(run.local).items() if not p.startswith(".hub/")}


@pytest.fixture
def box(sshd_factory: Factory) -> SshdContainer:
    return sshd_factory(BOX)


# --------------------------------------------------------------------------- the user's config


def test_include_and_one_login_per_run_ended_with_the_run(
    sshd: SshdContainer, tmp_path: Path
) -> None:
    included = tmp_path / "hosts.conf"
    included.write_text(block("inc", sshd))
    run = Run(tmp_path, sshd, f"Include {included}\n", "inc")
    before = logins(sshd)
    done = run.cli("push", "-v")
    assert done.returncode == 0, done.stderr
    assert snapshot(run.remote) == expected(run)
    assert logins(sshd) == before + 1  # every step of the run rode one connection
    found = re.search(r"master pid (\d+)", done.stderr)
    assert found, done.stderr
    assert not Path(f"/proc/{found.group(1)}").exists() or Path(
        f"/proc/{found.group(1)}/stat").read_text().rpartition(")")[2].split()[0] in "ZX"
    socket_dir = re.search(r"socket in (\S+)\)", done.stderr)
    assert socket_dir and not Path(socket_dir.group(1)).exists()


def test_runtime_dir_is_private_and_leftovers_of_killed_runs_are_swept(
    sshd: SshdContainer, tmp_path: Path
) -> None:
    runtime = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))  # short: socket paths
    try:
        base = runtime / "filesync"
        base.mkdir(mode=0o700)
        stale, fresh = base / "ssh-stale", base / "ssh-fresh"
        for leftover in (stale, fresh):
            leftover.mkdir(mode=0o700)
            (leftover / "master.log").write_text("debug1: ...\n")
        os.utime(stale / "master.log", (1, 1))
        run = Run(tmp_path, sshd, block("rt", sshd), "rt")
        done = run.cli("push", "-v", env={"XDG_RUNTIME_DIR": str(runtime)})
        assert done.returncode == 0, done.stderr
        used = re.search(r"socket in (\S+)\)", done.stderr)
        assert used and Path(used.group(1)).parent == base, done.stderr
        assert base.stat().st_mode & 0o777 == 0o700
        assert sorted(p.name for p in base.iterdir()) == ["ssh-fresh"]
    finally:
        shutil.rmtree(runtime, ignore_errors=True)


def test_match_exec_and_match_final_apply(sshd: SshdContainer, tmp_path: Path) -> None:
    # The address comes only from `Match exec`, the key only from `Match final`: without
    # either, the push cannot log in.
    without_key = [line for line in block("viaexec", sshd, hostname=False).splitlines()
                   if "IdentityFile" not in line]
    config = "\n".join([
        f'Match host viaexec exec "test -r {sshd.known_hosts}"',
        f"    HostName {sshd.address}",
        *without_key,
        f"Match final host {sshd.address}",
        f"    IdentityFile {sshd.client_key}",
        "",
    ])
    run = Run(tmp_path, sshd, config, "viaexec")
    assert run.ok("push")["uploaded"] == 8


def test_interactive_only_settings_do_not_break_the_steps(
    sshd: SshdContainer, tmp_path: Path
) -> None:
    # Fine for `ssh host`, fatal for `ssh host COMMAND` with a binary stream on stdin.
    config = block("shell", sshd, "RemoteCommand echo hello", "StdinNull yes", "RequestTTY yes")
    run = Run(tmp_path, sshd, config, "shell")
    assert run.ok("push")["uploaded"] == 8
    assert snapshot(run.remote) == expected(run)


def test_alias_and_explicit_form_share_one_state(sshd: SshdContainer, tmp_path: Path) -> None:
    config = block("named", sshd) + block(sshd.address, sshd, hostname=False)
    run = Run(tmp_path, sshd, config, "named")
    run.ok("push")
    status = run.ok("status", spec=f"ssh://root@{sshd.address}:22/root/{run.remote.name}")
    assert status["plan"] == []
    # the other client computes the same identity, so it finds the same state too
    status = run.ok("status", env={"FILESYNC_SSH_CLIENT": "asyncssh"})
    assert status["plan"] == []
    assert len(list((run.state / "pairs").iterdir())) == 1


def test_proxyjump_through_a_second_container(sshd_factory: Factory, tmp_path: Path) -> None:
    target, jump = sshd_factory(BOX), sshd_factory(JUMP)
    link_namespaces(jump, target)
    config = block("hop", jump) + block("far", target, "ProxyJump hop")
    run = Run(tmp_path, target, config, "far")
    before = logins(jump)
    assert run.ok("push")["uploaded"] == 8
    assert snapshot(run.remote) == expected(run)
    assert logins(jump) == before + 1
    # The target saw the login come from the jump's side of the link, not from this host.
    assert f"Accepted publickey for root from {jump_side(target)} " in target.sshd_log.read_text()


def jump_side(target: SshdContainer) -> str:
    return f"10.203.{target.index}.3"


def link_namespaces(jump: SshdContainer, target: SshdContainer) -> None:
    """A veth pair from inside ``jump`` straight to ``target``: ``jump`` reaches target's
    address over it (as 10.203.<t>.3), without any forwarding on this host."""
    j_end, t_end = f"fsj{jump.index}j", f"fsj{jump.index}t"
    subprocess.run(["ip", "link", "add", j_end, "netns", str(jump.ns_pid), "type", "veth",
                    "peer", "name", t_end, "netns", str(target.ns_pid)], check=True)
    mine = jump_side(target)
    for box, script in (
        (jump, f"ip addr add {mine}/32 dev {j_end} && ip link set {j_end} up && "
               f"ip route add {target.address}/32 dev {j_end} src {mine}"),
        (target, f"ip link set {t_end} up && ip route add {mine}/32 dev {t_end}"),
    ):
        done = box.run_inside(script)
        assert done.returncode == 0, done.stderr


def test_a_running_controlmaster_is_ridden_and_left_running(
    sshd: SshdContainer, tmp_path: Path
) -> None:
    control = Path(tempfile.mkdtemp(prefix="cm", dir="/tmp")) / "%C"  # short: a socket path
    run = Run(tmp_path, sshd, block("mux", sshd, f"ControlPath {control}",
                                    "ControlMaster auto"), "mux")
    ssh = ["ssh", "-F", str(run.config)]
    started = subprocess.run([*ssh, "-M", "-N", "-f", "-o", "ControlPersist=120", "mux"],
                             stdin=subprocess.DEVNULL, capture_output=True, text=True,
                             timeout=60, check=False)
    assert started.returncode == 0, started.stderr
    try:
        before = logins(sshd)
        assert run.ok("push")["uploaded"] == 8
        assert run.ok("status")["plan"] == []
        assert logins(sshd) == before  # no new login: both runs rode the user's master
        check = subprocess.run([*ssh, "-O", "check", "mux"], stdin=subprocess.DEVNULL,
                               capture_output=True, text=True, timeout=60, check=False)
        assert check.returncode == 0, check.stderr  # and it is still theirs, running
    finally:
        subprocess.run([*ssh, "-O", "exit", "mux"], stdin=subprocess.DEVNULL,
                       capture_output=True, timeout=60, check=False)
        shutil.rmtree(control.parent, ignore_errors=True)


def test_hashed_known_hosts(sshd: SshdContainer, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(sshd.known_hosts.read_text())
    subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(known)], check=True,
                   capture_output=True)
    assert known.read_text().startswith("|1|") and sshd.address not in known.read_text()
    run = Run(tmp_path, sshd, block("hashed", sshd, known=known), "hashed")
    assert run.ok("push")["uploaded"] == 8


def test_known_hosts_command(sshd: SshdContainer, tmp_path: Path) -> None:
    source = tmp_path / "from-command"
    source.write_text("")
    config = block("cmd", sshd, f"KnownHostsCommand /bin/cat {source}", known="/dev/null")
    run = Run(tmp_path, sshd, config, "cmd")
    assert "is unknown" in run.fails("push")  # the command vouches for nothing yet
    source.write_text(sshd.known_hosts.read_text())
    assert run.ok("push")["uploaded"] == 8


# --------------------------------------------------------------------------- certificates


@pytest.fixture
def ca(tmp_path: Path) -> Path:
    key = tmp_path / "host_ca"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)],
                   check=True)
    return key


def test_certified_host_trusted_through_cert_authority(
    box: SshdContainer, ca: Path, tmp_path: Path
) -> None:
    box.certify_host_key(ca)
    known = tmp_path / "known_hosts"
    ca_pub = " ".join(ca.with_suffix(".pub").read_text().split()[:2])
    known.write_text(f"@cert-authority {box.address} {ca_pub}\n")
    run = Run(tmp_path, box, block("certified", box, known=known), "certified")
    assert run.ok("push")["uploaded"] == 8
    assert known.read_text() == f"@cert-authority {box.address} {ca_pub}\n"


def test_first_contact_with_certified_host_accepts_then_remembers(
    box: SshdContainer, ca: Path, tmp_path: Path
) -> None:
    box.certify_host_key(ca)
    known = tmp_path / "known_hosts"
    known.write_text("")
    run = Run(tmp_path, box, block("newcert", box, "StrictHostKeyChecking yes", known=known),
              "newcert")
    assert "is unknown" in run.fails("push")
    assert run.ok("push", "--accept-new-host-key")["uploaded"] == 8
    assert box.host_key_pub in known.read_text()
    write_edit = run.local / "web" / "SKILL.md"
    write_edit.write_text("second run\n")
    assert run.ok("push")["uploaded"] == 1  # the stored key now vouches, no flag needed


# --------------------------------------------------------------------------- keys and agents


def encrypted_copy(box: SshdContainer, tmp_path: Path) -> Path:
    key = tmp_path / "locked_key"
    key.write_bytes(box.client_key.read_bytes())
    key.chmod(0o600)
    key.with_name("locked_key.pub").write_bytes(box.client_key_pub.read_bytes())
    subprocess.run(["ssh-keygen", "-q", "-p", "-P", "", "-N", "sesame", "-f", str(key)],
                   check=True, capture_output=True)
    return key


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Path]:
    sock = tmp_path / "agent.sock"
    proc = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    try:
        for _ in range(5000):
            if sock.exists():
                break
            try:
                proc.wait(timeout=0.01)
                break
            except subprocess.TimeoutExpired:
                continue
        assert sock.exists(), "ssh-agent did not start"
        yield sock
    finally:
        proc.kill()
        proc.wait()


def test_passphrase_key_without_agent_says_ssh_add(sshd: SshdContainer, tmp_path: Path) -> None:
    key = encrypted_copy(sshd, tmp_path)
    run = Run(tmp_path, sshd, block("locked", sshd, key=key), "locked")
    message = run.fails("push")
    assert f"the key {key} is passphrase-protected" in message
    assert f"`ssh-add {key}`" in message and "from a terminal" in message


def test_passphrase_key_served_by_ssh_agent(
    sshd: SshdContainer, tmp_path: Path, agent: Path
) -> None:
    key = encrypted_copy(sshd, tmp_path)
    askpass = tmp_path / "askpass"
    askpass.write_text("#!/bin/sh\necho sesame\n")
    askpass.chmod(0o700)
    added = subprocess.run(
        ["ssh-add", str(key)], stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=60, start_new_session=True, check=False,
        env={**os.environ, "SSH_AUTH_SOCK": str(agent), "SSH_ASKPASS": str(askpass),
             "SSH_ASKPASS_REQUIRE": "force"},
    )
    assert added.returncode == 0, added.stderr
    run = Run(tmp_path, sshd, block("agented", sshd, key=key), "agented")
    assert run.ok("push", env={"SSH_AUTH_SOCK": str(agent)})["uploaded"] == 8


# --------------------------------------------------------------------------- refusals


def test_unknown_host_key_is_one_line_with_keyscan_and_flag(
    sshd: SshdContainer, tmp_path: Path
) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("")
    run = Run(tmp_path, sshd, block("fresh", sshd, known=known), "fresh")
    message = run.fails("push")
    fingerprint = subprocess.run(["ssh-keygen", "-lf", str(sshd.host_key) + ".pub"],
                                 capture_output=True, text=True, check=True).stdout.split()[1]
    assert f"host key of root@fresh ({sshd.address}) is unknown (ssh-ed25519 {fingerprint})" \
        in message
    assert f"`ssh-keyscan -t ed25519 {sshd.address} >> {known}`" in message
    assert "--accept-new-host-key" in message and not run.remote.exists()
    assert known.read_text() == ""


def test_changed_host_key_is_one_line_with_keygen_remove(
    sshd: SshdContainer, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)],
                   check=True)
    known = tmp_path / "known_hosts"
    stale = f"{sshd.address} {' '.join(other.with_suffix('.pub').read_text().split()[:2])}\n"
    known.write_text(stale)
    run = Run(tmp_path, sshd, block("moved", sshd, known=known), "moved")
    for extra in ((), ("--accept-new-host-key",)):
        message = run.fails("push", *extra)
        assert "CHANGED" in message and "man-in-the-middle" in message
        assert f"`ssh-keygen -R '{sshd.address}' -f {known}`" in message
    assert known.read_text() == stale and not run.remote.exists()


def test_refused_key_says_what_was_tried(sshd: SshdContainer, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong)],
                   check=True)
    run = Run(tmp_path, sshd, block("denied", sshd, key=wrong), "denied")
    message = run.fails("push")
    assert message.startswith(f"authentication as root on root@denied ({sshd.address}) "
                              f"failed (tried: {wrong})")
    assert "-i KEY" in message and "ssh-add" in message


def test_a_bad_config_is_one_line(sshd: SshdContainer, tmp_path: Path) -> None:
    run = Run(tmp_path, sshd, block("bad", sshd, "NoSuchOption yes"), "bad")
    message = run.fails("push")
    assert "Bad configuration option: nosuchoption" in message and "fix the ssh config" in message


# --------------------------------------------------------------------------- the process itself


def test_openssh_path_imports_neither_asyncssh_nor_cryptography(
    sshd: SshdContainer, tmp_path: Path
) -> None:
    # Nor ctypes: only a watch trims its heap (``filesync.host.heap``); nor what explains
    # a failed login (``openssh_errors``): a run that succeeds does not load them.
    run = Run(tmp_path, sshd, block("light", sshd), "light")
    code = (
        "import json, sys\n"
        "from filesync.cli.main import main\n"
        "rc = main(sys.argv[1:])\n"
        "print(json.dumps({'rc': rc, 'loaded': sorted(m for m in sys.modules\n"
        "    if m.split('.')[0] in ('asyncssh', 'cryptography', 'ctypes')\n"
        "    or m == 'filesync.transport.ssh.openssh_errors')}))\n"
    )
    done = run_cli(run.home, "push", str(run.local), run.spec, "-q", "--state-dir",
                   str(run.state), "-F", str(run.config), code=code)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {"rc": 0, "loaded": []}
    assert snapshot(run.remote) == expected(run)


async def test_liveness_defaults_fill_only_the_gaps(sshd: SshdContainer, tmp_path: Path) -> None:
    for extra, wanted in (((), True), (("ServerAliveInterval 5",), False)):
        config = tmp_path / f"config{len(extra)}"
        config.write_text(block("alive", sshd, *extra))
        conduit = await openssh.connect("alive", ssh_config=config)
        try:
            argv = Path(f"/proc/{conduit.master.pid}/cmdline").read_bytes().split(b"\0")
            assert (b"ServerAliveInterval=15" in argv) is wanted, argv
            assert not any(a.startswith((b"KexAlgorithms", b"Ciphers")) for a in argv)
            done = await conduit.run("echo ok")
            assert (done.returncode, done.stdout) == (0, b"ok\n")
        finally:
            await conduit.close()
        assert not conduit.alive


# --------------------------------------------------------------------------- choosing the client


def test_client_choice_errors_are_one_line(tmp_path: Path) -> None:
    local = tmp_path / "local"
    local.mkdir()
    argv = ("push", str(local), "somehost:x", "-F", "/dev/null", "--state-dir",
            str(tmp_path / "state"))
    bogus = run_cli(tmp_path, *argv, env={"FILESYNC_SSH_CLIENT": "putty"})
    assert bogus.returncode == 2
    assert bogus.stderr == ("filesync: error: FILESYNC_SSH_CLIENT='putty' is not a client; "
                            "set it to openssh or asyncssh\n")
    no_ssh = tmp_path / "bin"
    no_ssh.mkdir()
    missing = run_cli(tmp_path, *argv, "--ssh-client", "openssh", env={"PATH": str(no_ssh)})
    assert missing.returncode == 1
    assert missing.stderr == ("filesync: error: no ssh binary on PATH; install the OpenSSH "
                              "client (openssh-client) or use --ssh-client asyncssh\n")


# --------------------------------------------------------------------------- the cold start


def test_the_login_starts_before_the_engine_is_imported_and_no_ssh_runs_a_mux_request(
    sshd: SshdContainer, tmp_path: Path
) -> None:
    # Every ssh the run spawns is logged by a wrapper first on PATH.
    calls = tmp_path / "calls"
    wrapper = tmp_path / "bin" / "ssh"
    wrapper.parent.mkdir()
    real = shutil.which("ssh")
    wrapper.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {calls}\nexec {real} "$@"\n')
    wrapper.chmod(0o755)
    run = Run(tmp_path, sshd, block("early", sshd), "early")
    code = (
        "import json, sys\n"
        "from filesync.transport.ssh import openssh_login as login\n"
        "from filesync.cli.main import main\n"
        "seen = []\n"
        "LATER = ('filesync.sync.engine', 'filesync.transport.ssh.openssh_errors')\n"
        "real = login.begin_all\n"
        "def begin_all(*a, **kw):\n"
        "    seen.append(sorted(m for m in LATER if m in sys.modules))\n"
        "    return real(*a, **kw)\n"
        "login.begin_all = begin_all\n"
        "rc = main(sys.argv[1:])\n"
        "print(json.dumps({'rc': rc, 'engine_loaded_at_begin': seen}))\n"
    )
    path = {"PATH": f"{wrapper.parent}:{os.environ['PATH']}"}
    for _ in range(2):  # the first run copies, the second is a no-op
        done = run_cli(run.home, "push", str(run.local), run.spec, "-q", "--state-dir",
                       str(run.state), "-F", str(run.config), code=code, env=path)
        assert done.returncode == 0, done.stderr
        # Neither the engine nor what explains a failed login is loaded before the spawn.
        assert json.loads(done.stdout.splitlines()[-1]) == {
            "rc": 0, "engine_loaded_at_begin": [[]]}
    assert snapshot(run.remote) == expected(run)
    lines = calls.read_text().splitlines()
    assert sum(" -G " in f" {line} " for line in lines) == 2, lines  # one per run
    # Readiness needs no mux round trip, and the run's end is a terminate request on the
    # socket itself: no `ssh -O` process at all.
    assert [line for line in lines if " -O " in f" {line} "] == [], lines


async def test_a_begun_login_is_taken_over_by_connect(sshd: SshdContainer, tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text(block("begun", sshd))
    before = logins(sshd)
    pending = openssh.begin("begun", ssh_config=config)
    assert pending.error is None and pending.master is not None
    workdir = pending.master.workdir
    assert workdir is not None
    conduit = await openssh.connect("begun", ssh_config=config, login=pending)
    try:
        assert pending.taken
        assert conduit.alive  # the login may still be under way: the first command waits
        done = await conduit.run("echo ok")
        assert (done.returncode, done.stdout) == (0, b"ok\n")
        assert conduit.master is pending.master
        assert logins(sshd) == before + 1
    finally:
        await conduit.close()
    assert not conduit.alive and not workdir.exists()
    # A login is taken over once; one begun with other arguments is ended, not ridden.
    other = openssh.begin("begun", ssh_config=config, accept_new_host_key=True)
    for login in (pending, other):
        again = await openssh.connect("begun", ssh_config=config, login=login)
        try:
            assert again.master.workdir not in (workdir, None)
            assert again.master is not other.master
        finally:
            await again.close()
    assert other.master is not None and not other.master.alive
    # begun, then one each (the one begun with other arguments may have logged in too,
    # before it was ended)
    assert logins(sshd) - before in (3, 4)


def test_a_begun_login_nobody_takes_over_or_closes_ends_with_the_process(
    sshd: SshdContainer, tmp_path: Path
) -> None:
    config = tmp_path / "config"
    config.write_text(block("orphan", sshd))
    code = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from filesync.transport.ssh import openssh\n"
        "p = openssh.begin('orphan', ssh_config=Path(sys.argv[1]))\n"
        "assert p.master is not None and p.master.workdir is not None\n"
        "while not (p.master.workdir / 'sock').exists():\n"  # logged in
        "    assert p.master.alive\n"
        "    time.sleep(0.01)\n"
        "print(p.master.workdir)\n"
    )
    done = run_cli(tmp_path, str(config), code=code)
    assert done.returncode == 0, done.stderr
    workdir = done.stdout.strip()
    assert workdir
    deadline = time.monotonic() + 30  # the process is gone; the master may lag a little
    while (left := _running_with(workdir.encode())) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left
    # The master removed its socket; only its log is left, which a later run sweeps.
    assert not (Path(workdir) / "sock").exists()


def _running_with(mark: bytes) -> list[str]:
    """Live processes whose command line contains ``mark``."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and mark in (proc / "cmdline").read_bytes() and \
                    (proc / "stat").read_text().rpartition(")")[2].split()[0] not in "ZX":
                found.append(proc.name)
        except OSError:
            continue
    return found


def test_a_command_failing_before_it_connects_ends_its_begun_login(
    sshd: SshdContainer, tmp_path: Path
) -> None:
    run = Run(tmp_path, sshd, block("failing", sshd), "failing")
    not_a_dir = tmp_path / "file"
    not_a_dir.symlink_to(tmp_path / "gone")  # a dangling link: refused once connected
    code = (
        "import json, sys\n"
        "from filesync.transport.ssh import openssh_login as login\n"
        "from filesync.cli.main import main\n"
        "begun = []\n"
        "real = login.begin_all\n"
        "def begin_all(*a, **kw):\n"
        "    begun.extend(real(*a, **kw))\n"
        "    return begun\n"
        "login.begin_all = begin_all\n"
        "rc = main(sys.argv[1:])\n"  # a dangling LOCAL: a usage error, after the begin
        "dirs = [p.master.workdir for p in begun if p.master is not None]\n"
        "print(json.dumps({'rc': rc, 'dirs': [str(d) for d in dirs],\n"
        "                  'left': [str(d) for d in dirs if d.exists()]}))\n"
    )
    done = run_cli(run.home, "push", str(not_a_dir), run.spec, "-q", "--state-dir",
                   str(run.state), "-F", str(run.config), code=code)
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["rc"] == 2 and len(result["dirs"]) == 1 and result["left"] == [], result
    deadline = time.monotonic() + 30
    while (left := _running_with(result["dirs"][0].encode())) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left


# --------------------------------------------------------------------------- bulk pipes


def _pipe_size(transport: object) -> int:
    import fcntl

    pipe = transport.get_extra_info("pipe")  # type: ignore[attr-defined]
    return int(fcntl.fcntl(pipe.fileno(), fcntl.F_GETPIPE_SZ))


async def test_only_pipes_that_carry_bulk_data_are_widened(
    sshd: SshdContainer, tmp_path: Path
) -> None:
    from filesync.transport.ssh.openssh import _PIPE_SIZE

    config = tmp_path / "config"
    config.write_text(block("bulk", sshd))
    conduit = await openssh.connect("bulk", ssh_config=config)
    try:
        small = await conduit.start("cat > /dev/null")
        bulk = await conduit.start("head -c 300000 /dev/zero; cat > /dev/null")
        default = _pipe_size(small._proc.stdin.transport)  # type: ignore[attr-defined]
        await small.write(b"x" * 100)
        assert _pipe_size(small._proc.stdin.transport) == default < _PIPE_SIZE  # type: ignore[attr-defined]
        await bulk.write(b"x" * (512 << 10))
        assert _pipe_size(bulk._proc.stdin.transport) == _PIPE_SIZE  # type: ignore[attr-defined]
        assert await bulk.readexactly(300000) == bytes(300000)
        out = bulk._proc._transport.get_pipe_transport(1)  # type: ignore[attr-defined]
        assert _pipe_size(out) == _PIPE_SIZE
        for proc in (small, bulk):
            await proc.write_eof()
            assert await proc.wait() == 0
    finally:
        await conduit.close()


def test_the_helper_widens_its_own_pipes() -> None:
    code = ("import fcntl, sys; from filesync.tree.server import _widen_pipes; _widen_pipes(); "
            "print(fcntl.fcntl(0, fcntl.F_GETPIPE_SZ), fcntl.fcntl(1, fcntl.F_GETPIPE_SZ))")
    done = subprocess.run([sys.executable, "-c", code], input="", capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(1 << 20)] * 2


# --------------------------------------------------------------------------- the public opener


async def test_open_ssh_uses_the_cli_s_client_choice(
    sshd: SshdContainer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from filesync import UsageError, open_ssh

    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(sshd.ssh_config, home / "cfg")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("FILESYNC_SSH_CLIENT", raising=False)
    for client, module in ((None, "openssh"), ("asyncssh", "conduit")):
        # a str path with "~", as a framework would pass it
        conduit = await open_ssh(sshd.alias, ssh_config="~/cfg", ssh_client=client)
        try:
            assert type(conduit).__module__.rsplit(".", 1)[-1] == module
            done = await conduit.run("echo ok")
            assert (done.returncode, done.stdout) == (0, b"ok\n")
        finally:
            await conduit.close()
    with pytest.raises(UsageError, match="ssh client 'putty'"):
        await open_ssh(sshd.alias, ssh_config="~/cfg", ssh_client="putty")
