"""Mappings: which host tree goes to which remote tree, and in which directions."""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from dataclasses import dataclass

TWO_WAY = "two-way"
UPLOAD_ONLY = "upload-only"


@dataclass(frozen=True)
class Mapping:
    """One synced tree. ``upload-only`` trees are pushed but never written back."""

    local: str
    remote: str
    mode: str = TWO_WAY

    def __post_init__(self) -> None:
        if self.mode not in (TWO_WAY, UPLOAD_ONLY):
            raise ValueError(
                f"mapping mode {self.mode!r} is not valid; use {TWO_WAY!r} or {UPLOAD_ONLY!r}"
            )


def owning_mapping(mappings: Sequence[Mapping], remote_path: str) -> Mapping | None:
    """The two-way mapping whose remote root is the longest prefix of ``remote_path``.

    Host paths come only from this, never from guessing by "known" files.
    """
    best: Mapping | None = None
    target = posixpath.normpath(remote_path)
    for mapping in mappings:
        root = posixpath.normpath(mapping.remote)
        inside = target == root or target.startswith(root.rstrip("/") + "/")
        if mapping.mode == TWO_WAY and inside and (
            best is None or len(root) > len(posixpath.normpath(best.remote))
        ):
            best = mapping
    return best
