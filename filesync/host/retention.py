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

A run's size is measured once: a run directory is complete when its pass ends (the pass
prunes only then) and nothing writes to it later, so each directory keeps the sizes it
measured in ``.sizes`` (JSON, run name -> bytes) and a later pass walks only runs new
to it. A missing or unreadable ``.sizes`` is measured afresh; it is a cache, never the
record of what is kept.
"""

from __future__ import annotations

import contextlib
import json
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
    known = _known_sizes(directory)
    sizes: dict[str, int] = {}
    kept = total = 0
    over = False
    dropped: list[Pruned] = []
    for i, name in enumerate(runs):
        size = known[name] if name in known else _size(directory / name)
        if i and not over and (kept >= keep_runs or total + size > keep_bytes):
            over = True  # from here on, older runs go: the history kept stays contiguous
        if i == 0 or name in keep or not over:
            kept += 1
            total += size
            sizes[name] = size
            continue
        shutil.rmtree(directory / name, ignore_errors=True)
        dropped.append(Pruned(directory / name, size))
    if sizes != known:
        _keep_sizes(directory, sizes)
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


#: The file of a directory's measured run sizes (not a run: runs are directories).
SIZES = ".sizes"


def _known_sizes(directory: Path) -> dict[str, int]:
    try:
        found = json.loads((directory / SIZES).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(found, dict):
        return {}
    return {k: v for k, v in found.items()
            if isinstance(k, str) and type(v) is int and v >= 0}


def _keep_sizes(directory: Path, sizes: dict[str, int]) -> None:
    """Replace ``.sizes`` whole (a reader sees the old file or the new one); a failure
    only means the next pass measures again."""
    temp = directory / f"{SIZES}.{os.getpid()}.tmp"
    try:
        temp.write_text(json.dumps(sizes, sort_keys=True), encoding="utf-8")
        os.replace(temp, directory / SIZES)
    except OSError:
        with contextlib.suppress(OSError):  # a directory gone read-only, say
            temp.unlink(missing_ok=True)


def _size(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
    return total
