"""The OpenSSH ControlMaster's lifetime, riding the caller's master, and the deadline on a
remote that never says hello; against real sshd containers (needs root).

- a master filesync started ends through its socket: a terminate request in the socket's
  own protocol, or ``ssh -O exit`` where that is not answered; never a signal to a pid (a
  guard like the agent framework's test guard refuses signals outside this process's own
  tree);
- it never outlives the process that started it, SIGKILL included: the remote is left
  with no sshd session and no process of it (the old design kept both for ControlPersist,
  60 s);
- a ``Session`` given the caller's ControlPath rides the caller's master: sshd logs one
  login in all, and the caller's master still runs afterwards;
- a remote ``python3`` that reads its input and never answers ends a run after
  ``--idle-timeout`` with one line and exit 1, and nothing of it is left on the remote.

The figures (seconds until the remote has no session left after SIGKILL, until the silent
run exits) are printed; run with ``-s`` to see them.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sshd import SshdContainer
from synctree import write

from filesync import AsyncSession, Mapping, Session
from filesync.errors import UsageError
from filesync.transport.ssh.options import check_ssh_options

pytestmark = pytest.mark.sshd

Factory = Callable[[int], SshdContainer]
REPO = Path(__file__).resolve().parents[2]
BOX = 12  # sshd_factory index used by this module
#: How long the remote may keep anything of a SIGKILLed client's connection: well under
#: the 60 s ControlPersist that kept the old daemonized master (and its sshd session)
#: alive, and generous for a loaded machine (the chain of end-of-input takes milliseconds).
ORPHAN_DEADLINE = 30.0


@pytest.fixture
def box(sshd_factory: Factory) -> Iterator[SshdContainer]:
    container = sshd_factory(BOX)
    yield container
    (container.home / ".ssh" / "environment").unlink(missing_ok=True)


def logins(box: SshdContainer) -> int:
    return box.sshd_log.read_text(errors="replace").count("Accepted publickey")


def remote_processes(box: SshdContainer) -> list[str]:
    """Every live process in the container's pid namespace but its sshd listener."""
    ns = os.stat(f"/proc/{box.ns_pid}/ns/pid").st_ino
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == box.ns_pid:
            continue
        try:
            if os.stat(f"/proc/{entry.name}/ns/pid").st_ino != ns:
                continue
            state = Path(f"/proc/{entry.name}/stat").read_text().rpartition(")")[2].split()[0]
            cmd = Path(f"/proc/{entry.name}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:  # ended meanwhile
            continue
        if state not in ("Z", "X"):
            found.append(f"{entry.name}: {cmd.decode(errors='replace').strip()}")
    return found


def masters_of(box: SshdContainer) -> list[str]:
    """Live local ssh masters for ``box`` (their command line names its ssh config)."""
    found = []
    for entry in os.scandir("/proc"):
        try:
            if not entry.name.isdigit():
                continue
            argv = Path(f"/proc/{entry.name}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry.name}/stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if (b"ControlMaster=yes" in argv and str(box.ssh_config).encode() in argv
                and state not in "ZX"):
            found.append(entry.name)
    return found


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> float:
    """Poll ``condition``; return the seconds it took, fail after ``timeout``."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            pytest.fail(f"timed out ({timeout:g} s) waiting until {what}")
        time.sleep(0.01)
    return time.monotonic() - started


def env_for(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "userhome"
    home.mkdir(exist_ok=True)
    base = {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"}
    return {**base, "HOME": str(home), "FILESYNC_SSH_CLIENT": "openssh"}


# --------------------------------------------------------------------------- the master's end


@pytest.mark.parametrize("native", [True, False], ids=["terminate request", "ssh -O exit"])
def test_close_ends_the_master_through_its_socket_never_by_a_signal(
    box: SshdContainer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native: bool
) -> None:
    if not native:  # a master that does not answer the request: ``ssh -O exit`` ends it
        from filesync.transport.ssh import master as master_module

        monkeypatch.setattr(master_module, "terminate", lambda *a, **kw: False)
    # Every ssh the session spawns is logged by a wrapper first on PATH.
    calls = tmp_path / "calls"
    wrapper = tmp_path / "bin" / "ssh"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {calls}\n'
                       f'exec {shutil.which("ssh")} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{wrapper.parent}:{os.environ['PATH']}")
    monkeypatch.setenv("FILESYNC_SSH_CLIENT", "openssh")

    # The agent framework's test guard: no signal to a process outside our own tree.
    real_kill, real_killpg = os.kill, os.killpg

    def ours(pid: int) -> bool:
        while pid > 1:
            if pid == os.getpid():
                return True
            try:
                pid = int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
            except OSError:
                return False
        return False

    def guarded_kill(pid: int, sig: int) -> None:
        if sig != 0 and not ours(pid):
            raise AssertionError(f"signal {sig} to pid {pid}, outside this process's tree")
        real_kill(pid, sig)

    def guarded_killpg(pgid: int, sig: int) -> None:
        if not ours(pgid):
            raise AssertionError(f"signal {sig} to group {pgid}, outside this process's tree")
        real_killpg(pgid, sig)

    monkeypatch.setattr(os, "kill", guarded_kill)
    monkeypatch.setattr(os, "killpg", guarded_killpg)
    write(tmp_path / "local" / "a.txt", "a\n")

    async def go() -> int:
        session = AsyncSession(box.alias, ssh_config=box.ssh_config,
                               state_dir=tmp_path / "state")
        report = await session.push(Mapping(tmp_path / "local", "tree"))
        assert report.uploaded == 1
        conduit = session._conduit  # the master's pid, to watch it go
        master = getattr(conduit, "inner", conduit).master
        await session.close()
        return int(master.pid)

    pid = asyncio.run(go())
    assert (box.home / "tree" / "a.txt").read_text() == "a\n"
    exits = [line for line in calls.read_text().splitlines() if " -O " in f" {line} "]
    if native:
        assert exits == []  # no ssh process to end it
    else:
        assert len(exits) == 1 and " -O exit " in f" {exits[0]} ", exits
    wait_until(lambda: not Path(f"/proc/{pid}").exists() or Path(
        f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] in "ZX",
        "the master is gone")
    wait_until(lambda: not remote_processes(box), "the remote has nothing of the session")


_HOLDER = """
import sys, time
from filesync import Mapping, Session
box_alias, config, local, state = sys.argv[1:5]
session = Session(box_alias, ssh_config=config, state_dir=state)
session.push(Mapping(local, "tree"))
print("pushed", flush=True)
time.sleep(3600)  # holds the session (helper and master) open until killed
"""


@pytest.mark.parametrize("holder", ["session", "cli"])
def test_a_sigkilled_process_leaves_no_master_and_nothing_on_the_remote(
    box: SshdContainer, tmp_path: Path, holder: str
) -> None:
    write(tmp_path / "local" / "a.txt", "a\n")
    env = env_for(tmp_path)
    if holder == "session":
        argv = [sys.executable, "-c", _HOLDER, box.alias, str(box.ssh_config),
                str(tmp_path / "local"), str(tmp_path / "state")]
    else:
        # A pull whose remote walk stalls: the run is mid-flight when it is killed.
        from filesync.tree.watchdog import STALL_ENV

        write(box.home / "tree" / "b.txt", "b\n")
        (box.home / ".ssh" / "environment").write_text(f"{STALL_ENV}=list:3600\n")
        argv = [sys.executable, "-m", "filesync.cli", "pull", str(tmp_path / "local"),
                f"{box.alias}:tree", "--state-dir", str(tmp_path / "state"),
                "-F", str(box.ssh_config), "-v"]
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        if holder == "session":
            assert proc.stdout is not None and proc.stdout.readline() == "pushed\n"
        else:
            wait_until(lambda: any("python3" in p for p in remote_processes(box)),
                       "the remote helper runs")
        mine = masters_of(box)
        assert mine  # filesync's own master
        assert box.session_pids()
    finally:
        proc.kill()  # SIGKILL: no close(), no atexit, nothing of filesync runs
        proc.wait()
    took = wait_until(lambda: not box.session_pids() and not remote_processes(box),
                      "the remote has no session and no process left", ORPHAN_DEADLINE)
    print(f"\n[figure] {holder}: remote sessions gone {took:.2f} s after SIGKILL")
    wait_until(lambda: not masters_of(box), "the local master is gone", ORPHAN_DEADLINE)


# --------------------------------------------------------------------------- the caller's master


@pytest.mark.parametrize("spelling", ["-o", "-S"])
def test_a_session_rides_the_callers_master_with_no_second_login(
    box: SshdContainer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spelling: str
) -> None:
    monkeypatch.setenv("FILESYNC_SSH_CLIENT", "openssh")
    control = Path(tempfile.mkdtemp(prefix="cm", dir="/tmp")) / "m"  # short: a socket path
    ssh = ["ssh", "-F", str(box.ssh_config), "-S", str(control)]
    started = subprocess.run([*ssh, "-M", "-N", "-f", box.alias], stdin=subprocess.DEVNULL,
                             capture_output=True, text=True, timeout=60, check=False)
    assert started.returncode == 0, started.stderr
    try:
        assert logins(box) == 1  # the caller's master
        options = (["-o", f"ControlPath={control}"] if spelling == "-o"
                   else ["-S", str(control)])
        write(tmp_path / "local" / "a.txt", "a\n")
        seen: list[str] = []
        with Session(box.alias, ssh_config=box.ssh_config, state_dir=tmp_path / "state",
                     ssh_options=options, log=seen.append) as session:
            assert session.push(Mapping(tmp_path / "local", "tree")).uploaded == 1
            assert session.status(Mapping(tmp_path / "local", "tree")).plan == []
        assert (box.home / "tree" / "a.txt").read_text() == "a\n"
        assert logins(box) == 1, seen  # sshd's log: no second login
        assert any("riding the running ControlMaster" in line for line in seen), seen
        check = subprocess.run([*ssh, "-O", "check", box.alias], stdin=subprocess.DEVNULL,
                               capture_output=True, text=True, timeout=60, check=False)
        assert check.returncode == 0, check.stderr  # still the caller's, still running
    finally:
        subprocess.run([*ssh, "-O", "exit", box.alias], stdin=subprocess.DEVNULL,
                       capture_output=True, timeout=60, check=False)
        shutil.rmtree(control.parent, ignore_errors=True)


def test_without_the_callers_master_running_the_session_logs_in_by_itself(
    box: SshdContainer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FILESYNC_SSH_CLIENT", "openssh")
    control = Path(tempfile.mkdtemp(prefix="cm", dir="/tmp")) / "m"
    try:
        write(tmp_path / "local" / "a.txt", "a\n")
        with Session(box.alias, ssh_config=box.ssh_config, state_dir=tmp_path / "state",
                     ssh_options=["-o", f"ControlPath={control}"]) as session:
            assert session.push(Mapping(tmp_path / "local", "tree")).uploaded == 1
        assert logins(box) == 1
        assert not control.exists()  # filesync's own master kept its own socket
    finally:
        shutil.rmtree(control.parent, ignore_errors=True)


def test_ssh_options_are_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert check_ssh_options(["-o", "ControlPath=/x", "-S/y", "-4", "-qJ", "jump"]) == [
        "-o", "ControlPath=/x", "-o", "ControlPath=/y", "-4", "-q", "-J", "jump"]
    for bad, says in (
        ("-o ControlPath=/x", "not one string"),
        (["host"], "'host' is not an ssh option"),
        (["-o"], "-o needs a value"),
        (["-t"], "-t is not allowed"),
        (["-vN"], "-N is not allowed"),
        (["-M"], "-M is not allowed"),
        (["--", "x"], "'--' is not an ssh option"),
    ):
        with pytest.raises(UsageError, match=says):
            check_ssh_options(bad)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="not one string"):
        Session("somehost", ssh_options="-o ControlPath=/x")  # type: ignore[arg-type]
    monkeypatch.setenv("FILESYNC_SSH_CLIENT", "asyncssh")
    with pytest.raises(UsageError, match="asyncssh"), Session(
            "somehost", ssh_options=["-4"], state_dir=tmp_path / "state") as session:
        session.push(Mapping(tmp_path, "x"))


# --------------------------------------------------------------------------- a silent remote


def test_a_python3_that_never_answers_ends_the_run_with_one_line_and_leaves_nothing(
    box: SshdContainer, tmp_path: Path
) -> None:
    # First on the remote's PATH (sshd applies ~/.ssh/environment: PermitUserEnvironment).
    fake = box.home / "fakebin" / "python3"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\ncat >/dev/null\nsleep 3600\n")  # reads, never answers
    fake.chmod(0o755)
    (box.home / ".ssh" / "environment").write_text(
        "PATH=/root/fakebin:/usr/local/bin:/usr/bin:/bin\n")
    (box.home / "tree").mkdir()
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "filesync.cli", "pull", str(tmp_path / "local"),
         f"{box.alias}:tree", "--state-dir", str(tmp_path / "state"),
         "-F", str(box.ssh_config), "--idle-timeout", "2"],
        cwd=REPO, env=env_for(tmp_path), stdin=subprocess.DEVNULL, capture_output=True,
        text=True, timeout=300, check=False)
    took = time.monotonic() - started
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(
        "filesync: error: the remote helper never answered within 2 s"), proc.stderr
    assert "--idle-timeout" in proc.stderr
    print(f"\n[figure] silent python3, --idle-timeout 2: exit 1 after {took:.2f} s")
    wait_until(lambda: not remote_processes(box), "nothing of the fake python3 is left",
               ORPHAN_DEADLINE)
