"""Modules loaded on first use that stay reachable while the interpreter tears down.

A CLI run loads only the code it runs, so code a run may skip (the transition, the
journal, watching, undo) is imported where it is first needed. A library session's call,
though, may run at interpreter teardown (an ``atexit`` hook, a finalizer), when Python
has emptied ``sys.modules`` and no ``import`` works, not even of a loaded module.

Guarantees:

- ``load(name)`` imports the module on its first call and returns that same module object
  on every later call without importing, so a call at teardown reaches every module
  loaded before it;
- the library tier loads every deferred module when it is imported
  (``filesync.session.runner.load_deferred``).
"""

from __future__ import annotations

import functools
import importlib
from types import ModuleType


@functools.cache
def load(name: str) -> ModuleType:
    """The module ``name``, imported on the first call only."""
    return importlib.import_module(name)
