"""The plain CLI's cold path: a directory pair's job names its first listing before any
connection, so the runner asks for it in the same write as the helper's source
(``filesync.session.runner.Job.first_listing``; the runner's tests show the write); and
the parsing before the login declares only the options of the command run."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from filesync.cli.commands import _directory_job, _options
from filesync.cli.main import parse, request_from
from filesync.core.reconcile import Direction


def test_a_directory_pair_names_its_first_listing(tmp_path: Path) -> None:
    (tmp_path / "local").mkdir()
    req = request_from(parse(["push", str(tmp_path / "local"), "host:dir/sub",
                              "--exclude", "*.log"]))
    target = req.targets[0]
    assert req.local is not None
    opts = _options(req, Direction.PUSH, req.local)
    pairs = _directory_job(target, req.local, opts, None)
    assert pairs.job.first_listing == ("dir/sub", opts.rule)
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
