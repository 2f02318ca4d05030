"""The fast "in sync" filters: which paths ``decide()`` would leave alone, found in bulk.

Most files of a large tree are unchanged on all three sides. Reconciling each one
(building its three ``Version`` values and calling ``decide()``) would cost the whole
tree every pass, so a pass first takes those files out with the two filters here and
reconciles only the rest. They restate no rule of their own: each says exactly that the
three versions ``decide()`` would be given are equal, which is the decision table's
"nothing to do" row (``tests/core/test_quiet.py`` holds them to ``decide()``).

- ``unchanged_remote``: the remote files whose version is the ancestor's. The remote's
  content is taken as unchanged when its size and mtime are as the last transfer left
  them and that mtime was more than ``racy_ns`` older than the transfer (the stat cache's
  racy-timestamp rule); its permission bits are compared as listed.
- ``quiet_paths``: of those, the paths whose host file has the ancestor's hash and
  permission bits. Host, remote and ancestor agree there: ``decide()`` yields ``None``
  in every direction, and these paths need no ``Version`` at all.

Both are one set comprehension over plain rows (no per-row function call), in the remote
listing's order; see ``docs/benchmarks.md`` for why they are shaped this way.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from typing import Protocol

from filesync.core.model import Entry


class AncestorRow(Protocol):
    """The fields of an ancestor row (``filesync.host.state.Ancestor``) the filters read."""

    @property
    def hash(self) -> str: ...
    @property
    def mode(self) -> int: ...
    @property
    def remote_size(self) -> int: ...
    @property
    def remote_mtime_ns(self) -> int: ...
    @property
    def synced_ns(self) -> int: ...


def unchanged_remote(
    ancestors: Mapping[str, AncestorRow], listed: Mapping[str, Entry], racy_ns: int
) -> set[str]:
    """The listed remote files whose version is their ancestor's: size and mtime as the
    last transfer left them, that mtime more than ``racy_ns`` before the transfer, and
    the permission bits the ancestor's."""
    get = ancestors.get
    return {
        rel for rel, e in listed.items()
        if (a := get(rel)) is not None and e.size == a.remote_size
        and e.mtime_ns == a.remote_mtime_ns and e.mode & 0o777 == a.mode
        and a.remote_mtime_ns < a.synced_ns - racy_ns
    }


def quiet_paths(
    ancestors: Mapping[str, AncestorRow], host_hashes: Mapping[str, str],
    host_entries: Mapping[str, Entry], listed: Mapping[str, Entry], same: Set[str],
) -> set[str]:
    """The paths of ``same`` (``unchanged_remote``'s answer) whose host file has the
    ancestor's hash and permission bits: in sync on all three sides.

    ``listed``: the remote listing, only for its order (sequential reads of the rows)."""
    keys: list[str] | Set[str] = list(filter(same.__contains__, listed))
    if len(keys) != len(same):
        keys = same
    hashes = host_hashes.get
    return {p for p in keys
            if hashes(p) == (a := ancestors[p]).hash and host_entries[p].mode & 0o777 == a.mode}


__all__ = ["AncestorRow", "quiet_paths", "unchanged_remote"]
