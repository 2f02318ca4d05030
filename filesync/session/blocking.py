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
  engine's journal keeps both sides whole;
- teardown anywhere: calls and ``close()`` work from an ``atexit`` hook and from a
  finalizer run while the interpreter shuts down. An exit hook stops every session's loop
  thread (the interpreter would freeze it mid-call) and keeps the loop and its
  connection: later calls run that loop in the calling thread (``_park``), as does a
  session first used once the exit began. A session collected unclosed closes itself;
- a call finishes or raises a ``FilesyncError``: an exception filesync did not expect
  becomes ``InternalError`` (``ShutdownError`` during shutdown), one line.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import os
import sys
import threading
import warnings
import weakref
from collections.abc import Callable, Coroutine
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from filesync.core import offthread
from filesync.errors import FilesyncError, ShutdownError, UsageError
from filesync.session.aio import (
    AsyncSession,
    ConduitSource,
    Mappings,
    OnReport,
    SessionReport,
    StrPath,
    closed_error,
    unexpected_error,
)
from filesync.session.watch import WatchLoop

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
        lock_timeout: float = 60.0,
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
        self._serial = threading.Lock()  # held by the thread running the loop inline
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._inline = False  # the calls run the loop in their own threads (``_park``)
        self._runner: threading.Thread | None = None  # the thread running it inline
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

    def watch(self, mappings: Mappings, on_report: OnReport | None = None, *,
              force_polling: bool = False) -> Watch:
        """``AsyncSession.watch``: returns once the first pass is done; the passes then
        run on the session's loop thread (``on_report`` is called there) until the
        handle's ``stop()`` or ``close()``."""
        loop = self._submit(lambda: self._impl.watch(mappings, on_report,
                                                      force_polling=force_polling))
        return Watch(self, loop)

    def close(self) -> None:
        """Stop every watch (after its last pass), wait for a running call, close the
        connection, stop the loop thread."""
        self._refuse_own_thread()
        with self._guard:
            self._closed = True
            loop, inline = self._loop, self._inline
        if loop is None:
            return
        try:
            if inline:
                self._run_inline(loop, self._impl.close)
            else:
                _result(asyncio.run_coroutine_threadsafe(self._impl.close(), loop))
        finally:
            self._stop(loop)

    def __del__(self) -> None:
        # A session dropped unclosed (a framework's environment collected, at exit too)
        # still ends its helper and connection. The loop's own thread cannot wait for
        # itself: there the close runs as a task and stops the loop when done.
        loop = getattr(self, "_loop", None)  # None too when __init__ raised
        if loop is None or self._closed:
            return
        if not self._inline and threading.current_thread() is self._thread:
            self._closed = True
            loop.create_task(self._impl.close()).add_done_callback(lambda _: loop.stop())
            return
        with contextlib.suppress(FilesyncError):
            self.close()

    def __enter__(self) -> Session:
        """The session itself; leaving the block runs ``close()``."""
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
        me = threading.current_thread()
        if me is self._runner or (not self._inline and me is self._thread):
            raise UsageError("a Session was called from its own loop (a log callback or a "
                             "conduit factory); call it from another thread, or use "
                             "AsyncSession inside async code")

    def _submit(self, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        self._refuse_own_thread()
        with self._guard:
            if self._closed:
                raise closed_error()
            loop = self._running_loop()
            # Submitted under the guard: a close() that follows finds this call queued
            # ahead of its own, so the loop never stops under a call that was accepted.
            future = None if self._inline else asyncio.run_coroutine_threadsafe(make(), loop)
        if future is None:
            return self._run_inline(loop, make)
        try:
            return _result(future)
        except BaseException:
            future.cancel()
            raise

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            loop.set_default_executor(offthread.EXECUTOR)
            _wait_for_children_without_threads()
            if _EXITING or offthread.finalizing():
                # A thread started now would stop (or never start) with the
                # interpreter: the calls run in their callers' threads.
                self._loop, self._inline = loop, True
                return loop
            ready = threading.Event()

            def serve() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()

            thread = threading.Thread(target=serve, name="filesync-session", daemon=True)
            thread.start()
            ready.wait()
            self._loop, self._thread = loop, thread
            _LIVE.add(self)
        elif not self._inline and offthread.finalizing():
            raise ShutdownError("the interpreter is shutting down and this session's loop "
                                "thread has stopped; sync before exit (an atexit hook "
                                "works) or close() the session explicitly")
        return self._loop

    def _run_inline(self, loop: asyncio.AbstractEventLoop,
                    make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """Run one call on the session's loop in this thread (see ``_park``)."""
        with self._serial:
            if loop.is_closed():
                raise closed_error()
            self._runner = threading.current_thread()
            try:
                return loop.run_until_complete(make())
            except (FilesyncError, KeyboardInterrupt, SystemExit):
                raise
            except Exception as exc:
                raise unexpected_error(exc) from exc
            finally:
                self._runner = None

    def _park(self) -> None:
        """Stop the loop thread, keeping the loop and its connection: later calls run
        the loop in their callers' threads. Done for every live session at exit, before
        the interpreter freezes daemon threads (a finalizer's pull would wait on a frozen
        loop for ever)."""
        with self._guard:
            loop, thread = self._loop, self._thread
            if loop is None or thread is None or self._inline:
                return
            self._inline = True
        loop.call_soon_threadsafe(loop.stop)
        thread.join()

    def _stop(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._guard:
            if self._loop is not loop:
                return  # another close() stopped it meanwhile
            self._loop = None
            thread = None if self._inline else self._thread
        if thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
        with self._serial:
            loop.close()


def _result(future: concurrent.futures.Future[T]) -> T:
    try:
        return future.result()
    except (FilesyncError, KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:
        raise unexpected_error(exc) from exc


#: Set by the exit hook: the sessions' loops run in their callers' threads from then on.
_EXITING = False
#: The sessions whose loop runs in a thread of theirs.
_LIVE: weakref.WeakSet[Session] = weakref.WeakSet()


def _park_all() -> None:
    global _EXITING
    _EXITING = True
    for session in list(_LIVE):
        session._park()


atexit.register(_park_all)


def _wait_for_children_without_threads() -> None:
    """Before Python 3.12, asyncio waits for each child process (an ssh) in a thread of
    its own, which cannot start once the interpreter finalizes (a finalizer's sync hung
    there), and which stops for good then (a close waited for ever on a helper's exit).
    3.12 waits on a pidfd per child, in the loop itself; ``_PidfdWatcher`` does the same
    here, for every loop, in place of the default ``ThreadedChildWatcher`` only."""
    if sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open"):
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        if type(asyncio.get_child_watcher()) is not asyncio.ThreadedChildWatcher:
            return  # the application chose its own, or this was done already
        try:
            os.close(os.pidfd_open(os.getpid()))
        except OSError:
            return  # a kernel before 5.3
        asyncio.set_child_watcher(_PidfdWatcher())


class _PidfdWatcher(asyncio.AbstractChildWatcher):
    """Python 3.12's child watcher: the running loop reads a pidfd per child."""

    def add_child_handler(self, pid: int, callback: Callable[..., object],  # type: ignore[override]
                          *args: Any) -> None:
        loop = asyncio.get_running_loop()
        pidfd = os.pidfd_open(pid)
        loop.add_reader(pidfd, self._reap, loop, pid, pidfd, callback, args)

    @staticmethod
    def _reap(loop: asyncio.AbstractEventLoop, pid: int, pidfd: int,
              callback: Callable[..., object], args: tuple[Any, ...]) -> None:
        loop.remove_reader(pidfd)
        os.close(pidfd)
        try:
            _, status = os.waitpid(pid, 0)
            code = os.waitstatus_to_exitcode(status)
        except ChildProcessError:
            code = 255  # reaped elsewhere: asyncio reports the same
        callback(pid, code, *args)

    def remove_child_handler(self, pid: int) -> bool:
        return False  # readers end with their loop; asyncio never calls this for ours

    def attach_loop(self, loop: asyncio.AbstractEventLoop | None) -> None:
        """Any running loop: none is attached."""

    def close(self) -> None:
        """Holds nothing."""

    def is_active(self) -> bool:
        return True

    def __enter__(self) -> _PidfdWatcher:
        return self

    def __exit__(self, *exc: object) -> None:
        """Nothing to release."""


class Watch:
    """A running ``Session.watch``: ``stop()`` (from any thread but the session's own)
    runs a last pass and ends it, raising what stopped it early, if anything."""

    def __init__(self, session: Session, loop: WatchLoop[SessionReport]) -> None:
        self._session = session
        self.loop = loop

    @property
    def passes(self) -> int:
        """Passes run so far (the first included)."""
        return self.loop.passes

    @property
    def running(self) -> bool:
        """True until the watch ended (``stop`` returned, an error stopped it, or the
        session closed)."""
        return self.loop.running

    @property
    def error(self) -> BaseException | None:
        """What stopped the watch early (a safety guard, say), or None."""
        return self.loop.error

    def stop(self) -> None:
        """End the watch after one last pass, which is done when this returns (from any
        thread but the session's own: ``UsageError`` there); raises what stopped the
        watch early, if anything (after ``close()``, which ran the last pass, only that)."""
        self._session._refuse_own_thread()
        aio_loop = self._session._loop
        if aio_loop is None:  # the session was closed: close() stopped the watch
            if self.loop.error is not None:
                raise self.loop.error
            return
        if self._session._inline:  # at exit: the session's calls run in their callers
            self._session._run_inline(aio_loop, self.loop.stop)
            return
        _result(asyncio.run_coroutine_threadsafe(self.loop.stop(), aio_loop))

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the watch ends (an error, ``stop``); False if ``timeout`` passed."""
        self._session._refuse_own_thread()
        aio_loop = self._session._loop
        if aio_loop is None or self._session._inline:
            return not self.loop.running
        future = asyncio.run_coroutine_threadsafe(self._ended(), aio_loop)
        try:
            future.result(timeout)
        except TimeoutError:
            future.cancel()
            return False
        return True

    async def _ended(self) -> None:
        with contextlib.suppress(Exception):
            await self.loop.wait()
