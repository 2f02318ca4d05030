"""Blocking work off the event loop, at any point of the interpreter's life.

``concurrent.futures`` refuses new work once the interpreter's exit has begun (its own
``threading`` exit hook runs before any ``atexit`` hook), and asyncio's default executor
is one of its pools: a sync-back from an ``atexit`` hook failed there with
``RuntimeError``. So the engine hands its blocking work (host walks, state reads, tar
parsing) to ``EXECUTOR`` instead.

Guarantees:

- ``EXECUTOR`` runs each call in a plain daemon thread of its own, whether or not the
  interpreter's exit has begun (threads still start during ``atexit``);
- once the interpreter is finalizing (``sys.is_finalizing()``: a finalizer run while
  modules are torn down) no thread can start (CPython blocks a thread's start then for
  ever), so a call runs inline in the caller's thread instead, before ``submit`` returns;
  ``start(..., inline=False)`` raises ``ShutdownError`` then, for work that needs the
  loop to keep running beside it;
- ``EXECUTOR`` is a ``ThreadPoolExecutor`` by type, so a session's own loop takes it as
  its default executor (``loop.set_default_executor``), and library code that offloads
  to the default (asyncssh's name lookups) works at exit too. ``shutdown`` is a no-op:
  it is shared and holds no threads of its own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from filesync.errors import ShutdownError

T = TypeVar("T")


def finalizing() -> bool:
    """Whether no thread can start any more (the interpreter is tearing modules down)."""
    return sys.is_finalizing()


class ThreadPerCall(concurrent.futures.ThreadPoolExecutor):
    """An executor that starts a thread per call, or runs it inline while finalizing."""

    def __init__(self) -> None:
        super().__init__(max_workers=1, thread_name_prefix="filesync")

    def submit(self, fn: Callable[..., T], /, *args: Any,
               **kwargs: Any) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(result)

        if finalizing():
            run()
        else:
            threading.Thread(target=run, name="filesync-worker", daemon=True).start()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Shared, and owns no threads: nothing to shut down."""


EXECUTOR = ThreadPerCall()


def start(fn: Callable[..., T], *args: Any, inline: bool = True) -> asyncio.Future[T]:
    """``fn(*args)`` in a thread of its own (see the module doc), as a future of the
    running loop; submitted at once, before the caller's next await.

    ``inline=False``: ``fn`` needs the loop to run beside it (it waits on the loop), so
    it cannot run inline; while finalizing that is ``ShutdownError``."""
    if not inline and finalizing():
        raise ShutdownError("the interpreter is shutting down and this transfer needs a "
                            "thread; sync before exit (from an atexit hook, or close() "
                            "the session explicitly)")
    return asyncio.get_running_loop().run_in_executor(EXECUTOR, fn, *args)
