"""Sessions: push, pull, sync and status of mappings over one kept connection.

The library face for agent frameworks (above ``filesync.sync``, below ``filesync.cli``):

- ``AsyncSession`` for asyncio code; ``Session``, its blocking twin, for threaded code
  (any thread, none needs an event loop; concurrent calls are serialized; ``close()``
  from another thread works);
- ``SessionReport``: a ``Report`` summed over a call's passes, with each pass's own.

The guarantees of each call are in ``filesync.session.aio``; the mapping rules (single
files, nested mappings, upload-only) in ``filesync.session.passes``; the self-sync guard
in ``filesync.session.selfsync``. ``docs/library.md`` is the user's guide.
"""

from filesync.session.aio import AsyncSession, SessionReport
from filesync.session.blocking import Session

__all__ = ["AsyncSession", "Session", "SessionReport"]
