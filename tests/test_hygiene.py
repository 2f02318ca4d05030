"""The code stays clean under ruff and mypy --strict (part of the test command)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


def test_ruff_is_clean() -> None:
    done = _run("ruff", "check", "filesync", "backends", "tests", "bench")
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_strict_is_clean() -> None:
    done = _run("mypy", "--strict", "filesync", "backends", "bench")
    assert done.returncode == 0, done.stdout + done.stderr


def test_filesync_never_imports_backends() -> None:
    offenders = [p.relative_to(ROOT).as_posix() for p in (ROOT / "filesync").rglob("*.py")
                 if "import backends" in p.read_text() or "from backends" in p.read_text()]
    assert offenders == []


def test_help_does_not_import_asyncssh() -> None:
    code = ("import sys, contextlib, io\nfrom filesync.cli import main\n"
            "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
            "    main(['--help'])\n"
            "print('asyncssh' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    assert done.stdout.strip() == "False", done.stderr
