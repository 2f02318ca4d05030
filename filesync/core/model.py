"""Plain data passed between scan, reconcile, apply and the transports."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from filesync.core.lineage import Lineage
from filesync.tree.paths import all_safe, unsafe_reason
from filesync.tree.wire import Reason, describe

#: The kind of every listed entry: the walks list regular files only.
FILE = "f"


class Entry(NamedTuple):
    """One listed path. ``path`` is POSIX and relative to the root.

    A named tuple, not a dataclass: each walk builds one per file on both sides of every
    pass, and a frozen dataclass is the slower row to build (figures in
    ``docs/benchmarks.md``).
    """

    path: str
    kind: str
    size: int
    mtime_ns: int
    mode: int
    ino: int = 0


@dataclass(frozen=True, slots=True)
class Skipped:
    """A path that was seen but deliberately not synced: ``reason`` in words, ``code`` (a
    ``filesync.tree.wire.Reason``, ``None`` for the host's own rules) to decide on."""

    path: str
    reason: str
    code: Reason | None = None

    @classmethod
    def of(cls, path: str, code: Reason, detail: str = "") -> Skipped:
        """Skipped for ``code``, its text derived from it (and the OS ``detail``)."""
        return cls(path, describe(code, detail), code)


@dataclass(slots=True)
class Listing:
    """What one side holds under its root, after the exclusion rule pruned it."""

    root: str
    exists: bool
    entries: dict[str, Entry] = field(default_factory=dict)
    skipped: list[Skipped] = field(default_factory=list)
    excluded: int = 0
    #: what the walk found, as a digest: two listings of one root with the same
    #: non-empty digest are equal, field by field and in order ("" when not taken)
    digest: str = ""
    #: the version of a tree kept current (a watch, a delta base) this listing is, so a
    #: later pass can ask what changed since (``filesync.core.lineage``); None: unknown
    lineage: Lineage | None = None

    def files(self) -> dict[str, Entry]:
        """The regular files (``entries`` holds nothing else: the walks skip the rest)."""
        return self.entries


def filter_unsafe(listing: Listing) -> None:
    """Move entries whose names fail the path-safety check (``tree.paths``) to
    ``skipped``: an unsafe name is never an entry, whichever side listed it."""
    if all_safe(listing.entries.keys()):
        return
    for rel in list(listing.entries):
        reason = unsafe_reason(rel)
        if reason is not None:
            del listing.entries[rel]
            listing.skipped.append(Skipped.of(rel, Reason.UNSAFE_PATH, reason))
