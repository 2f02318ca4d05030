"""Shared helpers for integration tests: sample trees and a CLI runner."""

from __future__ import annotations

import contextlib
import io
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filesync.cli.main import main


def until(what: Callable[[], bool], why: str, deadline: float = 60.0) -> None:
    """Wait for a condition another thread brings about (never a timed assertion: the
    deadline only ends a test that hangs)."""
    end = time.monotonic() + deadline
    while not what():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting until {why}")
        time.sleep(0.01)


def write(path: Path, data: str | bytes, mode: int | None = None) -> Path:
    """Write a file, creating parents; returns the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    if mode is not None:
        path.chmod(mode)
    return path


def skills_tree(root: Path) -> None:
    """A small skills dir as the agent framework lays it out."""
    write(root / "pdf" / "SKILL.md", "# pdf\nextract text\n")
    write(root / "pdf" / "scripts" / "extract.py", "print('x')\n", 0o755)
    write(root / "pdf" / "references" / "api.md", "api\n")
    write(root / "pdf" / "templates" / "t.txt", "t\n")
    write(root / "web" / "SKILL.md", "# web\n")
    write(root / "web" / "assets" / "logo.bin", os.urandom(4096))
    write(root / ".bundled_manifest", "pdf\nweb\n")
    write(root / ".usage.json", "{}\n")
    write(root / ".hub" / "lock.json", '{"host": true}\n')


def junk_tree(root: Path, curator_mb: int = 2) -> int:
    """Remote bookkeeping the sync-back must never bring home; returns its bytes."""
    total = 0
    write(root / ".hub" / "lock.json", '{"remote": "stale"}\n')
    block = os.urandom(1 << 20)
    for i in range(curator_mb):
        write(root / ".curator_backups" / f"backup-{i}.tar", block)
        total += len(block)
    for i in range(20):
        total += len(write(root / "pdf" / "node_modules" / "dep" / f"f{i}.js", "x" * 1000)
                     .read_bytes())
    return total


def snapshot(root: Path) -> dict[str, bytes]:
    """Every regular file under root with its bytes."""
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            p = Path(dirpath) / name
            if p.is_file() and not p.is_symlink():
                out[p.relative_to(root).as_posix()] = p.read_bytes()
    return out


def project_in_data(tmp: Path) -> Path:
    """``tmp/data/project`` with two files, and a file beside it in ``tmp/data``: a local
    root that a remote root can equal, contain or lie inside (the self-sync tests)."""
    root = tmp / "data" / "project"
    write(root / "a.md", "a\n")
    write(root / "sub" / "b.md", "b\n")
    write(tmp / "data" / "beside.md", "beside\n")
    return root


def files_with_mtimes(tmp: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``tmp`` but the state dir (``tmp/state``), with its mtime."""
    return {rel: (data, os.stat(tmp / rel).st_mtime_ns)
            for rel, data in snapshot(tmp).items() if not rel.startswith("state/")}


@dataclass
class Pair:
    """A local root, a remote root (local transport) and a private state dir."""

    local: Path
    remote: Path
    state: Path

    def run(self, command: str, *extra: str, remote: str | None = None) -> tuple[int, Any]:
        """Run ``filesync COMMAND LOCAL REMOTE --json ...`` in-process."""
        out, err = io.StringIO(), io.StringIO()
        argv = [command, str(self.local), remote or str(self.remote), "--json",
                "--state-dir", str(self.state), *extra]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
        text = out.getvalue().strip()
        self.stderr = err.getvalue()
        return code, json.loads(text) if text else None

    def ok(self, command: str, *extra: str) -> Any:
        code, report = self.run(command, *extra)
        assert code == 0, (code, report, self.stderr)
        return report
