"""The plain CLI's cold path: a directory pair's job names its first pass before any
connection, so the runner asks for its listing in the same write as the helper's source
and walks its host tree meanwhile (``filesync.session.runner.Job.first_pass``; the
runner's tests show both); the parsing before the login declares only the options of the
command run (and no other command when the command line starts with its own); the path to
the spawn of ssh's login loads only what that spawn needs; and a sealed no-op loads none
of the code it never runs (``filesync.core.deferred``)."""

from __future__ import annotations

import argparse
import ast
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from filesync.cli.commands import _directory_job, _options
from filesync.cli.main import COMMANDS, parse, request_from
from filesync.core.reconcile import Direction
from filesync.errors import UsageError


def test_a_directory_pair_names_its_first_pass(tmp_path: Path) -> None:
    (tmp_path / "local").mkdir()
    req = request_from(parse(["push", str(tmp_path / "local"), "host:dir/sub",
                              "--exclude", "*.log"]))
    target = req.targets[0]
    assert req.local is not None
    opts = _options(req, Direction.PUSH, req.local)
    pairs = _directory_job(target, req.local, opts, None)
    first = pairs.job.first_pass
    assert first is not None and (first.local, first.remote, first.opts) == (
        req.local, "dir/sub", opts)
    assert pairs.rows == [(target.label(), req.local, "dir/sub")]


def test_parsing_declares_only_the_options_of_the_command_run(
        monkeypatch: pytest.MonkeyPatch) -> None:
    cli = sys.modules["filesync.cli.main"]
    declared: list[str] = []
    real = cli._common

    def common(p: Any, *args: Any, **kw: Any) -> None:
        declared.append(p.prog)
        real(p, *args, **kw)

    monkeypatch.setattr(cli, "_common", common)
    args = parse(["pull", "/x", "host:y", "--exclude", "*.o", "--json"])
    assert declared == ["filesync pull"] and args.exclude == ["*.o"] and args.json
    declared.clear()
    parse(["resolve", "/x", "host:y", "a.txt", "--keep", "local"])
    assert declared == ["filesync resolve"]
    declared.clear()
    cli.build_parser()  # (``--help`` and the docs: every command's options)
    assert len(declared) == 7


def test_a_command_line_that_starts_with_its_command_declares_no_other(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    named: list[str] = []
    real = argparse._SubParsersAction.add_parser

    def add_parser(self: Any, name: str, **kw: Any) -> Any:
        named.append(name)
        return real(self, name, **kw)

    monkeypatch.setattr(argparse._SubParsersAction, "add_parser", add_parser)
    parse(["sync", "/x", "host:y", "-q"])
    assert named == ["sync"]
    # Where the top level speaks, every command is named: its help ...
    named.clear()
    with pytest.raises(SystemExit):
        parse(["-h", "sync"])
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()
              if line.startswith("    ") and line.split()[0] in COMMANDS]
    assert named == listed == list(COMMANDS)
    # ... and its error for a command that is none.
    with pytest.raises(UsageError) as bad:
        parse(["synx", "/x", "host:y"])
    assert f"(choose from {', '.join(map(repr, COMMANDS))})" in bad.value.message


#: Code a sealed no-op push never runs: the library tier (the CLI runs through the
#: runner), the watch code, the transition and the journal it applies, undo, and the TOML
#: parser (no config file is read).
NOT_ON_A_NO_OP = (
    "filesync.session.aio", "filesync.session.blocking", "filesync.session.watch",
    "filesync.host.watched", "filesync.tree.watch", "filesync.sync.transition",
    "filesync.host.journal", "filesync.host.apply", "filesync.sync.undo", "filesync.host.undo",
    "tomllib",
)


def test_a_no_op_push_loads_none_of_what_it_never_runs(tmp_path: Path) -> None:
    local, remote, state = tmp_path / "local", tmp_path / "remote", tmp_path / "state"
    local.mkdir()
    (local / "a.txt").write_text("a\n")
    # Written long ago: a file written within the racy-timestamp window is hashed again
    # by the next run, which then is not a sealed no-op.
    os.utime(local / "a.txt", ns=(10**18, 10**18))
    code = (
        "import json, sys\n"
        "from filesync.cli.main import main\n"
        "rc = main(sys.argv[1:])\n"
        f"print(json.dumps({{'rc': rc, 'loaded': [m for m in {NOT_ON_A_NO_OP!r}\n"
        "    if m in sys.modules]}))\n"
    )
    argv = [sys.executable, "-c", code, "push", str(local), str(remote), "-q",
            "--state-dir", str(state)]
    runs = [subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
            for _ in range(2)]  # the first run copies, the second is a sealed no-op
    copied, no_op = (json.loads(done.stdout.splitlines()[-1]) for done in runs)
    # The copy runs the transition (so the list names modules that do get loaded) ...
    assert copied["rc"] == 0 and "filesync.sync.transition" in copied["loaded"], runs[0]
    # ... and the no-op loads none of them.
    assert no_op == {"rc": 0, "loaded": []}, runs[1].stderr
    assert (remote / "a.txt").read_text() == "a\n"


def test_a_pull_leaves_nothing_for_the_next_runs_recovery(tmp_path: Path) -> None:
    # A pull stages what it fetches under the pair's ``staging/``; once done, none of it
    # may be left: the next run's recovery loads the journal code for a ``staging/``.
    local, remote, state = tmp_path / "local", tmp_path / "remote", tmp_path / "state"
    remote.mkdir()
    (remote / "a.txt").write_text("a\n")
    code = (
        "import json, sys\n"
        "from filesync.cli.main import main\n"
        "rc = main(sys.argv[1:])\n"
        "print(json.dumps({'rc': rc, 'journal': 'filesync.host.journal' in sys.modules}))\n"
    )
    argv = [sys.executable, "-c", code, "pull", str(local), str(remote), "-q",
            "--state-dir", str(state)]
    pulled = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert json.loads(pulled.stdout.splitlines()[-1]) == {"rc": 0, "journal": True}, \
        pulled.stderr
    assert (local / "a.txt").read_text() == "a\n"
    (pair_dir,) = (state / "pairs").iterdir()
    assert not (pair_dir / "staging").exists() and not (pair_dir / "journal.json").exists()
    # A dry run applies nothing: it loads the journal code only to recover.
    again = subprocess.run([*argv, "--dry-run"], capture_output=True, text=True, timeout=120,
                           check=False)
    assert json.loads(again.stdout.splitlines()[-1]) == {"rc": 0, "journal": False}, \
        again.stderr


#: What the path to the spawn of ssh's login must not load: each would delay the login
#: by its import time (``dataclasses`` brings ``inspect``, ``ast``, ``dis``, ``tokenize``).
NOT_BEFORE_THE_LOGIN = ("asyncio", "dataclasses", "inspect", "typing", "json")
#: The only filesync modules loaded before that spawn.
BEFORE_THE_LOGIN = {
    "filesync", "filesync.errors", "filesync.version", "filesync.core",
    "filesync.core.deferred", "filesync.cli", "filesync.cli.main", "filesync.transport",
    "filesync.transport.spawn", "filesync.transport.ssh", "filesync.transport.ssh.destination",
    "filesync.transport.ssh.openssh_login", "filesync.transport.ssh.resolved",
    "filesync.transport.ssh.master", "filesync.tree", "filesync.tree.paths",
}  # fmt: skip

# Runs the CLI with every process it starts recorded: its argv, and for the spawn of
# ssh's login (the master) the modules loaded by then. Neither json nor anything else the
# CLI must not load first is imported here.
_RECORD_SPAWNS = (
    "import subprocess, sys\n"
    "real = subprocess.Popen.__init__\n"
    "spawns = []\n"
    "def spawn(self, args, *rest, **kw):\n"
    "    login = any('ControlMaster=yes' in str(a) for a in args)\n"
    "    spawns.append((list(map(str, args)), sorted(sys.modules) if login else None))\n"
    "    real(self, args, *rest, **kw)\n"
    "subprocess.Popen.__init__ = spawn\n"
    "from filesync.cli.main import main\n"
    "rc = main(sys.argv[1:])\n"
    "print(repr((rc, spawns)))\n"
)


def _record_spawns(tmp_path: Path, *remotes: str
                   ) -> tuple[int, list[tuple[list[str], list[str] | None]], str]:
    """A push of an empty tree to ``remotes``, whose ``dead`` host (in the ssh config
    given) refuses connections: (exit code, every process started, stderr)."""
    local = tmp_path / "local"
    local.mkdir(exist_ok=True)
    with socket.socket() as closed:  # bound, not listening: a connect is refused at once
        closed.bind(("127.0.0.1", 0))
        config = tmp_path / "ssh_config"
        config.write_text(f"Host dead\n  HostName 127.0.0.1\n  Port {closed.getsockname()[1]}\n"
                          "  BatchMode yes\n  UserKnownHostsFile /dev/null\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("FILESYNC_", "SSH_"))}
        done = subprocess.run(
            [sys.executable, "-c", _RECORD_SPAWNS, "push", str(local), *remotes, "-F",
             str(config), "--state-dir", str(tmp_path / "state")],
            env={**env, "HOME": str(tmp_path), "FILESYNC_SSH_CLIENT": "openssh"},
            capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120, check=False)
    rc, spawns = ast.literal_eval(done.stdout.splitlines()[-1])
    return rc, spawns, done.stderr


def test_the_login_is_spawned_before_anything_it_does_not_need_is_loaded(
        tmp_path: Path) -> None:
    rc, spawns, err = _record_spawns(tmp_path, "dead:tree")
    assert rc == 1 and "refused" in err, err  # the login was spawned, and failed
    at_login = [modules for _argv, modules in spawns if modules is not None]
    assert len(at_login) == 1, spawns
    assert [m for m in NOT_BEFORE_THE_LOGIN if m in at_login[0]] == []
    assert {m for m in at_login[0] if m.split(".")[0] == "filesync"} == BEFORE_THE_LOGIN


def test_an_empty_remote_begins_no_login(tmp_path: Path) -> None:
    # The command refuses it (exit 2) before it connects anywhere: no ssh is started for
    # the other, valid REMOTE either.
    rc, spawns, err = _record_spawns(tmp_path, "dead:tree", "")
    assert (rc, spawns) == (2, []), err
    assert "REMOTE is empty" in err


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["pull", "--help"]])
def test_version_and_help_load_no_engine_and_no_event_loop(argv: list[str]) -> None:
    # argparse's own exit (status 0, its text printed) passes through the failure handler
    # untouched: nothing it never uses (the sinks, asyncio, the engine) is loaded first.
    code = (
        "import sys\n"
        "from filesync.cli.main import main\n"
        "try:\n"
        "    main(sys.argv[1:])\n"
        "except SystemExit as exc:\n"
        "    print('exit', exc.code)\n"
        "print(sorted(m for m in ('asyncio', 'filesync.cli.settings', 'filesync.sync.engine')"
        " if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                          timeout=120, check=False)
    *printed, exited, loaded = done.stdout.splitlines()
    assert (exited, loaded) == ("exit 0", "[]"), done.stderr
    assert printed and printed[0].startswith(("filesync ", "usage: filesync")), printed
