"""Retention of the saved copies: ``conflicts/`` and ``undo/`` stay bounded.

Each run that saved something owns one directory under them, named by its run id
(time-ordered). Keeping a run means keeping all of it; runs are dropped oldest first,
once more than ``keep_runs`` runs or more than ``keep_bytes`` bytes would be kept, so
what stays is always the most recent history. Two kinds are never dropped:

- the newest run (its undo is what ``filesync undo`` restores, even when that one run
  alone is larger than the byte bound);
- a run holding the saved copy of an open conflict (one ``filesync status`` still lists).

Defaults (what an rsync ``--backup-dir`` or unison ``backups`` user expects to find: a
recent history, not an ever-growing one): the last 20 runs, at most 1 GiB, for each of
the two directories.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

KEEP_RUNS = 20
KEEP_BYTES = 1 << 30


@dataclass(frozen=True, slots=True)
class Pruned:
    """A run directory that was dropped, and the bytes it held."""

    path: Path
    bytes: int


def prune_runs(
    directory: Path, keep_runs: int = KEEP_RUNS, keep_bytes: int = KEEP_BYTES,
    protected: Iterable[str] = (),
) -> list[Pruned]:
    """Drop the oldest run dirs of ``directory`` beyond the bounds; ``protected`` names
    runs that are kept whatever their age. Returns what was dropped, oldest first."""
    try:
        runs = sorted((e.name for e in os.scandir(directory) if e.is_dir(follow_symlinks=False)),
                      reverse=True)
    except FileNotFoundError:
        return []
    keep = set(protected)
    kept = total = 0
    over = False
    dropped: list[Pruned] = []
    for i, name in enumerate(runs):
        size = _size(directory / name)
        if i and not over and (kept >= keep_runs or total + size > keep_bytes):
            over = True  # from here on, older runs go: the history kept stays contiguous
        if i == 0 or name in keep or not over:
            kept += 1
            total += size
            continue
        shutil.rmtree(directory / name, ignore_errors=True)
        dropped.append(Pruned(directory / name, size))
    dropped.reverse()
    return dropped


def run_of(path: str | None, directory: Path) -> str | None:
    """The run dir of ``directory`` that ``path`` (a saved copy) lies in, if any."""
    if not path:
        return None
    for base in (directory, directory.resolve()):
        try:
            return Path(path).relative_to(base).parts[0]
        except (ValueError, IndexError):
            continue
    return None


def _size(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
    return total
