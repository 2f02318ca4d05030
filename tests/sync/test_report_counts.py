"""A report's counters are counted from its ``changes``: they can never disagree.

A real sync over the local transport does every kind of change at once (uploads,
downloads, deletions on both sides, a conflict); the counters, the JSON counters and the
per-file records must tell the same story, and a session's summed report too.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

from synctree import write

from filesync.core.exclude import ExcludeRule
from filesync.core.reconcile import Direction
from filesync.mapping import Mapping
from filesync.session.aio import SessionReport
from filesync.sync.changes import ChangeAction
from filesync.sync.engine import Options, Report, run_pass
from filesync.transport.local import local_conduit

RULE = ExcludeRule.build(default_excludes=False)


def _sync(local: Path, remote: Path, state: Path) -> Report:
    async def main() -> Report:
        conduit = local_conduit()
        try:
            return await run_pass(conduit, local, str(remote),
                                  Options(Direction.SYNC, rule=RULE, state_dir=state))
        finally:
            await conduit.close()

    return asyncio.run(main())


def _assert_counted(report: Report) -> None:
    by_action = Counter(c.action for c in report.changes)
    assert (report.uploaded, report.downloaded, report.deleted_local, report.deleted_remote) \
        == (by_action[ChangeAction.UPLOAD], by_action[ChangeAction.DOWNLOAD],
            by_action[ChangeAction.DELETE_LOCAL], by_action[ChangeAction.DELETE_REMOTE])
    fields = report.to_json()
    by_json = Counter(f["action"] for f in fields["files"])
    for key, action in (("uploaded", "upload"), ("downloaded", "download"),
                        ("deleted_local", "delete-local"), ("deleted_remote", "delete-remote")):
        assert fields[key] == by_json[action], key


def test_every_counter_is_the_count_of_its_changes(tmp_path: Path) -> None:
    local, remote, state = tmp_path / "local", tmp_path / "remote", tmp_path / "state"
    for name in ("keep", "gone-here", "gone-there", "both"):
        write(local / f"{name}.txt", f"{name}\n")
    _sync(local, remote, state)
    write(local / "new-here.txt", "h\n")
    write(remote / "new-there.txt", "t\n")
    (local / "gone-here.txt").unlink()
    (remote / "gone-there.txt").unlink()
    write(local / "both.txt", "host edit\n")
    write(remote / "both.txt", "remote edit\n")
    report = _sync(local, remote, state)
    assert (report.uploaded, report.downloaded, report.deleted_local,
            report.deleted_remote) == (1, 1, 1, 1)
    assert [c.path for c in report.changes if c.action is ChangeAction.CONFLICT] \
        == ["both.txt"]
    _assert_counted(report)

    summed = SessionReport()
    summed.add(Mapping(local, "a"), report)
    summed.add(Mapping(local, "b"), report)
    assert summed.uploaded == 2 and summed.deleted_remote == 2
    _assert_counted(summed)
