"""What the helper's client keeps about listings between requests: the listing request
sent ahead of need (``EarlyListing``) and the listings a delta applies to (``DeltaBase``).

Guarantees: an early listing's reply is taken only by a ``list_tree`` for the same root
and rule (any other request reads and drops it first); a delta is asked for only against
a base of the same root and rule (``wire_key``), by its generation.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Final

from filesync.core.lineage import Series
from filesync.core.model import Entry, Skipped
from filesync.core.record import FrozenRecord
from filesync.tree.wire import Op


class DeltaBase(FrozenRecord):
    """A listing as received, generation ``gen`` of the helper's: a delta's starting point.

    ``DeltaBase`` and ``EarlyListing`` are ``FrozenRecord``s, not dataclasses: every run
    imports this module, and creating a dataclass costs ~1 ms of CPU
    (``filesync.core.record``)."""

    __slots__ = ("files", "gen", "odd", "safe", "series")
    _fields = ("gen", "files", "odd", "safe", "series")

    def __init__(self, gen: int, files: dict[str, Entry], odd: dict[str, Skipped],
                 safe: bool = False, series: Series | None = None) -> None:
        self.gen: Final = gen
        self.files: Final = files
        self.odd: Final = odd
        #: every name in ``files`` passes the path-safety rule
        self.safe: Final = safe
        #: what each delta applied to this base changed
        self.series: Final = Series() if series is None else series


def wire_key(wire: dict[str, Any]) -> str:
    return json.dumps(wire, sort_keys=True)


class EarlyListing(FrozenRecord):
    """A listing request sent ahead whose reply is still unread: the next ``list_tree``
    takes the reply if it asks for the same root and rule; any other request first reads
    and drops it (``HelperEndpoint._settle``)."""

    __slots__ = ("path", "resolved", "wire")
    _fields = ("path", "wire", "resolved")

    def __init__(self, path: str, wire: dict[str, Any], resolved: bool) -> None:
        #: the root as sent: as the user wrote it (``start``) or already resolved
        self.path: Final = path
        self.wire: Final = wire
        self.resolved: Final = resolved

    def answers(self, root: str, wire: dict[str, Any], resolve: Callable[[str], str]) -> bool:
        """True if its reply is the listing of ``root`` (absolute) under ``wire``."""
        return (self.path if self.resolved else resolve(self.path)) == root \
            and self.wire == wire


def list_request(root: str, wire: dict[str, Any], since: int | None) -> dict[str, Any]:
    """A listing request that lets the helper answer with a delta against ``since``."""
    req: dict[str, Any] = {"op": Op.LIST.value, "root": root, **wire, "delta": True}
    if since is not None:
        req["since"] = since
    return req


__all__ = ["DeltaBase", "EarlyListing", "list_request", "wire_key"]
