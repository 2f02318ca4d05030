"""Sessions: push, pull, sync and status of mappings over one kept connection.

The library face for agent frameworks (above ``filesync.sync``, below ``filesync.cli``):

- ``AsyncSession`` for asyncio code; ``Session``, its blocking twin, for threaded code
  (any thread, none needs an event loop; concurrent calls are serialized; ``close()``
  from another thread works);
- ``SessionReport``: a ``Report`` summed over a call's passes, with each pass's own;
- ``watch()``: continuous two-way sync, a pass whenever either side changes
  (``filesync.session.watch``), ended by its handle's ``stop()`` (``Watch`` for
  ``Session``, ``WatchLoop`` for ``AsyncSession``).

The guarantees of each call are in ``filesync.session.aio``; the mapping rules (single
files, nested mappings, upload-only) in ``filesync.session.passes``; the self-sync guard
in ``filesync.session.selfsync``; every call's passes, like the CLI's and the agent's, run
through ``filesync.session.runner`` (its retry, guard and deadline), and each session owns
its warm state (``filesync.sync.warm.WarmState``). ``docs/library.md`` is the user's
guide.

The library names are imported on first use: the CLI reaches the runner through
``filesync.session.runner`` and ``filesync.session.terms``, and importing either (which
runs this package first) must not pay for the library tier a CLI run never touches.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from filesync.core.deferred import lazy_names

if TYPE_CHECKING:
    from filesync.session.aio import AsyncSession, SessionReport
    from filesync.session.blocking import Session, Watch
    from filesync.session.watch import WatchLoop

__all__ = ["AsyncSession", "Session", "SessionReport", "Watch", "WatchLoop"]

__getattr__, __dir__ = lazy_names(__name__, {
    "AsyncSession": "filesync.session.aio",
    "SessionReport": "filesync.session.aio",
    "Session": "filesync.session.blocking",
    "Watch": "filesync.session.blocking",
    "WatchLoop": "filesync.session.watch",
}, __all__)
