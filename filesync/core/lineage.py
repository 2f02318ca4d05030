"""What changed between two listings of one tree, from whoever keeps the tree current.

A watched host tree, the remote helper's delta base and the pair state's kept tables each
know exactly which paths they changed: a ``Series`` records them as numbered versions. A
``Lineage`` names one version of one series; a pass that kept results per path from an
earlier version (``filesync.sync.carry``) asks the series which paths changed since, and
recomputes only those.

Guarantees:

- ``changed_since(v)`` holds every path recorded after version ``v``, or is None when the
  series cannot say (``v`` is not one of its versions, or is older than what it keeps):
  the caller then recomputes everything. It never answers with fewer paths than changed.
- a keeper that changes its tree in a way it cannot name path by path (a full walk, a
  full listing, tables read again) starts a new ``Series``: no lineage of the old one
  matches it, so nothing is carried across.
- at most ``KEEP_PATHS`` paths are kept (the oldest versions go first), so a long watch
  never grows it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

#: Paths a series remembers at most, over its kept versions.
KEEP_PATHS = 20_000


class Series:
    """Numbered versions of one tree, each with the paths it changed."""

    __slots__ = ("_kept", "_log", "_oldest", "version")

    def __init__(self) -> None:
        self.version = 0
        #: versions whose paths are still known start after this one
        self._oldest = 0
        self._log: deque[tuple[int, tuple[str, ...]]] = deque()
        self._kept = 0

    def advance(self, paths: Iterable[str]) -> None:
        """Record a new version that changed ``paths`` (none: a version all the same)."""
        changed = tuple(paths)
        self.version += 1
        if changed:
            self._log.append((self.version, changed))
            self._kept += len(changed)
        while self._kept > KEEP_PATHS and self._log:
            version, dropped = self._log.popleft()
            self._kept -= len(dropped)
            self._oldest = version

    def changed_since(self, version: int) -> set[str] | None:
        """Every path changed after ``version``; None when that is not known here."""
        if not self._oldest <= version <= self.version:
            return None
        out: set[str] = set()
        for at, paths in reversed(self._log):
            if at <= version:
                break
            out.update(paths)
        return out

    def now(self) -> Lineage:
        return Lineage(self, self.version)


@dataclass(frozen=True, slots=True)
class Lineage:
    """Version ``version`` of ``series``."""

    series: Series
    version: int

    def changed_since(self, earlier: Lineage | None) -> set[str] | None:
        """Paths changed from ``earlier`` to this version; None when unknown (another
        series, or one that no longer remembers ``earlier``)."""
        if earlier is None or earlier.series is not self.series \
                or earlier.version > self.version:
            return None
        # (Versions recorded after this one are in it too: more paths, never fewer.)
        return self.series.changed_since(earlier.version)
