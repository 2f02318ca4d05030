"""Mappings: which host tree goes to which remote tree, and in which directions."""

from __future__ import annotations

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
