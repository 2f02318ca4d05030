"""What the last watched pass of a pair found per path, reused while its inputs are equal.

A watching owner of warm state (``filesync.sync.warm.WarmState``: the agent's, a watching
``Session``'s, the terminal backends') runs pass after pass over trees that mostly did
not change. Two results of a pass are pure functions of a few dicts (``sync.plan``):

- ``same``, the remote files unchanged since their last transfer, of the ancestors and
  the remote listing;
- ``quiet``, the paths in sync on all three sides, of ``same``, the ancestors, the host
  hashes and the host listing;
- the host hashes the stat cache vouches for (``host.scan.scan_cached``), of the host
  listing and the stat cache.

Each is kept with copies of exactly the inputs it came from and is handed out again only
when the new inputs compare equal to them. Dict equality runs in C (an unchanged entry is
the very same object, so most comparisons are one identity check), which is a small part
of the Python loop over every path it replaces; any difference at all, in any input, is a
miss and the result is computed afresh. So a result is never reused for inputs it was not
computed from, and whatever these inputs do not hold (time, options) never enters them.

Kept per pair (local root, remote root), for at most ``PAIRS`` pairs per owner
(``PassMemos``), and only by a watching owner: a one-shot run would pay the copies for
nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from typing import Any, Generic, NamedTuple, TypeVar

from filesync.core.lineage import Lineage
from filesync.tree.bounded import Bounded

#: Pairs remembered per owner (the agent serves a few, a fan-out one per remote).
PAIRS = 8

R = TypeVar("R")


class CachedScan(NamedTuple):
    """What ``scan_cached`` found, as the memo keeps it (copies, never changed).

    ``CachedScan`` and ``Carried`` are named tuples, not dataclasses: every run imports
    this module, and creating a dataclass costs ~1 ms of CPU (``filesync.core.record``)."""

    hashes: dict[str, str]
    misses: tuple[str, ...]
    cache_rows: dict[str, tuple[int, int, int, str]]


class Carried(NamedTuple):
    """What a pass found, with the lineages of the inputs it found it in (host listing,
    remote listing, state). The next pass takes the sets over (``carry.begin`` takes them
    out of the memo): they are updated in place, never copied. Of a pair in sync, every
    set is empty: nothing is kept per path."""

    lineages: tuple[Lineage, Lineage, Lineage]
    #: the stat-cache lookup's misses, read afresh by each pass; its hits and rows are
    #: not kept: they are the stat cache's rows, which the state keeps, but where a
    #: path's inputs changed since (``plan._carried_scan`` makes them again)
    misses: frozenset[str]
    #: remote files not unchanged since their last transfer (not in ``same``)
    rest: set[str]
    #: paths of the ancestors, host hashes or ``same`` that are not quiet
    loud: set[str]
    # ``same`` and ``quiet`` themselves are not kept: each holds nearly every path of an
    # idle tree (4 MB of set apiece at 100k files), and each is a view away
    # (``carry.AllBut``), ``same`` the remote files outside ``rest``, ``quiet`` the
    # ancestors outside ``loud``.


class Kept(Generic[R]):
    """One result of a pass with copies of the inputs it was computed from."""

    __slots__ = ("_inputs", "_result")

    def __init__(self) -> None:
        self._inputs: tuple[dict[Any, Any] | frozenset[Any], ...] = ()
        self._result: R | None = None

    def get(self, *inputs: Mapping[Any, Any] | Set[Any]) -> R | None:
        """The kept result if it came from inputs equal to ``inputs`` (in this order)."""
        if self._result is None or len(self._inputs) != len(inputs):
            return None
        for old, new in zip(self._inputs, inputs, strict=True):
            if len(old) != len(new) or old != new:
                return None
        return self._result

    def put(self, result: R, *inputs: Mapping[Any, Any] | Set[Any]) -> None:
        """Keep ``result`` (which its user never changes) with copies of the ``inputs``
        it was computed from."""
        self._inputs = tuple(frozenset(i) if isinstance(i, Set) else dict(i) for i in inputs)
        self._result = result


class PassMemo:
    """The kept results of one pair (see the module docstring), one field each."""

    __slots__ = ("carried", "quiet", "same", "scan")

    def __init__(self) -> None:
        #: ``unchanged_remote``'s answer, of (ancestors, remote listing)
        self.same: Kept[frozenset[str]] = Kept()
        #: ``quiet_paths``'s answer, of (same, ancestors, host hashes, host listing)
        self.quiet: Kept[frozenset[str]] = Kept()
        #: ``scan_cached``'s answer, of (host listing, stat cache)
        self.scan: Kept[CachedScan] = Kept()
        #: what a watched pass with lineages carries to the next (``sync.carry``)
        self.carried: Carried | None = None


class PassMemos:
    """The memos of one owner's pairs, the oldest forgotten beyond ``PAIRS``."""

    def __init__(self, pairs: int = PAIRS) -> None:
        self._pairs: Bounded[tuple[str, str], PassMemo] = Bounded(pairs)

    def for_pair(self, local_root: str, remote_root: str) -> PassMemo:
        """The pair's memo, empty the first time."""
        key = (local_root, remote_root)
        memo = self._pairs.get(key)
        if memo is None:
            memo = PassMemo()
            self._pairs.put(key, memo)
        return memo
