"""Plain data passed between scan, reconcile, apply and the transports."""

from __future__ import annotations

from typing import NamedTuple

from filesync.core.lineage import Lineage
from filesync.core.record import Record
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


class Skipped(NamedTuple):
    """A path that was seen but deliberately not synced: ``reason`` in words, ``code`` (a
    ``filesync.tree.wire.Reason``, ``None`` for the host's own rules) to decide on.

    A named tuple, and ``Listing`` a ``Record``, not dataclasses: every run imports this
    module, and creating a dataclass costs ~1 ms of CPU (``filesync.core.record``)."""

    path: str
    reason: str
    code: Reason | None = None

    @classmethod
    def of(cls, path: str, code: Reason, detail: str = "") -> Skipped:
        """Skipped for ``code``, its text derived from it (and the OS ``detail``)."""
        return cls(path, describe(code, detail), code)


class Listing(Record):
    """What one side holds under its root, after the exclusion rule pruned it."""

    __slots__ = ("digest", "entries", "excluded", "exists", "lineage", "root", "skipped")
    _fields = ("root", "exists", "entries", "skipped", "excluded", "digest", "lineage")

    def __init__(self, root: str, exists: bool, entries: dict[str, Entry] | None = None,
                 skipped: list[Skipped] | None = None, excluded: int = 0, digest: str = "",
                 lineage: Lineage | None = None) -> None:
        self.root = root
        self.exists = exists
        self.entries: dict[str, Entry] = {} if entries is None else entries
        self.skipped: list[Skipped] = [] if skipped is None else skipped
        self.excluded = excluded
        #: what the walk found, as a digest: two listings of one root with the same
        #: non-empty digest are equal, field by field and in order ("" when not taken)
        self.digest = digest
        #: the version of a tree kept current (a watch, a delta base) this listing is, so
        #: a later pass can ask what changed since (``filesync.core.lineage``); None:
        #: unknown
        self.lineage = lineage

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
