"""The persistent agent (``--persist``): same results as a direct run, on kept connections.

Real processes throughout: the CLI client and the agent it starts are subprocesses, the
remote is the namespaced OpenSSH sshd. One test drives the agent's server in-process over
its real Unix socket (no client process) so that its code paths are measured by coverage.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import shutil
import signal
import site
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sshd import SshdContainer
from synctree import snapshot, write

from filesync.agent import server as agent_mod
from filesync.cli.agent_client import fingerprint, safe_dir, socket_path
from filesync.cli.main import main as cli_main
from filesync.errors import FilesyncError

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "filesync.cli"]
#: How long a wait for a condition (a process's exit or answer, a file) may take before the
#: test fails: generous, so that only a condition that never comes fails, never a loaded
#: machine that is slow to get there.
DEADLINE = 120.0


class Client:
    """Runs ``filesync`` subprocesses that share one agent socket and state dir."""

    def __init__(self, tmp: Path) -> None:
        self.sock = tmp / "run" / "agent.sock"
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith("FILESYNC_") and k != "SSH_AUTH_SOCK"}
        self.env.update(FILESYNC_AGENT_SOCKET=str(self.sock),
                        FILESYNC_STATE_DIR=str(tmp / "state"), HOME=str(tmp / "home"))
        (tmp / "home").mkdir(exist_ok=True)

    def run(self, *argv: str, persist: str = "60") -> subprocess.CompletedProcess[str]:
        extra = ["--persist", persist] if persist else []
        return subprocess.run([*CLI, *argv, *extra], env=self.env, capture_output=True,
                              text=True, timeout=DEADLINE, check=False)

    def ok(self, *argv: str) -> dict[str, Any]:
        done = self.run(*argv, "--json")
        assert done.returncode == 0, done.stderr
        report: dict[str, Any] = json.loads(done.stdout)
        return report

    def status(self) -> dict[str, Any]:
        done = subprocess.run([*CLI, "agent", "status", "--json"], env=self.env,
                              capture_output=True, text=True, timeout=DEADLINE, check=False)
        assert done.returncode == 0, (done.stdout, done.stderr)
        status: dict[str, Any] = json.loads(done.stdout)
        return status

    def stop(self) -> None:
        subprocess.run([*CLI, "agent", "stop"], env=self.env, capture_output=True,
                       timeout=DEADLINE, check=False)


@pytest.fixture
def client(tmp_path: Path) -> Iterator[Client]:
    c = Client(tmp_path)
    try:
        yield c
    finally:
        c.stop()


def tree(root: Path, n: int = 30) -> None:
    for i in range(n):
        write(root / f"d{i % 3}" / f"f{i}.txt", f"file {i}\n" * 20)
    write(root / "node_modules" / "junk.js", "excluded\n")


def kept(root: Path) -> dict[str, bytes]:
    """What a push keeps of ``root``: everything but the pruned node_modules."""
    return {k: v for k, v in snapshot(root).items() if not k.startswith("node_modules")}


def remote_spec(box: SshdContainer) -> tuple[str, Path]:
    rel = f"agent-{uuid.uuid4().hex[:8]}"
    return f"{box.alias}:{rel}", box.home / rel


def ssh_setup(box: SshdContainer, tmp_path: Path) -> tuple[Path, str, Path, str]:
    """A 30-file host tree and a fresh remote dir in ``box``: (local, spec, remote, -F)."""
    local = tmp_path / "local"
    tree(local)
    spec, remote = remote_spec(box)
    return local, spec, remote, str(box.ssh_config)


def big_push_under_way(client: Client, local: Path,
                       remote: Path) -> tuple[subprocess.Popen[str], bytes]:
    """Start a push of a 256 MiB file through the agent; return once it is writing."""
    big = os.urandom(1 << 20) * 256
    write(local / "big.bin", big)
    proc = subprocess.Popen([*CLI, "push", str(local), str(remote), "--persist", "60"],
                            env=client.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    _wait_for(lambda: any(p.name.startswith(".filesync.") for p in remote.iterdir())
              or proc.poll() is not None)
    return proc, big


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert "Traceback" not in done.stderr, done.stderr
    assert len(lines) == 1 and lines[0].startswith("filesync: error: "), done.stderr
    return lines[0]


@pytest.mark.sshd
def test_runs_reuse_one_connection_and_match_a_direct_run(
        sshd: SshdContainer, client: Client, tmp_path: Path) -> None:
    local, spec, remote, cfg = ssh_setup(sshd, tmp_path)
    first = client.ok("push", str(local), spec, "-F", cfg)
    assert first["uploaded"] == 30
    write(local / "d0" / "f0.txt", "edited on the host\n")
    time.sleep(2.1)  # outside the racy-timestamp window, so the edit is seen by stat alone
    second = client.ok("push", str(local), spec, "-F", cfg)
    assert second["uploaded"] == 1
    assert snapshot(remote) == kept(local)
    status = client.status()
    assert status["opened"] == 1 and status["requests"] == 2, status
    assert len(status["conduits"]) == 1 and status["conduits"][0].startswith("ssh://"), status
    assert len(sshd.session_pids()) >= 1  # the connection is still open between runs
    # the same pass run directly (no agent) sees the same, in-sync state
    direct = client.run("status", str(local), spec, "-F", cfg, "--json", persist="")
    assert direct.returncode == 0 and json.loads(direct.stdout)["plan"] == []


@pytest.mark.sshd
def test_a_connection_that_died_while_idle_is_replaced(
        sshd: SshdContainer, client: Client, tmp_path: Path) -> None:
    local, spec, remote, cfg = ssh_setup(sshd, tmp_path)
    client.ok("push", str(local), spec, "-F", cfg)
    assert sshd.kill_sessions() >= 1  # the kept connection is cut while the agent idles
    write(local / "d1" / "new.txt", "made after the cut\n")
    report = client.ok("push", str(local), spec, "-F", cfg)
    assert report["uploaded"] == 1
    assert (remote / "d1" / "new.txt").read_text() == "made after the cut\n"
    assert client.status()["opened"] == 2


@pytest.mark.sshd
def test_failures_through_the_agent_keep_their_line_and_exit_code(
        sshd: SshdContainer, client: Client, tmp_path: Path) -> None:
    local, spec, remote, cfg = ssh_setup(sshd, tmp_path)
    remote.parent.mkdir(parents=True, exist_ok=True)
    remote.write_text("a file where the root should be\n")
    done = client.run("push", str(local), spec, "-F", cfg)
    assert done.returncode == 1
    assert "not a directory" in one_error_line(done)
    remote.unlink()
    client.ok("push", str(local), spec, "-F", cfg)
    for path in list(local.rglob("f*.txt")):
        path.unlink()
    refused = client.run("push", str(local), spec, "-F", cfg)
    assert refused.returncode == 3, refused.stderr
    one_error_line(refused)
    assert len(list(remote.rglob("f*.txt"))) == 30  # refused as a whole: nothing deleted


@pytest.mark.sshd
def test_self_sync_is_refused_through_the_agent_too(
        sshd: SshdContainer, client: Client, tmp_path: Path) -> None:
    # The agent runs the CLI's passes, and with them the CLI's self-sync check.
    rel = f"agent-self-{uuid.uuid4().hex[:8]}"
    local = sshd.home / rel
    tree(local)
    try:
        before = snapshot(local)
        for command in ("push", "pull", "sync"):
            done = client.run(command, str(local), f"{sshd.alias}:{rel}", "-F",
                              str(sshd.ssh_config))
            assert done.returncode == 3, done.stderr
            assert "same tree" in one_error_line(done)
        assert snapshot(local) == before
        assert client.status()["requests"] == 3  # all three ran in the agent
    finally:
        shutil.rmtree(local, ignore_errors=True)


def test_stale_agent_is_replaced_by_current_code(client: Client, tmp_path: Path) -> None:
    """An agent running other code (here: another interpreter path) is never used."""
    other_python = tmp_path / "python-old"
    other_python.symlink_to(sys.executable)
    client.sock.parent.mkdir(mode=0o700)
    # A symlinked interpreter outside the venv does not find the venv's packages by itself.
    env = {**client.env, "PYTHONPATH": os.pathsep.join([*site.getsitepackages(), str(REPO)])}
    old = subprocess.Popen([str(other_python), "-m", "filesync.agent", str(client.sock), "60"],
                           env=env, stdin=subprocess.DEVNULL)
    try:
        _wait_for(lambda: client.sock.exists() or old.poll() is not None)
        assert old.poll() is None, "the old agent died before it listened"
        local, remote = tmp_path / "local", tmp_path / "remote"
        tree(local)
        assert client.ok("push", str(local), str(remote))["uploaded"] == 30
        assert old.wait(timeout=DEADLINE) == 0  # told it is stale, it exits
        assert client.status()["pid"] != old.pid
    finally:
        if old.poll() is None:
            old.kill()


def test_agent_exits_after_its_idle_time(client: Client, tmp_path: Path) -> None:
    local, remote = tmp_path / "local", tmp_path / "remote"
    tree(local, 3)
    done = client.run("push", str(local), str(remote), persist="1")
    assert done.returncode == 0, done.stderr
    _wait_for(lambda: not client.sock.exists())
    assert subprocess.run([*CLI, "agent", "status"], env=client.env, capture_output=True,
                          check=False).returncode == 1


def test_an_agent_dir_open_to_others_is_refused(client: Client, tmp_path: Path) -> None:
    client.sock.parent.mkdir()
    client.sock.parent.chmod(0o777)
    local, remote = tmp_path / "local", tmp_path / "remote"
    tree(local, 3)
    done = client.run("push", str(local), str(remote))
    assert done.returncode == 1
    assert "chmod 700" in one_error_line(done)
    assert not remote.exists()


def test_bad_persist_value_is_a_usage_error(client: Client, tmp_path: Path) -> None:
    done = client.run("push", str(tmp_path), str(tmp_path / "r"), persist="soon")
    assert done.returncode == 2
    assert "duration" in one_error_line(done)


def test_other_users_are_not_served(client: Client, tmp_path: Path) -> None:
    if os.geteuid() != 0:  # like the sshd tests: a hole in CI, a skip elsewhere
        if os.environ.get("CI"):
            pytest.fail("CI must run as root")
        pytest.skip("needs root to run a client as another user")
    # a socket path the other user can reach (pytest's tmp dirs are 0700)
    outer = Path(tempfile.mkdtemp(prefix="fs-agent-", dir="/tmp"))
    client.sock = outer / "run" / "agent.sock"
    client.env["FILESYNC_AGENT_SOCKET"] = str(client.sock)
    try:
        local, remote = tmp_path / "local", tmp_path / "remote"
        tree(local, 3)
        client.ok("push", str(local), str(remote))
        # open the door on purpose: only the peer-uid check is left to refuse
        outer.chmod(0o755)
        client.sock.parent.chmod(0o755)
        client.sock.chmod(0o666)
        nobody = pwd.getpwnam("nobody")
        probe = ("import socket, sys\n"
                 "s = socket.socket(socket.AF_UNIX)\n"
                 "s.connect(sys.argv[1])\n"
                 "try:\n"
                 "    s.sendall(b'{\"op\": \"status\"}\\n')\n"
                 "    print(repr(s.recv(100)))\n"
                 "except (ConnectionResetError, BrokenPipeError):  # closed on us\n"
                 "    print('refused')\n")
        done = subprocess.run(["setpriv", f"--reuid={nobody.pw_uid}",
                               f"--regid={nobody.pw_gid}", "--clear-groups",
                               "/usr/bin/python3", "-c", probe, str(client.sock)],
                              capture_output=True, text=True, timeout=DEADLINE, check=False)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() in ("b''", "refused"), done.stdout
        client.sock.parent.chmod(0o700)
        assert client.status()["requests"] == 1  # and it still serves its own user
    finally:
        client.stop()
        shutil.rmtree(outer, ignore_errors=True)


def test_interrupting_the_client_cancels_the_run_safely(client: Client, tmp_path: Path) -> None:
    local, remote = tmp_path / "local", tmp_path / "remote"
    tree(local, 3)
    client.ok("push", str(local), str(remote))  # the agent is up and warm
    proc, big = big_push_under_way(client, local, remote)
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=DEADLINE)
    assert proc.returncode in (0, 130), err
    report = client.ok("push", str(local), str(remote))  # the agent still serves
    assert report["uploaded"] in (0, 1)
    assert (remote / "big.bin").read_bytes() == big
    assert not [p for p in remote.rglob(".filesync.*")]


def test_server_in_process(tmp_path: Path) -> None:
    """The agent's server on its real socket, driven by raw protocol lines."""
    sock_path = tmp_path / "run" / "agent.sock"
    sock_path.parent.mkdir(mode=0o700)
    local, remote = tmp_path / "local", tmp_path / "remote"
    tree(local, 5)
    env = dict(os.environ, FILESYNC_STATE_DIR=str(tmp_path / "state"))

    def ask(message: dict[str, Any]) -> list[dict[str, Any]]:
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(sock_path))
            s.sendall(json.dumps(message).encode() + b"\n")
            with s.makefile("rb") as lines:
                return [json.loads(line) for line in lines]

    def run(*argv: str) -> list[dict[str, Any]]:
        return ask({"op": "run", "argv": list(argv), "cwd": str(tmp_path), "env": env,
                    "umask": 0o022, "persist": 30, "fingerprint": fingerprint()})

    async def scenario() -> list[list[dict[str, Any]]]:
        agent = agent_mod.Agent(sock_path, 30)
        server = asyncio.create_task(agent.serve())
        await _async_wait_for(sock_path.exists)
        replies = [await asyncio.to_thread(run, "push", "local", "remote", "--json"),
                   await asyncio.to_thread(run, "push", "local", "nowhere/x", "-v"),
                   await asyncio.to_thread(run, "pull", "local", "remote", "--bogus"),
                   await asyncio.to_thread(ask, {"op": "status"}),
                   await asyncio.to_thread(ask, {"op": "run", "fingerprint": "other"}),
                   ]
        await asyncio.wait_for(server, DEADLINE)
        return replies

    pushed, verbose, usage, status, stale = asyncio.run(scenario())
    assert json.loads("".join(r.get("out", "") for r in pushed))["uploaded"] == 5
    assert pushed[-1] == {"exit": 0}
    assert snapshot(remote) == kept(local)
    assert verbose[-1] == {"exit": 0}
    assert "push: 5 uploaded" in "".join(r.get("out", "") for r in verbose)
    assert usage[-1] == {"exit": 2}
    assert "unrecognized arguments" in "".join(r.get("err", "") for r in usage)
    assert status[0]["requests"] == 3 and status[0]["opened"] == 1
    assert stale == [{"stale": True}]
    assert not sock_path.exists()  # the stale request stopped it, and it cleaned up


def _wait_for(predicate: Any, timeout: float = DEADLINE) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


async def _async_wait_for(predicate: Any, timeout: float = DEADLINE) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


def test_the_client_side_imports_neither_asyncio_nor_the_engine(
        client: Client, tmp_path: Path) -> None:
    """A warm run's cost is an interpreter start and a socket round trip, nothing more."""
    local, remote = tmp_path / "local", tmp_path / "remote"
    tree(local, 3)
    client.ok("push", str(local), str(remote))  # the agent is up
    write(local / "more.txt", "one more\n")
    probe = ("import sys; from filesync.cli import main\n"
             "code = main(['push', sys.argv[1], sys.argv[2], '--persist', '60', '-q'])\n"
             "heavy = sorted(m for m in ('asyncio', 'asyncssh', 'sqlite3', 'filesync.sync.engine')"
             " if m in sys.modules)\n"
             "print(code, heavy)\n")
    done = subprocess.run([sys.executable, "-c", probe, str(local), str(remote)],
                          env=client.env, capture_output=True, text=True, timeout=DEADLINE,
                          check=False)
    assert done.stdout.strip() == "0 []", (done.stdout, done.stderr)
    assert (remote / "more.txt").read_text() == "one more\n"


def test_an_agent_killed_mid_run_costs_one_clean_error_and_nothing_else(
        client: Client, tmp_path: Path) -> None:
    local, remote = tmp_path / "local", tmp_path / "remote"
    tree(local, 3)
    client.ok("push", str(local), str(remote))
    pid = client.status()["pid"]
    proc, big = big_push_under_way(client, local, remote)
    os.kill(pid, signal.SIGKILL)
    _out, err = proc.communicate(timeout=DEADLINE)
    if proc.returncode != 0:  # the kill landed mid-run (it nearly always does)
        assert proc.returncode == 1
        assert "agent ended mid-run" in one_error_line(
            subprocess.CompletedProcess([], 1, "", err))
    report = client.ok("push", str(local), str(remote))  # a new agent takes over
    assert client.status()["pid"] != pid
    assert report["uploaded"] in (0, 1)
    assert (remote / "big.bin").read_bytes() == big
    assert not [p for p in remote.rglob(".filesync.*")]


class InProcessAgent:
    """The agent's server on a thread of this process, for the client's code paths."""

    def __init__(self, sock_path: Path) -> None:
        self.sock_path = sock_path
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.error: BaseException | None = None

    def _serve(self) -> None:
        try:
            asyncio.run(agent_mod.Agent(self.sock_path, 60).serve())
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def __enter__(self) -> InProcessAgent:
        self.thread.start()
        _wait_for(self.sock_path.exists)
        return self

    def __exit__(self, *exc: object) -> None:
        assert cli_main(["agent", "stop"]) == 0
        self.thread.join(30)
        assert not self.thread.is_alive() and self.error is None


def test_the_cli_client_in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    sock = tmp_path / "run" / "agent.sock"
    sock.parent.mkdir(mode=0o700)
    monkeypatch.setenv("FILESYNC_AGENT_SOCKET", str(sock))
    monkeypatch.setenv("FILESYNC_STATE_DIR", str(tmp_path / "state"))
    local, remote = tmp_path / "local", tmp_path / "remote"
    tree(local, 4)
    capsys.readouterr()
    with InProcessAgent(sock):
        assert cli_main(["push", str(local), str(remote), "--persist", "60", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["uploaded"] == 4
        assert cli_main(["status", str(local), str(remote), "--persist", "60"]) == 0
        assert "in sync" in capsys.readouterr().out
        code = cli_main(["push", str(local), "nohost:x", "--persist", "60", "-F", "/dev/null"])
        assert code == 1
        assert capsys.readouterr().err.startswith("filesync: error: ")
        assert cli_main(["agent", "status"]) == 0
        out = capsys.readouterr().out
        assert "3 runs served" in out and "local" in out
        assert cli_main(["agent", "status", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["running"] is True
    assert cli_main(["agent", "status"]) == 1
    assert "no agent is running" in capsys.readouterr().out
    assert snapshot(remote) == kept(local)


def test_socket_place_and_its_checks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FILESYNC_AGENT_SOCKET", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "xdg"))
    assert socket_path() == tmp_path / "xdg" / "filesync" / "agent.sock"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert socket_path() == Path(f"/tmp/filesync-{os.getuid()}/agent.sock")
    made = safe_dir(tmp_path / "new" / "dir")
    assert made.stat().st_mode & 0o777 == 0o700
    (tmp_path / "link").symlink_to(made)
    with pytest.raises(FilesyncError, match="not a directory"):
        safe_dir(tmp_path / "link")
    (tmp_path / "file").write_text("x")
    with pytest.raises(FilesyncError, match="FILESYNC_AGENT_SOCKET"):
        safe_dir(tmp_path / "file" / "sub")


@pytest.mark.sshd
def test_remote_changes_between_agent_runs_are_all_seen(
        sshd: SshdContainer, client: Client, tmp_path: Path) -> None:
    """The remote helper keeps its tree watched between runs: edits, a new directory, a
    removed file and a pruned dir's churn on the remote all come back exactly."""
    local, spec, remote, cfg = ssh_setup(sshd, tmp_path)
    client.ok("push", str(local), spec, "-F", cfg)
    assert client.ok("pull", str(local), spec, "-F", cfg)["downloaded"] == 0
    write(remote / "d1" / "f1.txt", "edited on the remote\n")
    write(remote / "fresh" / "deep" / "new.txt", "a new remote dir\n")
    (remote / "d2" / "f2.txt").unlink()
    write(remote / "node_modules" / "pkg" / "x.js", "remote junk\n")
    report = client.ok("pull", str(local), spec, "-F", cfg)
    assert (report["downloaded"], report["deleted_local"]) == (2, 1)
    assert kept(remote) == kept(local) and not (local / "node_modules" / "pkg").exists()
    write(remote / "d0" / "f3.txt", "second edit, same directory set\n")
    assert client.ok("pull", str(local), spec, "-F", cfg)["downloaded"] == 1
    assert (local / "d0" / "f3.txt").read_text() == "second edit, same directory set\n"
    assert client.status()["opened"] == 1
