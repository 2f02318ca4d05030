"""Per-path results a watched pass carries to the next pass of its pair, which recomputes
them only where an input changed.

A watched pass (``Options.watch``) whose host tree is watched gets its host listing, its
remote listing and its state tables with lineages (``filesync.core.lineage``): the host's
watched tree, the helper's delta base and the state's kept tables each name the paths
they changed. Three planning results are functions of each path's own inputs alone:

- the stat-cache lookup (``host.scan.scan_cached``): from the host entry and cache row;
- ``same`` (``plan._unchanged_remote``): from the remote entry and the ancestor;
- ``quiet`` (``plan._quiet``): from ``same``, the ancestor, the host hash and entry;

so the next pass takes them over for every path whose inputs did not change, and runs
the same rules on the rest: the paths the three series name since the carried pass, and
the cache misses (read again every pass). ``same`` and ``quiet`` are carried as what they
leave out, the remote files outside ``same`` and the paths that were not quiet: an idle
tree's carried sets are then empty, and the pass reconciles those paths without sweeping
the whole tree to find them. The two sets, and the stat-cache lookup's hits and rows, are
never built again: they are views read through to the listing, ancestors and stat cache
of the pass (``AllBut``, ``Overlaid``), which the planning only tests for membership, so
every rule runs in proportion to the edit, not to the tree.

Guarantees:

- results are carried only from the pair's previous pass, and only when the three
  lineages of both passes are known and their series still name what changed since;
  otherwise (the first pass, a full walk, a new helper, the state written by another
  process or read again, a pass that failed, a listing without a lineage) the pass
  computes everything, and carries that on;
- the results are the full computation's (``tests/sync/test_carry.py`` holds the two to
  it over random changes on all three sides);
- only the results are kept, never copies of the inputs (``sync.memo`` keeps those for
  the passes that have no lineages), and of ``same`` and ``quiet`` only what they leave
  out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping, Set
from itertools import chain
from typing import Generic, TypeVar

from filesync.core.lineage import Lineage
from filesync.sync.memo import Carried, PassMemo

V = TypeVar("V")
R = TypeVar("R")
S = TypeVar("S")


class AllBut(Set[str]):
    """The keys of ``base`` but ``left_out``, read through: never a set of its own.

    A carried pass's ``same`` and ``quiet`` are this (every remote file but ``rest``,
    every ancestor but ``loud``), so a single edit costs no pass over the tree. A
    membership test and ``len`` are O(``left_out``); only iterating it walks ``base``,
    and a carried pass does not (``tests/sync/test_carry.py``).
    """

    __slots__ = ("_base", "_left_out")

    def __init__(self, base: Mapping[str, object], left_out: Set[str]) -> None:
        self._base = base
        self._left_out = left_out

    def __contains__(self, path: object) -> bool:
        return path in self._base and path not in self._left_out

    def __len__(self) -> int:
        base = self._base
        return len(base) - sum(1 for p in self._left_out if p in base)

    def __iter__(self) -> Iterator[str]:
        left_out = self._left_out
        return (p for p in self._base if p not in left_out)

    @classmethod
    def _from_iterable(cls, it: Iterable[S]) -> set[S]:
        # ``Set``'s operators build their answers with this: a plain set, of what they
        # iterate (``paths & same`` iterates ``paths``).
        return set(it)


class Overlaid(MutableMapping[str, V], Generic[R, V]):
    """A mapping read through to ``base`` (each value made by ``make``) but where it was
    changed: the stat-cache lookup's hits and rows of a carried pass, which are the
    state's cache rows but where a path's inputs changed, so that a single edit copies
    no 100k-entry dict. Changes stay here, ``base`` is never written.
    """

    __slots__ = ("_base", "_changed", "_gone", "_make")

    def __init__(self, base: Mapping[str, R], make: Callable[[R], V]) -> None:
        self._base = base
        self._make = make
        self._changed: dict[str, V] = {}
        self._gone: set[str] = set()

    def __getitem__(self, path: str) -> V:
        changed = self._changed
        if path in changed:
            return changed[path]
        if path in self._gone:
            raise KeyError(path)
        return self._make(self._base[path])

    def __contains__(self, path: object) -> bool:
        return path in self._changed or (path in self._base and path not in self._gone)

    def __setitem__(self, path: str, value: V) -> None:
        self._changed[path] = value

    def __delitem__(self, path: str) -> None:
        if path not in self:
            raise KeyError(path)
        self._changed.pop(path, None)
        if path in self._base:
            self._gone.add(path)

    def __len__(self) -> int:
        base, changed = self._base, self._changed
        hidden = sum(1 for p in self._gone if p not in changed) + sum(
            1 for p in changed if p in base)
        return len(base) + len(changed) - hidden

    def __iter__(self) -> Iterator[str]:
        changed, gone = self._changed, self._gone
        return chain(changed, (p for p in self._base if p not in changed and p not in gone))


class Carry:
    """One pass's use of what the previous pass carried, and what it carries on.

    ``carried`` is None for a pass that computes everything; else ``recompute`` names the
    paths whose inputs changed since. The planning steps hand their results in as they
    find them; ``keep`` hands them on once the pass is over.
    """

    def __init__(self, memo: PassMemo, lineages: tuple[Lineage, Lineage, Lineage],
                 carried: Carried | None, changed: set[str] | None) -> None:
        self.memo = memo
        self.lineages = lineages
        self.carried = carried
        #: the paths the series name since the carried pass (None: everything)
        self.recompute: set[str] = changed if changed is not None else set()
        #: the cache misses of the stat-cache lookup
        self._scan: frozenset[str] | None = None
        #: the remote files outside ``same``, the paths that are not quiet
        self._remote: set[str] | None = None
        self._plan: set[str] | None = None

    def scanned(self, misses: list[str]) -> None:
        """The stat-cache lookup's misses, before any is read: read again this pass,
        their results are recomputed, and the next pass recomputes them too."""
        self._scan = frozenset(misses)
        self.recompute.update(misses)

    def compared(self, rest: set[str]) -> None:
        self._remote = rest

    def planned(self, loud: set[str]) -> None:
        self._plan = loud

    @property
    def rest(self) -> set[str]:
        assert self._remote is not None, "compared() comes first"
        return self._remote

    def keep(self) -> None:
        """The pass is over: carry what it found to the next."""
        if self._scan is None or self._remote is None or self._plan is None:
            return  # a pass that stopped early (sealed, refused) carries nothing
        self.memo.carried = Carried(self.lineages, self._scan, self._remote, self._plan)


def begin(memo: PassMemo | None, host: Lineage | None, remote: Lineage | None,
          state: Lineage | None) -> Carry | None:
    """The pass's ``Carry``; None when a lineage is unknown (the memo is used instead).

    What the previous pass carried is taken out: a pass that fails carries nothing on.
    """
    if memo is None or host is None or remote is None or state is None:
        return None
    kept, memo.carried = memo.carried, None
    lineages = (host, remote, state)
    if kept is None:
        return Carry(memo, lineages, None, None)
    changed: set[str] = set()
    for now, then in zip(lineages, kept.lineages, strict=True):
        since = now.changed_since(then)
        if since is None:
            return Carry(memo, lineages, None, None)
        changed |= since
    return Carry(memo, lineages, kept, changed)
