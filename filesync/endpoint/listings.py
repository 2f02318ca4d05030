"""What the helper's client keeps about listings between requests: the listing request
sent ahead of need (``EarlyListing``) and the listings a delta applies to (``DeltaBase``).

Guarantees: an early listing's reply is taken only by a ``list_tree`` for the same root
and rule (any other request reads and drops it first); a delta is asked for only against
a base of the same root and rule (``wire_key``), by its generation.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from filesync.core.lineage import Series
from filesync.core.model import Entry, Skipped
from filesync.tree.wire import Op


@dataclass(frozen=True, slots=True)
class DeltaBase:
    """A listing as received, generation ``gen`` of the helper's: a delta's starting point."""

    gen: int
    files: dict[str, Entry]
    odd: dict[str, Skipped]
    #: every name in ``files`` passes the path-safety rule
    safe: bool = False
    #: what each delta applied to this base changed
    series: Series = field(default_factory=Series)


def wire_key(wire: dict[str, Any]) -> str:
    return json.dumps(wire, sort_keys=True)


@dataclass(frozen=True, slots=True)
class EarlyListing:
    """A listing request sent ahead whose reply is still unread: the next ``list_tree``
    takes the reply if it asks for the same root and rule; any other request first reads
    and drops it (``HelperEndpoint._settle``)."""

    #: the root as sent: as the user wrote it (``start``) or already resolved
    path: str
    wire: dict[str, Any]
    resolved: bool

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
