"""The agent runs each request in its client's environment, working directory, umask and
output, given to the command as values: nothing of the agent process is swapped.

Two ways: the code never changes ``os.environ``, the working directory, the umask or
``sys.stdout``/``sys.stderr`` on a request's path (read from the source), and requests
with different contexts, one after the other and at once, each get their own (the
agent's real server on its real socket, local remotes: the helper runs in a local ``sh``
started in the request's context).
"""

from __future__ import annotations

import ast
import asyncio
import json
import os
import shutil
import socket
import stat
import sys
import tempfile
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from sshd import SshdContainer
from synctree import snapshot, write

from filesync.agent import server as agent_mod
from filesync.cli.agent_client import fingerprint
from filesync.host.state import pair_key
from filesync.transport.spawn import Spawn
from filesync.transport.ssh.master import ControlMaster, run_ssh

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[2]
DEADLINE = 120.0

#: The modules a request runs through, up to the engine's entry, and the functions of
#: each that may touch the process once (the agent's start-up); ``*``: none.
REQUEST_PATH = {
    "filesync/agent/server.py": {"main"},
    "filesync/cli/main.py": {"run"},  # the console script's own process, never the agent's
    "filesync/cli/commands.py": set(),
    "filesync/cli/settings.py": set(),
    "filesync/cli/config.py": set(),
    "filesync/cli/jsonout.py": set(),
}


def _process_changes(tree: ast.AST) -> list[tuple[str, int]]:
    """(what, line) for each change of the process's context in ``tree``: a call of
    ``os.chdir``/``os.fchdir``/``os.umask``/``os.putenv``/``os.unsetenv``, a mutating
    method of ``os.environ``, an assignment to ``os.environ`` (or an item of it) or to
    ``sys.stdout``/``sys.stderr``."""
    found: list[tuple[str, int]] = []

    def dotted(node: ast.AST) -> str:
        if isinstance(node, ast.Attribute):
            return f"{dotted(node.value)}.{node.attr}"
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, ast.Subscript):
            return f"{dotted(node.value)}[]"
        return "?"

    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = dotted(node.func)
            if name in ("os.chdir", "os.fchdir", "os.umask", "os.putenv", "os.unsetenv") or (
                    name.startswith("os.environ.") and name.rsplit(".", 1)[1] in
                    ("clear", "update", "pop", "popitem", "setdefault", "__setitem__")):
                found.append((name, node.lineno))
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = list(node.targets)
        while targets:
            target = targets.pop()
            if isinstance(target, ast.Tuple | ast.List):
                targets += target.elts
            elif isinstance(target, ast.Starred):
                targets.append(target.value)
            elif (name := dotted(target)) in ("os.environ", "os.environ[]", "sys.stdout",
                                               "sys.stderr"):
                found.append((name, node.lineno))
    return found


def _allowed_lines(tree: ast.Module, allowed: set[str]) -> set[int]:
    lines: set[int] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in allowed:
            lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return lines


def test_no_request_changes_the_agent_process() -> None:
    """No function on a request's path changes the process's environment, working
    directory, umask or standard streams; the agent's ``main`` sets its working
    directory and umask once, before it serves."""
    changes = {}
    for rel, allowed in REQUEST_PATH.items():
        tree = ast.parse((REPO / rel).read_text(encoding="utf-8"))
        ok = _allowed_lines(tree, allowed)
        changes[rel] = [(what, line) for what, line in _process_changes(tree)
                        if line not in ok]
    assert changes == {rel: [] for rel in REQUEST_PATH}
    start = ast.parse((REPO / "filesync/agent/server.py").read_text(encoding="utf-8"))
    main = next(n for n in start.body if isinstance(n, ast.FunctionDef) and n.name == "main")
    assert {what for what, _line in _process_changes(main)} == {"os.chdir", "os.umask"}


def test_the_source_check_finds_each_kind_of_change() -> None:
    """The check above is not blind: each kind of change it forbids is found."""
    source = "\n".join([
        "import os, sys",
        "def f(env):",
        "    os.environ.clear()",
        "    os.environ.update(env)",
        "    os.environ['HOME'] = '/x'",
        "    os.environ = {}",
        "    os.chdir('/')",
        "    os.umask(0)",
        "    os.putenv('A', 'b')",
        "    sys.stdout = None",
        "    sys.stdout, sys.stderr = 1, 2",
        "    del os.environ['HOME']",
    ])
    found = sorted(what for what, _line in _process_changes(ast.parse(source)))
    assert found == sorted(["os.environ.clear", "os.environ.update", "os.environ[]",
                            "os.environ", "os.chdir", "os.umask", "os.putenv", "sys.stdout",
                            "sys.stdout", "sys.stderr", "os.environ[]"])


class Caller:
    """One client of the agent: its own directory (the working directory of its
    requests, holding a relative ``local`` and ``remote``), environment and umask."""

    def __init__(self, tmp: Path, name: str, umask: int, *, xdg: bool) -> None:
        self.cwd = tmp / name
        self.umask = umask
        home = self.cwd / "home"
        home.mkdir(parents=True)
        self.env = {"PATH": os.environ["PATH"], "HOME": str(home)}
        if xdg:  # one caller names its state home, the other has the default under HOME
            self.env["XDG_STATE_HOME"] = str(self.cwd / "xdg")
        self.state = (self.cwd / "xdg" if xdg else home / ".local" / "state") / "filesync"
        write(self.cwd / "local" / "sub" / "f.txt", f"from {name}\n")

    def request(self, *argv: str) -> dict[str, Any]:
        return {"op": "run", "argv": list(argv), "cwd": str(self.cwd), "env": self.env,
                "umask": self.umask, "persist": 30, "fingerprint": fingerprint()}

    def mode(self, rel: str) -> int:
        return stat.S_IMODE((self.cwd / rel).stat().st_mode)

    def pair_dir(self) -> Path:
        key = pair_key(str(self.cwd / "local"), "local", str(self.cwd / "remote"))
        return self.state / "pairs" / key


def _ask(sock_path: Path, message: dict[str, Any]) -> list[dict[str, Any]]:
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(sock_path))
        s.sendall(json.dumps(message).encode() + b"\n")
        with s.makefile("rb") as lines:
            return [json.loads(line) for line in lines]


async def _served(sock_path: Path, requests: Callable[[], Awaitable[T]]) -> T:
    """Run ``requests`` against an agent served in this process on ``sock_path``, then
    stop it and wait until it has cleaned up."""
    server = asyncio.create_task(agent_mod.Agent(sock_path, 30).serve())
    while not sock_path.exists():
        await asyncio.sleep(0.01)
    result = await requests()
    await asyncio.to_thread(_ask, sock_path, {"op": "stop"})
    await asyncio.wait_for(server, DEADLINE)
    return result


def _report(replies: list[dict[str, Any]]) -> dict[str, Any]:
    assert replies[-1] == {"exit": 0}, replies
    report: dict[str, Any] = json.loads("".join(r.get("out", "") for r in replies))
    return report


def test_each_request_gets_its_own_env_cwd_umask_and_output(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Two clients that differ in everything, served one after the other and at once:
    each one's relative paths, state dir (``XDG_STATE_HOME``, or ``HOME``'s default),
    umask (the remote helper's directories, the pulled ones, the state's) and output are
    its own, and the agent's process -- here the test's -- is left as it was: its
    environment, working directory, umask and standard streams are never used nor
    changed (each holds a trap: a state dir, a ``local`` and a umask of its own)."""
    sock_path = tmp_path / "run" / "agent.sock"
    sock_path.parent.mkdir(mode=0o700)
    trap = tmp_path / "trap"
    write(trap / "local" / "trap.txt", "the agent's own working directory\n")
    monkeypatch.chdir(trap)
    monkeypatch.setenv("FILESYNC_STATE_DIR", str(trap / "state"))
    monkeypatch.setenv("XDG_STATE_HOME", str(trap / "xdg"))
    a = Caller(tmp_path, "a", 0o027, xdg=True)
    b = Caller(tmp_path, "b", 0o077, xdg=False)
    calls: list[str] = []
    real_chdir, real_umask = os.chdir, os.umask
    monkeypatch.setattr(os, "chdir", lambda *x: calls.append("chdir") or real_chdir(*x))
    monkeypatch.setattr(os, "umask", lambda *x: calls.append("umask") or real_umask(*x))
    environ = dict(os.environ)
    process_umask = real_umask(0o002)
    try:
        async def scenario() -> list[list[dict[str, Any]]]:
            replies = [await asyncio.to_thread(_ask, sock_path, a.request(
                "push", "local", "remote", "--json"))]
            # b at once with a's second run: served in turn, each in its own context
            replies += await asyncio.gather(
                asyncio.to_thread(_ask, sock_path, b.request(
                    "push", "local", "remote", "--json")),
                asyncio.to_thread(_ask, sock_path, a.request("status", "local", "remote")))
            for c in (a, b):
                write(c.cwd / "remote" / "new" / "deep" / "g.txt", "made remote\n")
            replies += await asyncio.gather(
                asyncio.to_thread(_ask, sock_path, a.request("pull", "local", "remote",
                                                             "--json")),
                asyncio.to_thread(_ask, sock_path, b.request("pull", "local", "remote",
                                                             "--json")))
            return replies

        pushed_a, pushed_b, status_a, pulled_a, pulled_b = asyncio.run(
            _served(sock_path, scenario))
        after_umask = real_umask(process_umask)
    finally:
        real_umask(process_umask)
    assert after_umask == 0o002 and calls == [] and dict(os.environ) == environ
    assert Path.cwd() == trap
    assert _report(pushed_a)["uploaded"] == 1 and _report(pushed_b)["uploaded"] == 1
    assert status_a[-1] == {"exit": 0}
    assert "in sync" in "".join(r.get("out", "") for r in status_a)
    assert _report(pulled_a)["downloaded"] == 1 and _report(pulled_b)["downloaded"] == 1
    assert capsys.readouterr() == ("", "")  # every line went to its client
    assert not (trap / "state").exists() and not (trap / "xdg").exists()
    assert not (trap / "remote").exists()
    for c in (a, b):
        name = c.cwd.name
        assert snapshot(c.cwd / "remote") == {"sub/f.txt": f"from {name}\n".encode(),
                                              "new/deep/g.txt": b"made remote\n"}
        assert snapshot(c.cwd / "local") == snapshot(c.cwd / "remote")
        dirs = 0o777 & ~c.umask
        # made by the remote helper (a local sh in the client's context) ...
        assert c.mode("remote/sub") == dirs
        # ... by the pull on the host, and by the state
        assert c.mode("local/new") == c.mode("local/new/deep") == dirs
        assert stat.S_IMODE(c.state.stat().st_mode) == dirs
        assert stat.S_IMODE(c.pair_dir().stat().st_mode) == 0o700 & ~c.umask
        made = [p for p in c.pair_dir().rglob("*") if p.is_dir()]  # undo/, staging/...
        assert (c.pair_dir() / "undo") in made
        assert {p: stat.S_IMODE(p.stat().st_mode) for p in made} == {p: dirs for p in made}
        assert stat.S_IMODE((c.pair_dir() / "state.db").stat().st_mode) == 0o644 & ~c.umask
        assert stat.S_IMODE((c.pair_dir() / "pair.json").stat().st_mode) == 0o666 & ~c.umask


@pytest.mark.sshd
def test_ssh_requests_use_their_own_config_path_and_runtime_dir(
        sshd: SshdContainer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Over the system ssh: each request's relative ``-F`` file is found in its own
    working directory, and its ControlMaster's socket lies under its own
    ``$XDG_RUNTIME_DIR``; neither the agent's directory nor its environment is used."""
    sock_path = tmp_path / "run" / "agent.sock"
    sock_path.parent.mkdir(mode=0o700)
    # Short: a control socket's path is limited to about 100 bytes.
    runtimes = {name: Path(tempfile.mkdtemp(prefix=f"fs-{name}-", dir="/tmp"))
                for name in ("a", "b", "trap")}
    trap = tmp_path / "trap"
    trap.mkdir()
    monkeypatch.chdir(trap)  # no "cfg" here: a -F resolved against it would not exist
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtimes["trap"]))
    callers = [Caller(tmp_path, name, 0o022, xdg=True) for name in ("a", "b")]
    remotes = {}
    for c in callers:
        shutil.copy(sshd.ssh_config, c.cwd / "cfg")
        c.env["XDG_RUNTIME_DIR"] = str(runtimes[c.cwd.name])
        remotes[c.cwd.name] = f"agent-ctx-{uuid.uuid4().hex[:8]}"
    masters: dict[str, list[str]] = {}
    try:
        async def scenario() -> list[list[dict[str, Any]]]:
            replies = await asyncio.gather(*(asyncio.to_thread(_ask, sock_path, c.request(
                "push", "local", f"{sshd.alias}:{remotes[c.cwd.name]}", "-F", "cfg", "--json",
                "--ssh-client", "openssh")) for c in callers))
            for name, base in runtimes.items():  # while the agent keeps them open
                masters[name] = sorted(p.name for p in (base / "filesync").glob("ssh-*")) \
                    if (base / "filesync").is_dir() else []
            return replies

        pushed = asyncio.run(_served(sock_path, scenario))
    finally:
        for base in runtimes.values():
            shutil.rmtree(base, ignore_errors=True)
    assert [_report(r)["uploaded"] for r in pushed] == [1, 1]
    assert len(masters["a"]) == len(masters["b"]) == 1 and masters["trap"] == []
    for c in callers:
        got = snapshot(sshd.home / remotes[c.cwd.name])
        assert got == {"sub/f.txt": f"from {c.cwd.name}\n".encode()}


@pytest.mark.sshd
def test_asyncssh_requests_read_the_ssh_config_of_their_own_home(
        sshd: SshdContainer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Over asyncssh (which reads ``~/.ssh/config`` itself): each request's ``$HOME``
    decides the config; the agent's own home has none that knows the host."""
    sock_path = tmp_path / "run" / "agent.sock"
    sock_path.parent.mkdir(mode=0o700)
    trap_home = tmp_path / "trap-home"
    (trap_home / ".ssh").mkdir(parents=True)
    (trap_home / ".ssh" / "config").write_text("Host *\n    Port 1\n")
    monkeypatch.setenv("HOME", str(trap_home))
    callers = [Caller(tmp_path, name, 0o022, xdg=True) for name in ("a", "b")]
    remotes = {}
    for c in callers:
        ssh_dir = Path(c.env["HOME"]) / ".ssh"
        ssh_dir.mkdir(mode=0o700)
        shutil.copy(sshd.ssh_config, ssh_dir / "config")
        remotes[c.cwd.name] = f"agent-ctx-{uuid.uuid4().hex[:8]}"

    async def scenario() -> list[list[dict[str, Any]]]:
        return await asyncio.gather(*(asyncio.to_thread(_ask, sock_path, c.request(
            "push", "local", f"{sshd.alias}:{remotes[c.cwd.name]}", "--json",
            "--ssh-client", "asyncssh")) for c in callers))

    pushed = asyncio.run(_served(sock_path, scenario))
    assert [_report(r)["uploaded"] for r in pushed] == [1, 1]
    for c in callers:
        got = snapshot(sshd.home / remotes[c.cwd.name])
        assert got == {"sub/f.txt": f"from {c.cwd.name}\n".encode()}


def test_a_kept_ssh_connection_outlives_the_directory_it_was_made_from(
        tmp_path: Path) -> None:
    """A connection the agent keeps serves later requests after the directory of the one
    that made it is gone: its later ``ssh`` processes (sessions once the remote helper
    must start again, the stop) take the environment and umask, not the directory."""
    gone = tmp_path / "gone"
    gone.mkdir()
    spawn = Spawn({"PATH": os.environ["PATH"], "MARK": "kept"}, str(gone), 0o027)
    master = ControlMaster("ssh", "host", str(tmp_path / "sock"), os.getpid(), owned=False,
                           spawn=spawn)
    gone.rmdir()
    script = "import os; print(os.environ['MARK'], oct(os.umask(0)))"
    code, out, _err = asyncio.run(run_ssh([sys.executable, "-c", script], DEADLINE,
                                          master.spawn))
    assert (code, out.split()) == (0, ["kept", "0o27"])
