"""filesync: bidirectional, crash-safe file sync over SSH.

The public API is small: ``Mapping`` describes one synced tree, ``push``/``pull``/
``sync`` run one pass over one pair, and ``FilesyncError`` is the base of every
expected failure (its message names the cause and the fix).
"""

from __future__ import annotations

from filesync.errors import FilesyncError, SafetyRefusal
from filesync.mapping import Mapping

__all__ = ["FilesyncError", "Mapping", "SafetyRefusal"]
__version__ = "0.1.0"
