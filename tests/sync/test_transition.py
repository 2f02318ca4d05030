"""The transition, reached directly: frozen inputs and a plan in, a result out.

Each test builds the pass's inputs and plan with the real planning steps over the local
transport (the same helper protocol as SSH), changes something between planning and the
transition where the rule is about that window, then calls ``transition`` itself and
checks what it returned and what it recorded.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from synctree import write

from filesync.core.exclude import ExcludeRule
from filesync.core.reconcile import Direction, Kind
from filesync.endpoint.connect import Endpoints
from filesync.host.state import PairState
from filesync.sync import plan as planning
from filesync.sync.changes import Change, ChangeAction
from filesync.sync.engine import Options, run_pass
from filesync.sync.inputs import PassInputs, Planned, Scans
from filesync.sync.staging import StagingSink
from filesync.sync.transition import Transitioned, transition
from filesync.transport.local import local_conduit

RULE = ExcludeRule.build(default_excludes=False)
OLD_NS = 1_600_000_000_000_000_000

Step = Callable[[PassInputs, Scans, Planned], Awaitable[Transitioned]]


def old(path: Path) -> Path:
    os.utime(path, ns=(OLD_NS, OLD_NS))
    return path


def run(tmp: Path, direction: Direction, step: Step, *, first: Direction | None = None) -> None:
    """Optionally a full first pass (``first``), then plan one ``direction`` pass and give
    its inputs and plan to ``step``."""
    local, remote, state_dir = tmp / "local", tmp / "remote", tmp / "state"
    local.mkdir(exist_ok=True)
    remote.mkdir(exist_ok=True)

    async def main() -> None:
        conduit = local_conduit()
        try:
            if first is not None:
                await run_pass(conduit, local, str(remote),
                               Options(first, rule=RULE, state_dir=state_dir))
            endpoints = Endpoints()
            session = await endpoints.endpoint_for(conduit)
            root = session.resolve_root(str(remote))
            state = PairState.open(state_dir, str(local), conduit.identity, root)
            try:
                run_id = f"{time.time_ns():020d}-test"
                inputs = PassInputs(Options(direction, rule=RULE, state_dir=state_dir), session,
                                    state, local, root, run_id, time.time_ns(),
                                    StagingSink(state.staging / run_id))
                scans = await planning.scan(inputs)
                versions = planning.remote_versions(inputs, scans)
                await planning.fetch(inputs, versions.fetch)
                await step(inputs, scans, planning.plan(inputs, scans, versions))
            finally:
                state.close()
        finally:
            await endpoints.close()
            await conduit.close()

    asyncio.run(main())


def test_inputs_are_frozen(tmp_path: Path) -> None:
    async def step(inputs: PassInputs, scans: Scans, planned: Planned) -> Transitioned:
        for obj, name in ((inputs, "run_id"), (scans, "ancestors"), (planned, "actions")):
            with pytest.raises(AttributeError):  # FrozenInstanceError is one too
                setattr(obj, name, None)
        return Transitioned()

    run(tmp_path, Direction.PUSH, step)


def test_confirmed_upload_is_counted_and_recorded_with_the_pass_clock(tmp_path: Path) -> None:
    old(write(tmp_path / "local" / "a.txt", "a\n"))

    async def step(inputs: PassInputs, scans: Scans, planned: Planned) -> Transitioned:
        assert [(a.path, a.kind) for a in planned.actions] == [("a.txt", Kind.UPLOAD)]
        cache_before = dict(scans.local.cache_rows)
        done = await transition(inputs, scans, planned)
        assert (done.uploaded, done.errors, done.skipped) == (1, [], [])
        assert done.changes == [Change("a.txt", ChangeAction.UPLOAD, 2)]
        row = inputs.state.ancestors()["a.txt"]
        assert row.synced_ns == inputs.now and row.size == 2
        # The scan it was given is not written to: the new cache row goes to the state.
        assert scans.local.cache_rows == cache_before
        assert inputs.state.local_cache()["a.txt"][3] == row.hash
        return done

    run(tmp_path, Direction.PUSH, step)
    assert (tmp_path / "remote" / "a.txt").read_text() == "a\n"


def test_upload_over_a_remote_edited_after_the_scan_is_skipped_not_recorded(
    tmp_path: Path
) -> None:
    old(write(tmp_path / "local" / "a.txt", "v1\n"))
    old(write(tmp_path / "remote" / "a.txt", "v1\n"))
    ancestors: dict[str, object] = {}

    async def step(inputs: PassInputs, scans: Scans, planned: Planned) -> Transitioned:
        ancestors.update(inputs.state.ancestors())
        write(tmp_path / "remote" / "a.txt", "remote edit after the scan\n")
        done = await transition(inputs, scans, planned)
        assert done.uploaded == 0 and done.errors == []
        assert done.changes == []  # refused by the remote: no record of a file not done
        assert [s.path for s in done.skipped] == ["a.txt"]
        assert "retried next run" in done.skipped[0].reason
        assert inputs.state.ancestors() == ancestors  # nothing recorded
        return done

    def edit_local() -> None:
        p = write(tmp_path / "local" / "a.txt", "host edit\n")
        os.utime(p, ns=(OLD_NS + 10**9, OLD_NS + 10**9))

    run(tmp_path, Direction.SYNC, _after(edit_local), first=Direction.SYNC)
    run(tmp_path, Direction.PUSH, step)
    assert (tmp_path / "remote" / "a.txt").read_text() == "remote edit after the scan\n"


def _after(edit: Callable[[], None]) -> Step:
    """A step that only makes an edit for the next plan (the first pass is ``first``)."""
    async def step(inputs: PassInputs, scans: Scans, planned: Planned) -> Transitioned:
        edit()
        return Transitioned()
    return step


def test_download_staged_with_other_content_than_planned_is_skipped(tmp_path: Path) -> None:
    """A download the scan did not stage is fetched by the transition; if the remote
    changed since the plan, the fetched bytes are not the planned version: not applied."""
    old(write(tmp_path / "remote" / "a.txt", "v1\n"))

    async def step(inputs: PassInputs, scans: Scans, planned: Planned) -> Transitioned:
        assert [(a.path, a.kind) for a in planned.actions] == [("a.txt", Kind.DOWNLOAD)]
        inputs.sink.staged.clear()  # as if the scan had known the version from its cache
        write(tmp_path / "remote" / "a.txt", "v2, written after the plan\n")
        done = await transition(inputs, scans, planned)
        assert done.downloaded == 0 and done.changes == []
        assert [s.path for s in done.skipped] == ["a.txt"]
        assert "changed on the remote during the run" in done.skipped[0].reason
        assert "a.txt" not in inputs.state.ancestors()
        return done

    run(tmp_path, Direction.PULL, step)
    assert not (tmp_path / "local" / "a.txt").exists()


def test_pull_conflict_saves_the_remote_version_and_opens_a_conflict(tmp_path: Path) -> None:
    old(write(tmp_path / "local" / "a.txt", "host\n"))
    old(write(tmp_path / "remote" / "a.txt", "remote\n"))

    async def step(inputs: PassInputs, scans: Scans, planned: Planned) -> Transitioned:
        done = await transition(inputs, scans, planned)
        [conflict] = done.conflicts
        saved = Path(conflict["saved_to"])
        assert saved.read_text() == "remote\n"
        assert saved.is_relative_to(inputs.state.conflicts_dir / inputs.run_id)
        assert list(inputs.state.conflicts()) == ["a.txt"]
        return done

    run(tmp_path, Direction.PULL, step)
    assert (tmp_path / "local" / "a.txt").read_text() == "host\n"


def test_push_conflict_saves_the_remote_version_but_leaves_no_open_conflict(
    tmp_path: Path
) -> None:
    old(write(tmp_path / "local" / "a.txt", "host\n"))
    old(write(tmp_path / "remote" / "a.txt", "remote\n"))

    async def step(inputs: PassInputs, scans: Scans, planned: Planned) -> Transitioned:
        done = await transition(inputs, scans, planned)
        assert Path(done.conflicts[0]["saved_to"]).read_text() == "remote\n"
        assert done.uploaded == 1 and inputs.state.conflicts() == {}
        # The remote was changed: one upload record; the saved copy is in ``conflicts``.
        assert done.changes == [Change("a.txt", ChangeAction.UPLOAD, 5)]
        return done

    run(tmp_path, Direction.PUSH, step)
    assert (tmp_path / "remote" / "a.txt").read_text() == "host\n"


def test_host_file_edited_after_the_scan_is_kept_and_becomes_a_conflict(tmp_path: Path) -> None:
    old(write(tmp_path / "local" / "a.txt", "v1\n"))
    old(write(tmp_path / "remote" / "a.txt", "v1\n"))

    def edit_remote() -> None:
        p = write(tmp_path / "remote" / "a.txt", "remote v2\n")
        os.utime(p, ns=(OLD_NS + 10**9, OLD_NS + 10**9))

    async def step(inputs: PassInputs, scans: Scans, planned: Planned) -> Transitioned:
        write(tmp_path / "local" / "a.txt", "host edit after the scan\n")
        done = await transition(inputs, scans, planned)
        assert done.downloaded == 0
        assert [c["path"] for c in done.conflicts] == ["a.txt"]
        assert Path(done.conflicts[0]["saved_to"]).read_text() == "remote v2\n"
        # The journal found the host edit: a conflict record, never the planned download.
        assert done.changes == [Change("a.txt", ChangeAction.CONFLICT, len("remote v2\n"))]
        return done

    run(tmp_path, Direction.SYNC, _after(edit_remote), first=Direction.SYNC)
    run(tmp_path, Direction.PULL, step)
    assert (tmp_path / "local" / "a.txt").read_text() == "host edit after the scan\n"
