"""The plain CLI's cold path: a directory pair's job names its first pass before any
connection, so the runner asks for its listing in the same write as the helper's source
and walks its host tree meanwhile (``filesync.session.runner.Job.first_pass``; the
runner's tests show both); and
the parsing before the login declares only the options of the command run; and a sealed
no-op loads none of the code it never runs (``filesync.core.deferred``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from filesync.cli.commands import _directory_job, _options
from filesync.cli.main import parse, request_from
from filesync.core.reconcile import Direction


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
