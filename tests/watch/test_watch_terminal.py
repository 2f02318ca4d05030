"""``SSHTerminal(watch=True)`` over the real OpenSSH sshd: what the remote agent writes
reaches the host while the session runs (not only at teardown), host edits reach the
remote without a command in between, and teardown stops the watch after a last pass."""

from __future__ import annotations

import asyncio
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from synctree import write

from filesync import Mapping
from filesync.backends import SSHTerminal

pytestmark = pytest.mark.sshd

DEADLINE = 90.0


async def until(what: Callable[[], bool], why: str) -> None:
    end = time.monotonic() + DEADLINE
    while not what():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting until {why}")
        await asyncio.sleep(0.02)


def _text(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


async def test_remote_skill_edits_reach_the_host_during_the_session(
    sshd: Any, tmp_path: Path
) -> None:
    name = f"watch-term-{uuid.uuid4().hex[:8]}"
    local, remote = tmp_path / "skills", sshd.home / name
    write(local / "pdf" / "SKILL.md", "# pdf\n")
    term = SSHTerminal(sshd.alias, ssh_config=sshd.ssh_config, state_dir=tmp_path / "state",
                       mappings=[Mapping(local, f"/root/{name}")], watch=True)
    async with term as t:
        done = await t.run(f"mkdir -p /root/{name}/web && echo '# web' > /root/{name}/web/SKILL.md")
        assert done.ok, done.stderr
        await until(lambda: _text(local / "web" / "SKILL.md") == "# web\n",
                    "the remote agent's new skill is on the host")
        write(local / "pdf" / "SKILL.md", "# pdf v2\n")
        await until(lambda: _text(remote / "pdf" / "SKILL.md") == "# pdf v2\n",
                    "the host edit is on the remote without a command")
        seen = await t.run(f"cat /root/{name}/pdf/SKILL.md")
        assert seen.stdout == "# pdf v2\n"
        watching = t._watch
        assert watching is not None and watching.running
    assert not watching.running and t._watch is None
    assert t.sync_back_errors == []
    assert any(r.downloaded for r in t.reports) and any(r.uploaded for r in t.reports)
    shutil.rmtree(remote)
