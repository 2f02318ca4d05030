"""Progress reporting for long transfers: a bar on a TTY, nothing otherwise."""

from __future__ import annotations

import sys
from typing import IO, Any, Protocol


class Progress(Protocol):
    """Receives byte counts of one phase at a time (fetch, upload)."""

    def begin(self, label: str, total: int) -> None: ...

    def advance(self, n: int) -> None: ...

    def end(self) -> None: ...


#: Transfers smaller than this finish before a bar is worth drawing.
MIN_BYTES = 4 << 20


class RichProgress:
    """A transient rich progress bar on stderr (rich is imported only when used)."""

    def __init__(self, stream: IO[str] | None = None, force: bool = False) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            TextColumn,
            TransferSpeedColumn,
        )
        from rich.progress import Progress as Bar

        console = Console(file=stream or sys.stderr, force_terminal=force or None)
        self._bar = Bar(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                        TransferSpeedColumn(), console=console, transient=True)
        self._task: Any = None

    def begin(self, label: str, total: int) -> None:
        if total < MIN_BYTES:
            return
        self._bar.start()
        self._task = self._bar.add_task(label, total=total)

    def advance(self, n: int) -> None:
        if self._task is not None:
            self._bar.advance(self._task, n)

    def end(self) -> None:
        if self._task is not None:
            self._bar.remove_task(self._task)
            self._bar.stop()
            self._task = None


def tty_progress(enabled: bool) -> Progress | None:
    """A bar when ``enabled`` and stderr is a terminal, else ``None``."""
    if not enabled or not sys.stderr.isatty():
        return None
    return RichProgress()
