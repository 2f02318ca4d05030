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
"""

from filesync.session.aio import AsyncSession, SessionReport
from filesync.session.blocking import Session, Watch
from filesync.session.watch import WatchLoop

__all__ = ["AsyncSession", "Session", "SessionReport", "Watch", "WatchLoop"]
