"""Progress: every transferred byte is reported, and the rich bar draws on a terminal."""

from __future__ import annotations

import io
import os
from pathlib import Path

from synctree import write

from filesync.core.reconcile import Direction
from filesync.sync.engine import Options, run_pass
from filesync.sync.progress import MIN_BYTES, RichProgress, tty_progress
from filesync.transport.local import local_conduit


class Recorder:
    def __init__(self) -> None:
        self.phases: list[tuple[str, int]] = []
        self.bytes = 0
        self.ended = 0

    def begin(self, label: str, total: int) -> None:
        self.phases.append((label, total))

    def advance(self, n: int) -> None:
        self.bytes += n

    def end(self) -> None:
        self.ended += 1


async def test_upload_and_fetch_report_every_byte(tmp_path: Path) -> None:
    data = os.urandom(3 << 20)
    write(tmp_path / "l" / "big.bin", data)
    rec = Recorder()
    opts = Options(Direction.PUSH, state_dir=tmp_path / "s", progress=rec)
    conduit = local_conduit()
    try:
        await run_pass(conduit, tmp_path / "l", str(tmp_path / "r"), opts)
        assert rec.phases == [("upload", len(data))] and rec.bytes == len(data)
        write(tmp_path / "r" / "big.bin", data[::-1])
        opts.direction = Direction.PULL
        await run_pass(conduit, tmp_path / "l", str(tmp_path / "r"), opts)
    finally:
        await conduit.close()
    assert rec.phases[1] == ("fetch", len(data)) and rec.bytes == 2 * len(data)
    assert rec.ended == 2
    assert (tmp_path / "l" / "big.bin").read_bytes() == data[::-1]


def test_rich_bar_draws_on_a_terminal_and_stays_quiet_for_small_transfers() -> None:
    out = io.StringIO()
    bar = RichProgress(out, force=True)
    bar.begin("small", 10)
    bar.advance(10)
    bar.end()
    assert out.getvalue() == ""
    bar.begin("upload", MIN_BYTES)
    bar.advance(MIN_BYTES)
    bar.end()
    assert "upload" in out.getvalue()


def test_no_bar_without_a_terminal() -> None:
    assert tty_progress(False) is None
    assert tty_progress(True) is None  # pytest's stderr is not a TTY
