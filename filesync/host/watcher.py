"""Host trees watched for changes with ``watchfiles`` (inotify on Linux, FSEvents on macOS,
ReadDirectoryChangesW on Windows), for ``filesync.session.watch``.

Guarantees:

- excluded trees are never watched: each directory the exclusion rule keeps is watched on
  its own (not recursively), so no watch is ever placed in ``node_modules``, ``.git`` and
  the like, and their churn never wakes this process. A directory created or removed
  makes the set be listed again and the watch be placed anew; a pass is asked for at
  the same time, so a file written in a new directory before its watch existed is still
  seen by that pass.
- a change is never missed silently: where no native watcher starts (an unsupported
  platform or filesystem, the watch limit reached), the watcher says so once through
  ``log`` and asks for a pass every ``POLL`` seconds instead (``polling`` is then True).
- ``on_change`` is called from the watcher's own thread, after a burst has settled for
  ``step_ms`` (at most ``debounce_ms`` after its first event); it must only signal.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from filesync.core.exclude import ExcludeRule

#: Seconds between passes when no native watcher works.
POLL = 2.0
#: watchfiles' change codes (``watchfiles.Change``): added, modified, deleted.
_ADDED, _DELETED = 1, 3


class HostWatcher:
    """Watch the host roots of a watch loop; see the module docstring."""

    def __init__(
        self,
        roots: Sequence[tuple[Path, ExcludeRule]],
        on_change: Callable[[], None],
        log: Callable[[str], None] | None = None,
        *,
        debounce_ms: int = 500,
        step_ms: int = 30,
        force_polling: bool = False,
    ) -> None:
        self.roots = [(str(root), rule) for root, rule in roots]
        self.on_change = on_change
        self.log = log
        self.debounce_ms, self.step_ms = debounce_ms, step_ms
        #: True once the watcher fell back to polling (it never goes back)
        self.polling = force_polling
        #: directories watched now (tests and the bench read it)
        self.dirs: set[str] = set()
        #: times the watch was placed (1 + the restructurings)
        self.builds = 0
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="filesync-host-watch",
                                        daemon=True)

    def start(self) -> None:
        """Start watching; returns once the watch is placed (or polling began), so a
        change made after it returns is seen."""
        self._thread.start()
        self._ready.wait()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    # -- the thread -----------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._watch()
        finally:
            self._ready.set()

    def _watch(self) -> None:
        from watchfiles._rust_notify import RustNotify

        while not self._stop.is_set():
            if self.polling:
                self._ready.set()
                if self._stop.wait(POLL):
                    return
                self.on_change()
                continue
            self.dirs = self._list_dirs()
            if not self.dirs:  # a root not there (yet): the passes will say why
                self._ready.set()
                if self._stop.wait(POLL):
                    return
                self.on_change()
                continue
            try:
                notify = RustNotify(sorted(self.dirs), False, False, 0, False, True)
            except FileNotFoundError:
                self.on_change()  # a directory went between the listing and its watch
                continue
            except Exception as exc:  # the watch limit, no watcher on this platform
                self._fall_back(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
                continue
            self.builds += 1
            self._ready.set()
            if self.builds > 1:
                self.on_change()  # changes made while the watch was placed anew
            try:
                self._serve(notify)
            finally:
                notify.close()

    def _serve(self, notify: object) -> None:
        """Report changes until the set of directories changes or the watcher stops."""
        watch = getattr(notify, "watch")  # noqa: B009 - RustNotify is untyped
        while not self._stop.is_set():
            raw = watch(self.debounce_ms, self.step_ms, 5000, self._stop)
            if not isinstance(raw, set):  # "timeout", "stop" or "signal"
                continue
            wanted, restructure = self._classify(raw)
            if wanted:
                self.on_change()
            if restructure:
                return

    def _classify(self, raw: set[tuple[int, str]]) -> tuple[bool, bool]:
        """(a change the rule keeps, the set of watched directories changed)."""
        wanted = restructure = False
        for change, path in raw:
            if path in self.dirs and change == _DELETED:
                wanted = restructure = True
                continue
            found = self._rel(path)
            if found is None:
                continue
            rel, rule = found
            is_dir = change != _DELETED and os.path.isdir(path) and not os.path.islink(path)
            if rel and rule.excluded(rel, is_dir):
                continue
            wanted = True
            if is_dir and change == _ADDED:
                restructure = True
        return wanted, restructure

    def _rel(self, path: str) -> tuple[str, ExcludeRule] | None:
        for root, rule in self.roots:
            if path == root:
                return "", rule
            if path.startswith(root.rstrip(os.sep) + os.sep):
                return os.path.relpath(path, root).replace(os.sep, "/"), rule
        return None

    def _list_dirs(self) -> set[str]:
        """Every directory under the roots that the rule keeps, the roots included."""
        out: set[str] = set()
        for root, rule in self.roots:
            matcher = rule.matcher()
            if not os.path.isdir(root):
                continue
            stack = [(root, "")]
            while stack:
                path, rel = stack.pop()
                out.add(path)
                try:
                    with os.scandir(path) as it:
                        for entry in it:
                            if not entry.is_dir(follow_symlinks=False):
                                continue
                            sub = f"{rel}{entry.name}"
                            if not matcher.matches(sub, True):
                                stack.append((entry.path, sub + "/"))
                except OSError:
                    continue  # unreadable: the pass reports it
        return out

    def _fall_back(self, why: str) -> None:
        if not self.polling and self.log is not None:
            self.log(f"watching the host tree natively failed ({why}); polling every "
                     f"{POLL:g} s instead")
        self.polling = True

