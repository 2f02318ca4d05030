"""`filesync demo` runs the sync-back scenario over the in-process SSH server."""

from __future__ import annotations

import pytest

from filesync.cli.main import main


def test_demo_brings_back_only_the_real_changes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "pull: 3 files came back" in out
    for path in ("pdf-tools/SKILL.md", "csv-clean/SKILL.md", "csv-clean/scripts/clean.sh"):
        assert f"download   {path}" in out
    assert "laptop .hub/lock.json untouched: {\"owner\": \"this laptop\"}" in out
    assert "laptop .curator_backups created: False" in out
    assert ".curator_backups" not in out.split("pull:")[1].split("stayed remote")[0]
