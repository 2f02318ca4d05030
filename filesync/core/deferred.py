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
  (``filesync.session.runner.load_deferred``);
- ``lazy_names`` gives a package's public names that are imported on first access (a
  module ``__getattr__``), each bound into the package once imported.
"""

from __future__ import annotations

import functools
import importlib
import sys

#: ``typing.TYPE_CHECKING`` without importing ``typing``, which the CLI's path to ssh's
#: login leaves out (``filesync.cli.main``); mypy and ruff treat the name alike.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from types import ModuleType
    from typing import Any


@functools.cache
def load(name: str) -> ModuleType:
    """The module ``name``, imported on the first call only."""
    return importlib.import_module(name)


def lazy_names(
    package: str, sources: Mapping[str, str], public: Sequence[str],
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``, whose names in ``sources`` (name
    -> the module defining it) are imported on first access; ``public`` is its
    ``__all__``."""
    namespace = sys.modules[package].__dict__

    def get(name: str) -> Any:
        try:
            source = sources[name]
        except KeyError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        value = getattr(importlib.import_module(source), name)
        namespace[name] = value
        return value

    def names() -> list[str]:
        return sorted(set(namespace) | set(public))

    return get, names
