"""Shared helpers of the reliability, hostile-input and fuzz tests (this module has no tests).

- ``Tree``: the expected content of one side, and ``check_old_or_new``, the invariant every
  fault test asserts: each file holds its old or its new content, nothing else.
- ``CuttingConduit``: wraps the real conduit of a CLI run and cuts the real connection
  (``sshd.kill_sessions()``) right before its Nth I/O call.
- ``record``: appends a figure (faults injected, inputs tried, ...) as a JSON line to the
  file named by ``$FILESYNC_FIGURES``; docs/reliability.md quotes the totals. Inert when
  the variable is unset.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import filesync.transport.pool
from filesync.cli.main import main
from filesync.transport.base import Conduit, RemoteProcess

TEMP_MARK = ".filesync."


def record(kind: str, **figures: int) -> None:
    """Add figures of one test to the summary file, when ``$FILESYNC_FIGURES`` names one."""
    target = os.environ.get("FILESYNC_FIGURES")
    if target:
        with open(target, "a", encoding="utf-8") as f:
            f.write(json.dumps({"kind": kind, **figures}) + "\n")


def files_under(root: Path) -> dict[str, bytes]:
    """Every regular file under ``root`` (symlinks not followed) with its bytes."""
    out: dict[str, bytes] = {}
    if not root.exists():
        return out
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            p = Path(dirpath) / name
            if p.is_file() and not p.is_symlink():
                out[p.relative_to(root).as_posix()] = p.read_bytes()
    return out


def leftovers(*roots: Path) -> list[str]:
    """filesync temp files (``.filesync.*.tmp``, partial undo copies) under the roots."""
    found = []
    for root in roots:
        if not root.exists():
            continue
        for dirpath, _dirs, names in os.walk(root):
            found += [f"{dirpath}/{n}" for n in names
                      if (n.startswith(TEMP_MARK) and n.endswith(".tmp"))
                      or n.endswith(".filesync-partial")]
    return found


def state_leftovers(state_dir: Path) -> list[str]:
    """Unfinished journals and staged files of every pair under ``state_dir``."""
    found = []
    for pair in (state_dir / "pairs").glob("*"):
        if (pair / "journal.json").exists():
            found.append(str(pair / "journal.json"))
        staging = pair / "staging"
        if staging.exists():
            found += [str(p) for p in staging.rglob("*") if p.is_file()]
    return found


def check_old_or_new(
    actual: dict[str, bytes], old: dict[str, bytes], new: dict[str, bytes], where: str
) -> None:
    """Every path holds exactly its old or its new content (absent counts as a content)."""
    for path in sorted(actual.keys() | old.keys() | new.keys()):
        got = actual.get(path)
        assert got in (old.get(path), new.get(path)), (
            f"{where}: {path!r} holds neither its old nor its new content "
            f"(got {None if got is None else len(got)} bytes)"
        )


def ancestors(state_dir: Path) -> dict[str, tuple[Any, ...]]:
    """All ancestor rows of every pair under ``state_dir`` (read-only)."""
    rows: dict[str, tuple[Any, ...]] = {}
    for db in (state_dir / "pairs").glob("*/state.db"):
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            for row in conn.execute("SELECT * FROM ancestor"):
                rows[f"{db.parent.name}/{row[0]}"] = tuple(row[1:])
        finally:
            conn.close()
    return rows


def integrity(db: Path) -> str:
    conn = sqlite3.connect(db)
    try:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])
    finally:
        conn.close()


def run_cli(argv: list[str]) -> tuple[int, Any, str]:
    """``filesync ARGV`` in-process: (exit code, parsed --json output or None, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    text = out.getvalue().strip()
    report = json.loads(text.splitlines()[-1]) if text and "--json" in argv else None
    return code, report, err.getvalue()


def assert_clean_failure(code: int, stderr: str, expect_code: int = 1) -> None:
    """A failed run says one line ``filesync: error: ...`` and never a traceback."""
    assert code == expect_code, (code, stderr)
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("filesync: error: "), stderr


# -- cutting the connection at the Nth I/O call ---------------------------------------------


class CutPlan:
    """Counts a run's I/O calls and bytes; calls ``cut`` once, right before the I/O call
    with number ``cut_at`` (or, ``by_bytes``, the call that takes the byte count to
    ``cut_at`` or past it)."""

    def __init__(
        self, cut: Callable[[], int], cut_at: int | None = None, by_bytes: bool = False
    ) -> None:
        self.cut = cut
        self.cut_at = cut_at
        self.by_bytes = by_bytes
        self.calls = 0
        self.bytes = 0
        self.killed = 0
        self.done = False

    def tick(self, nbytes: int = 0) -> None:
        self.calls += 1
        self.bytes += nbytes
        if self.cut_at is None or self.done:
            return
        if (self.bytes if self.by_bytes else self.calls) >= self.cut_at:
            self.done = True
            self.killed += self.cut()


class CuttingProcess(RemoteProcess):
    def __init__(self, inner: RemoteProcess, plan: CutPlan) -> None:
        self.inner = inner
        self.plan = plan

    async def write(self, data: bytes) -> None:
        self.plan.tick(len(data))
        await self.inner.write(data)

    async def write_eof(self) -> None:
        await self.inner.write_eof()

    async def readexactly(self, n: int) -> bytes:
        self.plan.tick(n)
        return await self.inner.readexactly(n)

    async def read(self, n: int) -> bytes:
        self.plan.tick()
        return await self.inner.read(n)

    async def read_stderr(self) -> bytes:
        return await self.inner.read_stderr()

    async def wait(self) -> int:
        return await self.inner.wait()

    def kill(self) -> None:
        self.inner.kill()


class CuttingConduit(Conduit):
    """The real conduit, with every process's I/O counted by a ``CutPlan``."""

    def __init__(self, inner: Conduit, plan: CutPlan) -> None:
        self.inner = inner
        self.plan = plan
        self.identity = inner.identity

    async def start(self, command: str) -> RemoteProcess:
        self.plan.tick()
        return CuttingProcess(await self.inner.start(command), self.plan)

    async def close(self) -> None:
        await self.inner.close()

    @property
    def bytes_sent(self) -> int:
        return self.inner.bytes_sent

    @property
    def bytes_received(self) -> int:
        return self.inner.bytes_received


@contextlib.contextmanager
def cutting(plan: CutPlan) -> Iterator[CutPlan]:
    """Make every CLI run in this block use a ``CuttingConduit`` driven by ``plan``."""
    real = filesync.transport.pool.open_conduit

    async def wrapped(target: Any, opts: Any, login: Any = None) -> Conduit:
        return CuttingConduit(await real(target, opts, login), plan)

    filesync.transport.pool.open_conduit = wrapped  # type: ignore[assignment]
    try:
        yield plan
    finally:
        filesync.transport.pool.open_conduit = real
