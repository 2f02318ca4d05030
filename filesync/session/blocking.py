"""``Session``: the blocking face of ``AsyncSession``, usable from any thread.

Guarantees:

- works from any thread, one with no event loop included: the session runs its own loop
  in a private daemon thread (started on the first call) and hands each call to it with
  ``run_coroutine_threadsafe``; the calling thread blocks until the call is done;
- calls from several threads at once are serialized, in arrival order (``AsyncSession``'s
  lock, taken inside the one loop);
- ``close()`` may come from any thread (a reaper): new calls then raise
  ``SessionClosed``, a running call is waited for (never cut), then the helper and the
  connection end and the loop thread stops. Twice is fine;
- a call made from inside the session's own loop (a ``log`` callback) raises
  ``UsageError`` rather than deadlocking;
- interrupting the waiting thread (``KeyboardInterrupt``) cancels the running call; the
  engine's journal keeps both sides whole.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from filesync.errors import UsageError
from filesync.session.aio import (
    AsyncSession,
    ConduitSource,
    Mappings,
    SessionReport,
    StrPath,
    closed_error,
)

T = TypeVar("T")


class Session:
    """Blocking ``push``/``pull``/``sync``/``status`` over one kept connection.

    Takes exactly ``AsyncSession``'s arguments; see there and ``docs/library.md``.
    """

    def __init__(
        self,
        remote: StrPath | None = None,
        *,
        conduit: ConduitSource | None = None,
        ssh_config: StrPath | None = None,
        identity: StrPath | None = None,
        via: str | list[str] | tuple[str, ...] | None = None,
        state_dir: StrPath | None = None,
        exclude: list[str] | tuple[str, ...] = (),
        default_excludes: bool = True,
        accept_new_host_key: bool = False,
        timeout: float | None = None,
        lock_timeout: float | None = None,
        connect_timeout: float = 15.0,
        ssh_options: list[str] | tuple[str, ...] = (),
        force: bool = False,
        max_file_size: int = 1 << 30,
        max_pull_bytes: int = 2 << 30,
        watch: bool = False,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self._impl = AsyncSession(
            remote, conduit=conduit, ssh_config=ssh_config, identity=identity, via=via,
            state_dir=state_dir, exclude=exclude, default_excludes=default_excludes,
            accept_new_host_key=accept_new_host_key, timeout=timeout,
            lock_timeout=lock_timeout, connect_timeout=connect_timeout,
            ssh_options=ssh_options, force=force,
            max_file_size=max_file_size, max_pull_bytes=max_pull_bytes, watch=watch, log=log,
        )
        self._guard = threading.Lock()  # the loop's start and stop, and ``_closed``
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

    @property
    def state_dir(self) -> Path:
        """Where the session keeps its state."""
        return self._impl.state_dir

    @property
    def connections_opened(self) -> int:
        """How many connections the session opened (one, unless one was lost)."""
        return self._impl.connections_opened

    def push(self, mappings: Mappings, *, keep_going: bool = False) -> SessionReport:
        """``AsyncSession.push``, blocking."""
        return self._submit(lambda: self._impl.push(mappings, keep_going=keep_going))

    def pull(self, mappings: Mappings, *, keep_going: bool = False) -> SessionReport:
        """``AsyncSession.pull``, blocking."""
        return self._submit(lambda: self._impl.pull(mappings, keep_going=keep_going))

    def sync(self, mappings: Mappings, *, keep_going: bool = False) -> SessionReport:
        """``AsyncSession.sync``, blocking."""
        return self._submit(lambda: self._impl.sync(mappings, keep_going=keep_going))

    def status(self, mappings: Mappings) -> SessionReport:
        """``AsyncSession.status``, blocking."""
        return self._submit(lambda: self._impl.status(mappings))

    def close(self) -> None:
        """Wait for a running call, close the connection, stop the loop thread."""
        self._refuse_own_thread()
        with self._guard:
            self._closed = True
            loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self._impl.close(), loop).result()
        finally:
            with self._guard:
                if self._loop is loop:
                    loop.call_soon_threadsafe(loop.stop)
                    self._loop = None
                    stop = True
                else:
                    stop = False  # another close() stopped it meanwhile
            if stop:
                thread.join()
                loop.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- internals ----------------------------------------------------------------

    def _refuse_own_thread(self) -> None:
        if self._thread is not None and threading.current_thread() is self._thread:
            raise UsageError("a Session was called from its own loop (a log callback or a "
                             "conduit factory); call it from another thread, or use "
                             "AsyncSession inside async code")

    def _submit(self, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        self._refuse_own_thread()
        with self._guard:
            if self._closed:
                raise closed_error()
            # Submitted under the guard: a close() that follows finds this call queued
            # ahead of its own, so the loop never stops under a call that was accepted.
            future = asyncio.run_coroutine_threadsafe(make(), self._running_loop())
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def serve() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()

            thread = threading.Thread(target=serve, name="filesync-session", daemon=True)
            thread.start()
            ready.wait()
            self._loop, self._thread = loop, thread
        return self._loop
