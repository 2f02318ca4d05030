"""``filesync watch LOCAL REMOTE`` / ``--config FILE``: sync passes whenever either side
changes, until Ctrl-C or SIGTERM, then one last pass (``filesync.session.watch``).

``--timeout`` bounds each pass. Output: with ``-v`` one summary line per pass (and a line
per file moved), without it only the passes that moved something or met a conflict;
``--json`` prints each pass's report as one line (JSON Lines, the document of
``docs/json.md`` per pass). Exit codes:
0 when stopped by a signal after the last pass, 3 when a safety guard stopped the watch,
1 when a pass failed otherwise (the first pass's failure included: nothing is watched).
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import Callable
from dataclasses import replace

from filesync.cli.commands import _print_report
from filesync.cli.config import load_config
from filesync.cli.jsonout import document, pair_json
from filesync.cli.settings import Request
from filesync.errors import FilesyncError, UsageError
from filesync.mapping import Mapping
from filesync.session.aio import AsyncSession, SessionReport
from filesync.session.watch import WatchLoop
from filesync.transport.base import Conduit
from filesync.transport.target import Target, open_conduit, parse_remote


def run_watch(req: Request) -> int:
    """Run the watch command; returns the exit code (failures are raised)."""
    if req.settings.dry_run:
        raise UsageError("watch changes files as they change; use 'filesync status' to "
                         "see a plan")
    return asyncio.run(_watch(req))


def _pairs(req: Request) -> list[tuple[Target, list[Mapping]]]:
    """Each remote with the mappings watched on it."""
    if req.config is None:
        assert req.local is not None and req.targets
        if len(req.targets) > 1:
            raise UsageError("watch takes one REMOTE; use --config for several")
        target = req.targets[0]
        return [(replace(target, path="."), [Mapping(req.local, target.path)])]
    cfg = load_config(req.config, req.via)
    mappings = [Mapping(s.mapping.local, s.mapping.remote, s.mapping.mode,
                        exclude=(*s.mapping.exclude, *s.exclude)) for s in cfg.mappings]
    return [(parse_remote(remote, cfg.via), mappings) for remote in cfg.remotes]


def _session(req: Request, target: Target) -> AsyncSession:
    settings = req.settings

    async def connect() -> Conduit:
        return await open_conduit(target, req.connect)

    session = AsyncSession(
        target.path or ".", conduit=connect, state_dir=settings.state_path(),
        exclude=settings.exclude, default_excludes=settings.default_excludes,
        force=settings.force, lock_timeout=settings.lock_timeout,
        max_file_size=settings.max_file_size, max_pull_bytes=settings.max_pull_bytes,
        timeout=settings.timeout or None, watch=True, log=_log(req),
    )
    session._options = replace(session._options, idle_timeout=settings.idle_timeout)
    return session


def _log(req: Request) -> Callable[[str], None]:
    """The loop's messages (a lost connection, polling) always go to stderr; the engine's
    ``-v`` lines only with ``-v``."""
    verbose = req.output.log()

    def log(message: str) -> None:
        if verbose is not None:
            verbose(message)
        elif not req.output.quiet and message.startswith(_LOOP_MESSAGES):
            print(f"filesync: {message}", file=sys.stderr, flush=True)

    return log


#: How the loop's own messages begin (``filesync.session.watch``, ``host.watcher``).
_LOOP_MESSAGES = ("the connection was lost", "the pair is locked", "connected again",
                  "watching the host tree", "the remote tree cannot be watched")


def _reporter(req: Request, target: Target) -> Callable[[SessionReport], None]:
    def report(r: SessionReport) -> None:
        if req.output.json:
            pairs = [pair_json(target.label(), m.local, m.remote, p.to_json(False))
                     for m, p in r.passes]
            print(json.dumps(document(pairs, r.seconds)), flush=True)
            return
        moved = (r.uploaded or r.downloaded or r.deleted_local or r.deleted_remote
                 or r.conflicts or r.skipped)
        if req.output.verbose or moved:
            _print_report(req, r)
            sys.stdout.flush()

    return report


async def _watch(req: Request) -> int:
    pairs = _pairs(req)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    sessions: list[AsyncSession] = []
    loops: list[WatchLoop[SessionReport]] = []
    try:
        for target, mappings in pairs:
            session = _session(req, target)
            sessions.append(session)
            loops.append(await session.watch(mappings, _reporter(req, target)))
        ended = [asyncio.ensure_future(w.wait()) for w in loops]
        stop = asyncio.ensure_future(stopping.wait())
        await asyncio.wait([stop, *ended], return_when=asyncio.FIRST_COMPLETED)
        for future in (stop, *ended):
            future.cancel()  # each loop's error is raised by its stop() below
        errors: list[BaseException] = []
        for w in loops:
            try:
                await w.stop()
            except FilesyncError as exc:
                errors.append(exc)
        if errors:
            raise errors[0]
        return 0
    finally:
        for session in sessions:
            await session.close()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
