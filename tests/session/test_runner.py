"""The runner under the CLI, the sessions and the agent (``filesync.session.runner``): its
one retry policy, its self-sync guard and its deadline, over the local transport (the
remote helper is a real local process) and remote shells reached through ``via``.

The pool is the agent's (``KeptConduits``): it keeps connections between runs, as the
agent and a session do, so that a connection can die while idle.

A job's known first pass has its host walk started with the job: the tests of it script
the helper's start (held until the walk is done, or failing) and the host walk (held
until the runner joins it), waiting on events only."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from synctree import snapshot, write
from walkscript import (
    BOUND,
    ScriptedWalks,
    fail_helper_start_while_walking,
    script_helper_start,
)

from filesync.agent.server import KeptConduits
from filesync.core.exclude import ExcludeRule
from filesync.core.reconcile import Direction
from filesync.endpoint.helper import HelperEndpoint
from filesync.errors import FilesyncError, SelfSync, TransportError
from filesync.host.watched import WatchedTree
from filesync.session.runner import Deadline, Job, JobOutcome, PassRun, Runner
from filesync.sync.engine import Options, Report
from filesync.sync.warm import WarmState
from filesync.transport.base import Conduit, RemoteProcess
from filesync.transport.target import ConnectOptions, Target
from filesync.tree.bundle import payload
from filesync.tree.wire import HEADER

RULE = ExcludeRule.build(default_excludes=False)


class RecordingConduits(KeptConduits):
    """The agent's pool, keeping every write its conduits' processes are sent, in order
    (the helper behind them is the real one)."""

    def __init__(self, warm: WarmState) -> None:
        super().__init__(warm)
        self.writes: list[bytes] = []

    async def acquire(self, target: Target, opts: ConnectOptions) -> tuple[Conduit, bool]:
        conduit, reused = await super().acquire(target, opts)
        if not reused:
            start = conduit.start

            async def recording_start(command: str) -> RemoteProcess:
                proc = await start(command)
                write = proc.write

                async def recording_write(data: bytes) -> None:
                    self.writes.append(data)
                    await write(data)

                proc.write = recording_write  # type: ignore[method-assign]
                return proc

            conduit.start = recording_start  # type: ignore[method-assign]
        return conduit, reused

    def ops(self, writes: list[bytes] | None = None) -> list[str]:
        """The ops of the requests in ``writes`` (all of them: None), in order."""
        out: list[str] = []
        for data in self.writes if writes is None else writes:
            data = data.removeprefix(payload())
            while len(data) >= HEADER.size:
                kind, size = HEADER.unpack_from(data)
                body, data = data[HEADER.size:HEADER.size + size], data[HEADER.size + size:]
                if kind == b"J":
                    request: dict[str, Any] = json.loads(body)
                    out.append(request["op"])
        return out


class Rig:
    """A runner over a pool that keeps its connections, and the trees of one pair."""

    def __init__(self, tmp: Path, watch: bool = False) -> None:
        self.tmp = tmp
        self.local, self.remote, self.state = tmp / "local", tmp / "remote", tmp / "state"
        write(self.local / "a.txt", "a\n")
        self.warm = WarmState(watch=watch)
        self.pool = RecordingConduits(self.warm)
        self.runner = Runner(self.pool, self.warm, ConnectOptions())
        #: the remote side as the local transport reaches it
        self.here = Target("local", str(tmp))

    def other_tree(self) -> Path:
        """A second host tree, for a job of two pairs."""
        other = self.tmp / "other"
        write(other / "b.txt", "b\n")
        return other

    def job(self, target: Target, *passes: PassRun, first_pass: PassRun | None = None) -> Job:
        async def plan(_conduit: Conduit, _endpoint: object) -> list[PassRun]:
            return list(passes)

        return Job(target, plan, first_pass)

    def push(self, local: Path, remote: Path, remote_root: str | None = None) -> PassRun:
        return PassRun(local, str(remote), Options(Direction.PUSH, rule=RULE,
                                                   state_dir=self.state),
                       remote_root=remote_root)

    async def run(self, *jobs: Job, **kw: object) -> list[JobOutcome]:
        return await self.runner.run(jobs, **kw)  # type: ignore[arg-type]

    def kill_helpers(self) -> None:
        """The remote side of every kept connection dies while idle (its helper is
        killed: the next request finds the stream gone)."""
        for conduit in list(self.warm.endpoints._open):
            endpoint = self.warm.endpoints._open[conduit]
            assert isinstance(endpoint, HelperEndpoint)
            endpoint.proc.kill()

    async def close(self) -> None:
        await self.pool.close_all()
        await self.warm.close()


def report_of(outcome: JobOutcome, n: int = 0) -> Report:
    result = outcome.passes[n][1]
    assert isinstance(result, Report), result
    return result


async def test_a_kept_connection_that_died_idle_is_replaced_and_the_job_runs(
        tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    target = Target("local", str(rig.remote))
    try:
        (first,) = await rig.run(rig.job(target, rig.push(rig.local, rig.remote)))
        assert report_of(first).uploaded == 1 and rig.pool.opened == 1
        rig.kill_helpers()
        write(rig.local / "b.txt", "made while the connection lay dead\n")
        (again,) = await rig.run(rig.job(target, rig.push(rig.local, rig.remote)))
        assert again.error is None and report_of(again).uploaded == 1
        assert rig.pool.opened == 2  # one new connection, the dead one discarded
        assert snapshot(rig.remote) == snapshot(rig.local)
    finally:
        await rig.close()


async def test_the_retry_happens_once(tmp_path: Path) -> None:
    # A remote shell that serves the first connection and refuses every later one.
    flag = tmp_path / "refuse"
    via = f"sh -c '[ -e {flag} ] && exit 7; exec \"$@\"' --"
    rig = Rig(tmp_path)
    target = Target("via", str(rig.remote), via=via)
    try:
        (first,) = await rig.run(rig.job(target, rig.push(rig.local, rig.remote)))
        assert report_of(first).uploaded == 1
        flag.touch()
        rig.kill_helpers()
        (again,) = await rig.run(rig.job(target, rig.push(rig.local, rig.remote)))
        assert isinstance(again.error, TransportError) and not again.passes
        assert rig.pool.opened == 2  # the dead kept one, then one retry: no third
    finally:
        await rig.close()


async def test_real_failures_are_not_retried(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    write(tmp_path / "file-root", "a file where the remote root should be\n")
    try:
        # A pass refused on a kept connection is that pass's result; no new connection.
        target = Target("local", str(rig.remote))
        await rig.run(rig.job(target, rig.push(rig.local, rig.remote)))
        (refused,) = await rig.run(rig.job(target, rig.push(rig.local, tmp_path / "file-root")))
        error = refused.passes[0][1]
        assert isinstance(error, FilesyncError) and "not a directory" in error.message
        assert rig.pool.opened == 1
        # A connection lost on its first use, opened by this run: the job's error.
        dead = Target("via", str(rig.remote), via="sh -c 'exit 7' --")
        (lost,) = await rig.run(rig.job(dead, rig.push(rig.local, rig.remote)))
        assert isinstance(lost.error, TransportError) and rig.pool.opened == 2
    finally:
        await rig.close()


async def test_every_pair_of_a_job_is_checked_before_anything_is_applied(
        tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    other, target = rig.other_tree(), rig.here
    try:
        # The second pair is one tree reached twice: the first pass must not run.
        job = rig.job(target, rig.push(rig.local, rig.remote),
                      rig.push(other, other, remote_root=str(other)))
        (outcome,) = await rig.run(job)
        assert isinstance(outcome.error, SelfSync) and not outcome.passes
        assert not rig.remote.exists()
        # A pass's own pair is checked too, while it lists; the refusal ends its job.
        (alone,) = await rig.run(rig.job(target, rig.push(other, other),
                                         rig.push(rig.local, rig.remote)))
        assert isinstance(alone.error, SelfSync) and alone.passes == [(alone.passes[0][0],
                                                                        alone.error)]
        assert not rig.remote.exists()
        # Without the guard (status, a dry run) nothing is checked.
        dry = PassRun(other, str(other), Options(Direction.PUSH, rule=RULE,
                                                 state_dir=rig.state, dry_run=True))
        (planned,) = await rig.run(rig.job(target, dry), guard=False)
        assert planned.error is None and [a.path for a in report_of(planned).plan] == ["b.txt"]
        assert rig.pool.opened == 1  # a refusal leaves the connection kept, as good as it was
    finally:
        await rig.close()


async def test_a_known_first_listing_is_asked_for_with_the_helper_source(
        tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    try:
        first = rig.push(rig.local, rig.remote)
        job = rig.job(rig.here, first, first_pass=first)
        (outcome,) = await rig.run(job)
        assert outcome.error is None and report_of(outcome).uploaded == 1
        # The source and the listing request leave in one write: the remote walks before
        # the client has read the helper's hello.
        assert rig.pool.writes[0].startswith(payload())
        assert rig.pool.ops(rig.pool.writes[:1]) == ["keepalive", "list"]
        assert rig.pool.ops().count("list") == 1  # the pass took that reply: no second ask
    finally:
        await rig.close()


async def test_a_job_of_several_pairs_lists_its_first_before_checking_the_others(
        tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    second = tmp_path / "r2"
    try:
        job = rig.job(rig.here, rig.push(rig.local, rig.remote, remote_root=str(rig.remote)),
                      rig.push(rig.other_tree(), second, remote_root=str(second)))
        (outcome,) = await rig.run(job)
        assert outcome.error is None and [report_of(outcome, n).uploaded for n in (0, 1)] == [1, 1]
        # The later pair's self-sync probe queues behind the first pass's listing, which
        # the pass then takes: one listing request per pass, the first one first.
        ops = rig.pool.ops()
        assert ops.index("list") < ops.index("exists") and ops.count("list") == 2
    finally:
        await rig.close()


async def test_the_deadline_bounds_the_whole_run(tmp_path: Path) -> None:
    # A remote shell that accepts the connection and never answers holds the run's
    # planning: the deadline cuts every job of the run, and nothing is applied.
    rig = Rig(tmp_path)
    hanging = Target("via", str(rig.remote / "h"), via="sh -c 'sleep 60' --")
    fine = Target("local", str(rig.remote))
    expired = FilesyncError("the test's deadline ran out")
    try:
        outcomes = await rig.run(rig.job(fine, rig.push(rig.local, rig.remote)),
                                 rig.job(hanging, rig.push(rig.local, rig.remote / "h")),
                                 deadline=Deadline(1, lambda: expired))
        assert [(o.error, o.passes) for o in outcomes] == [(expired, []), (expired, [])]
        assert not rig.remote.exists()
        # A run within its deadline is not cut.
        (done,) = await rig.run(rig.job(fine, rig.push(rig.local, rig.remote)),
                                deadline=Deadline(600, lambda: expired))
        assert done.error is None and report_of(done).uploaded == 1
    finally:
        await rig.close()


async def test_a_known_first_pass_is_walked_before_the_helper_has_started(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(tmp_path)
    walks = ScriptedWalks(monkeypatch)
    walked_first: list[bool] = []

    async def walk_done() -> None:  # the helper starts only once the host is walked
        walked_first.append(await asyncio.to_thread(walks.done.wait, BOUND))

    script_helper_start(monkeypatch, walk_done)
    try:
        first = rig.push(rig.local, rig.remote)
        (outcome,) = await rig.run(rig.job(rig.here, first, first_pass=first))
        assert outcome.error is None and report_of(outcome).uploaded == 1
        # The walk ran while the helper started, and the pass took it: no second walk.
        assert walked_first == [True] and walks.calls == 1
        assert snapshot(rig.remote) == snapshot(rig.local)
    finally:
        walks.release.set()
        await rig.close()


async def test_an_early_walk_that_is_not_the_first_pass_s_is_not_taken(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The plan decides the passes: a first pass named ahead that the plan does not run
    # first walks for nothing, and the pass the plan runs walks its own tree.
    rig = Rig(tmp_path)
    walks = ScriptedWalks(monkeypatch)
    try:
        named = rig.push(rig.other_tree(), rig.remote)
        (outcome,) = await rig.run(rig.job(rig.here, rig.push(rig.local, rig.remote),
                                           first_pass=named))
        assert outcome.error is None and report_of(outcome).uploaded == 1
        assert snapshot(rig.remote) == snapshot(rig.local) and walks.calls == 2
    finally:
        await rig.close()


async def test_a_failed_helper_start_leaves_no_walk_running(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(tmp_path)
    walks = ScriptedWalks(monkeypatch, hold=True)
    failure = TransportError("the helper did not start (test)")
    fail_helper_start_while_walking(monkeypatch, walks, failure)
    try:
        first = rig.push(rig.local, rig.remote)
        (outcome,) = await rig.run(rig.job(rig.here, first, first_pass=first))
        walks.events.append("run returned")
        assert outcome.error is failure and not outcome.passes
        assert walks.events == ["walk done", "run returned"]
    finally:
        walks.release.set()
        await rig.close()


async def test_an_owner_that_watches_walks_ahead_through_its_watched_trees(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The agent's warm state watches: a known first pass is walked ahead through the
    # owner's watched tree, and the pass takes that walk, a refresh from the second on.
    rig = Rig(tmp_path, watch=True)
    walks = ScriptedWalks(monkeypatch)
    watched: list[bool] = []  # per listing: served by the watch
    real_listing = WatchedTree.listing

    def listing(tree: WatchedTree) -> Any:
        got = real_listing(tree)
        watched.append(got is not None)
        return got

    monkeypatch.setattr(WatchedTree, "listing", listing)
    try:
        first = rig.push(rig.local, rig.remote)
        uploaded = []
        for edit in ("b.txt", "c.txt"):
            write(rig.local / edit, f"{edit}\n")
            (outcome,) = await rig.run(rig.job(rig.here, first, first_pass=first))
            assert outcome.error is None
            uploaded.append(report_of(outcome).uploaded)
        assert uploaded == [2, 1] and walks.calls == 2 and watched == [True, True]
        assert snapshot(rig.remote) == snapshot(rig.local)
    finally:
        await rig.close()
