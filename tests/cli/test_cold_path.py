"""The plain CLI's cold path: a directory pair's job names its first listing before any
connection, so the runner asks for it in the same write as the helper's source
(``filesync.session.runner.Job.first_listing``; the runner's tests show the write)."""

from __future__ import annotations

from pathlib import Path

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
