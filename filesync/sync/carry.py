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
the whole tree to find them. It makes the two sets again from these with one set
difference each (in C); every rule runs in proportion to the edit, not to the tree.

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

from filesync.core.lineage import Lineage
from filesync.sync.memo import Carried, PassMemo


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
        self._remote: tuple[set[str], set[str]] | None = None
        self._plan: tuple[set[str], set[str]] | None = None

    def scanned(self, misses: list[str]) -> None:
        """The stat-cache lookup's misses, before any is read: read again this pass,
        their results are recomputed, and the next pass recomputes them too."""
        self._scan = frozenset(misses)
        self.recompute.update(misses)

    def compared(self, same: set[str], rest: set[str]) -> None:
        self._remote = (same, rest)

    def planned(self, quiet: set[str], loud: set[str]) -> None:
        self._plan = (quiet, loud)

    @property
    def rest(self) -> set[str]:
        assert self._remote is not None, "compared() comes first"
        return self._remote[1]

    def keep(self) -> None:
        """The pass is over: carry what it found to the next."""
        if self._scan is None or self._remote is None or self._plan is None:
            return  # a pass that stopped early (sealed, refused) carries nothing
        self.memo.carried = Carried(self.lineages, self._scan, self._remote[1],
                                    self._plan[1])


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
