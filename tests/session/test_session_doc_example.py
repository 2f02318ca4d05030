"""The threaded integration of docs/library.md, run as written: from a worker thread with no
event loop, against a real OpenSSH sshd; and type-checked with ``mypy --strict`` against
the package as it is shipped (``py.typed`` included)."""

from __future__ import annotations

import os
import shutil
import stat
import threading
from pathlib import Path
from typing import Any

import pytest
from sessionkit import doc_blocks
from synctree import skills_tree, snapshot, write
from typecheck import mypy_strict

pytestmark = pytest.mark.sshd

ROOT = Path(__file__).resolve().parents[2]


def _integration() -> str:
    blocks = [b for b in doc_blocks() if "def run_terminal(" in b]
    assert len(blocks) == 1
    return blocks[0]


def test_the_documented_integration_runs_from_a_worker_thread(
    box: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FILESYNC_STATE_DIR", str(tmp_path / "state"))
    agent = tmp_path / "agent"
    skills_tree(agent / "skills")
    write(agent / "token.json", '{"token": "secret"}\n', 0o600)
    write(agent / "other.txt", "not mapped\n")
    remote: Path = box.home / ".agent"
    namespace: dict[str, Any] = {"__name__": "doc_integration"}
    exec(compile(_integration(), "docs/library.md", "exec"), namespace)
    seen: dict[str, Any] = {}

    def work() -> None:
        """The agent's time on the remote: it sees the pushed trees and edits them."""
        seen["skills"] = snapshot(remote / "skills")
        seen["token_mode"] = stat.S_IMODE((remote / "token.json").stat().st_mode)
        seen["top"] = sorted(os.listdir(remote))
        write(remote / "skills" / "pdf" / "SKILL.md", "# pdf\nimproved by the agent\n")
        write(remote / "skills" / "new" / "SKILL.md", "# new skill\n")
        write(remote / "token.json", '{"token": "tampered"}\n', 0o600)

    errors: list[BaseException] = []

    def worker() -> None:
        try:
            namespace["run_terminal"](box.alias, agent, work, box.ssh_config)
        except BaseException as exc:
            errors.append(exc)

    try:
        t = threading.Thread(target=worker)
        t.start()
        t.join()
        assert errors == []
        assert seen["skills"]["pdf/SKILL.md"] == b"# pdf\nextract text\n"
        assert ".hub/lock.json" not in seen["skills"]  # default excludes apply
        assert seen["token_mode"] == 0o600
        assert seen["top"] == ["skills", "token.json"]  # only the mapped file of agent/
        assert (agent / "skills" / "pdf" / "SKILL.md").read_text().endswith("agent\n")
        assert (agent / "skills" / "new" / "SKILL.md").exists()
        assert (agent / "token.json").read_text() == '{"token": "secret"}\n'  # never pulled
        assert stat.S_IMODE((agent / "token.json").stat().st_mode) == 0o600
    finally:
        shutil.rmtree(remote, ignore_errors=True)


@pytest.mark.parametrize("block", ["def run_terminal(", "class SandboxConduit("])
def test_the_documented_code_passes_mypy_strict(tmp_path: Path, block: str) -> None:
    mypy_strict(next(b for b in doc_blocks() if block in b), tmp_path, "integration.py")
