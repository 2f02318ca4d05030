"""The one bounded cache: a dict of at most ``limit`` entries, oldest put evicted first.

Used wherever something is kept between calls (the helper's remembered listings and
watched trees, the client's delta bases, the host's watched trees, idle state databases):
one eviction rule, and each evicted value is handed to ``evict`` so it can be closed.
"""

from __future__ import annotations

#: ``typing`` is for the type checker only: the remote helper starts without importing it.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Generic, TypeVar

    K = TypeVar("K")
    V = TypeVar("V")
else:
    class Generic:
        """What ``Bounded`` needs of ``typing.Generic`` at run time: a subscript (in
        annotations, which are never evaluated here) that names the class itself."""

        def __class_getitem__(cls, params: object) -> type:
            return cls

    K = V = None


class Bounded(Generic[K, V]):
    """At most ``limit`` entries; ``put`` makes an entry the newest, evicting the oldest.

    Not thread-safe: callers that share one across threads hold their own lock.
    """

    def __init__(self, limit: int, evict: Callable[[V], None] | None = None) -> None:
        if limit < 1:
            raise ValueError("a bounded cache holds at least one entry")
        self.limit = limit
        self._evict = evict
        self._items: dict[K, V] = {}

    def put(self, key: K, value: V) -> None:
        """Store ``value`` as the newest entry; evict the oldest beyond ``limit``."""
        self._items.pop(key, None)
        self._items[key] = value
        while len(self._items) > self.limit:
            oldest = self._items.pop(next(iter(self._items)))
            if self._evict is not None:
                self._evict(oldest)

    def get(self, key: K) -> V | None:
        """The entry for ``key``, left where it is, or None."""
        return self._items.get(key)

    def pop(self, key: K) -> V | None:
        """Remove and return the entry for ``key`` (not evicted: the caller owns it now)."""
        return self._items.pop(key, None)

    def drain(self) -> Iterator[V]:
        """Remove every entry, newest first, yielding each (the caller owns them)."""
        while self._items:
            yield self._items.popitem()[1]

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)
