"""The engine's terms that a caller of the runner names, in one place above the engine.

The CLI builds pass options and prints reports, changes and plans; it reaches none of
``sync``, ``endpoint`` or ``host`` itself (tests/test_layers.py), only these names, which
are the engine's own objects, re-exported unchanged."""

from __future__ import annotations

from filesync.endpoint.idle import IDLE_TIMEOUT, check_idle_timeout
from filesync.endpoint.renamed import Rename
from filesync.host.state import default_state_dir
from filesync.sync.changes import ChangeAction
from filesync.sync.engine import Options, Report, plan_row
from filesync.sync.progress import Progress, tty_progress
from filesync.sync.warm import WarmState

__all__ = ["IDLE_TIMEOUT", "ChangeAction", "Options", "Progress", "Rename", "Report",
           "WarmState", "check_idle_timeout", "default_state_dir", "plan_row",
           "tty_progress"]
