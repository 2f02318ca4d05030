"""The wake-ups of a watch loop (``filesync.session.watch``) from its host trees.

The events come from the trees' own watches (``filesync.host.watched.WatchedTree.follow``):
the watch that keeps a tree's listing current is the one that wakes the loop, so a
watch loop places one watch per tree, never two.

Guarantees:

- excluded trees are never watched (``WatchedTree``: each directory the exclusion rule
  keeps is watched on its own), and their churn never wakes this process;
- a change is never missed silently: where a tree cannot be watched (no native watcher,
  the watch limit, a network filesystem), the watcher says so once through ``log`` and
  asks for a pass every ``POLL`` seconds instead (``polling`` is then True);
- ``on_change`` is called from a watch's own thread, after a burst has settled; it must
  only signal.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from filesync.core.exclude import ExcludeRule
from filesync.host.watched import WatchedTree, WatchedTrees

#: Seconds between passes when no native watcher works.
POLL = 2.0


class HostWatcher:
    """Wake a watch loop when its host roots change; see the module docstring.

    ``trees``: the owner's watched trees (their watches are shared with its listings);
    without it the watcher keeps trees of its own."""

    def __init__(
        self,
        roots: Sequence[tuple[Path, ExcludeRule]],
        on_change: Callable[[], None],
        log: Callable[[str], None] | None = None,
        *,
        trees: WatchedTrees | None = None,
        force_polling: bool = False,
    ) -> None:
        self.roots = list(roots)
        self.on_change = on_change
        self.log = log
        self.trees = trees if trees is not None else WatchedTrees()
        self._own_trees = trees is None
        #: True once the watcher fell back to polling (it never goes back)
        self.polling = force_polling
        self._followed: list[WatchedTree] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._poller: threading.Thread | None = None

    @property
    def dirs(self) -> set[str]:
        """The directories watched now (tests and the bench read it)."""
        return {d for tree in self._followed for d in tree.watched}

    def start(self) -> None:
        """Start watching; returns once every watch is placed (or polling began), so a
        change made after it returns is seen."""
        why = ""
        if not self.polling:
            for root, rule in self.roots:
                tree = self.trees.get(root, rule)
                if tree is None:
                    why = "a network or FUSE filesystem"
                    break
                why = tree.follow(self._woken)
                if why:
                    break
                self._followed.append(tree)
        if self.polling or why:
            self._start_polling(why)

    def _woken(self) -> None:
        self.on_change()
        # A watch that broke for good (the watch limit reached as it was placed anew)
        # wakes its followers one last time: poll from then on.
        lost = next((tree.why for tree in self._followed if tree.why), "")
        if lost:
            self._start_polling(lost)

    def _start_polling(self, why: str) -> None:
        with self._lock:
            if self._poller is not None or self._stop.is_set():
                return
            self._fall_back(why)
            self._poller = threading.Thread(target=self._poll, name="filesync-host-poll",
                                            daemon=True)
            self._poller.start()
        self._unfollow()

    def stop(self) -> None:
        with self._lock:
            self._stop.set()
            poller = self._poller
        self._unfollow()
        if poller is not None and poller is not threading.current_thread():
            poller.join()
        if self._own_trees:
            self.trees.close()

    def _unfollow(self) -> None:
        followed, self._followed = self._followed, []
        for tree in followed:
            tree.unfollow(self._woken)

    def _poll(self) -> None:
        while not self._stop.wait(POLL):
            self.on_change()

    def _fall_back(self, why: str) -> None:
        if not self.polling and self.log is not None:
            self.log(f"watching the host tree natively failed ({why}); polling every "
                     f"{POLL:g} s instead")
        self.polling = True
