"""The helper's watchdog thread: keepalives while it works, and no orphan when its client goes.

``Watchdog`` runs beside the request loop (``filesync.tree.server.serve``):

- while a request is being worked on (``busy``), a ``K`` frame goes out whenever nothing
  was written for ``every`` seconds (``Channel.keepalive``, checked every ``every / 2``
  s: the longest silence is ``1.5 * every``, 7.5 s by default; the client asks for a
  quarter of its idle deadline, so at most 3/8 of it). A long walk, a big file's read, a
  slow fsync or a slow disk never looks like a hung helper to the client. Between
  requests nothing is sent: the client owes the next request, and a session kept open for
  hours must not fill its pipe.
- when the client is gone, the helper exits: the request loop gets ``GRACE`` seconds to
  see the end of input or the broken pipe itself and unwind (removing an upload's temp
  file), then ``os._exit`` ends it (a main thread stuck in a long operation cannot be
  interrupted any other way). Gone means: stdout's reader closed it (a pipe's writer
  sees POLLERR, a socket POLLHUP), which is what sshd does when the connection dies or
  the client is killed; or stdin hung up while a request is
  being worked on (the client never closes its side mid-request; between requests the
  loop reads the end of input itself and returns). Nothing the helper started outlives
  it: it starts no process, and its descriptors (inotify watches) close with it; an
  upload cut off by ``os._exit`` is left under a temp name, which a later walk removes
  once stale, never in place.
"""

from __future__ import annotations

import os
import select
import time
from _thread import start_new_thread

from filesync.tree.channel import Channel
from filesync.tree.wire import KEEPALIVE

#: The exit status of a helper whose client went away (nobody reads it; for tests and logs).
ORPHANED = 75
#: How long the request loop gets to end on its own once the client is gone (seconds).
GRACE = 1.0
_GONE = select.POLLHUP | select.POLLERR | select.POLLNVAL


class Watchdog:
    """Keepalives and the orphan check for one helper; ``start`` launches its thread.

    ``begin``/``end`` bracket the work on one request; ``pace`` sets the keepalive period.
    Between requests the thread sleeps in ``poll`` until a hang-up or a wake-up (a byte
    on its own pipe), so an idle helper costs nothing.
    """

    def __init__(self, chan: Channel, inp_fd: int, out_fd: int) -> None:
        self.chan = chan
        self.every = KEEPALIVE
        self.busy = False
        self._poll = select.poll()
        self._inp, self._out = inp_fd, out_fd
        self._wake_r, self._wake_w = os.pipe()
        # No POLLIN: pending requests are the loop's to read; only hang-ups are reported.
        self._poll.register(inp_fd, 0)
        self._poll.register(out_fd, 0)
        self._poll.register(self._wake_r, select.POLLIN)

    def start(self) -> None:
        # A bare thread (``threading`` is not needed, nor imported at start-up): the process
        # ends with ``os._exit``, so nothing has to join it.
        start_new_thread(self._run, ())

    def pace(self, every: float) -> None:
        self.every = max(min(every, KEEPALIVE), 0.05)
        os.write(self._wake_w, b".")

    def begin(self) -> None:
        self.busy = True
        os.write(self._wake_w, b".")

    def end(self) -> None:
        self.busy = False

    def _run(self) -> None:
        while True:
            period = self.every / 2
            for fd, events in self._poll.poll(period * 1000 if self.busy else None):
                if fd == self._wake_r:
                    os.read(self._wake_r, 512)
                elif events & _GONE:
                    if fd == self._out or self.busy:
                        # A main thread that is not stuck unwinds by itself (an upload's
                        # temp file removed) and ends the process before the grace ends.
                        time.sleep(GRACE)
                        os._exit(ORPHANED)
                    # stdin ended between requests: the loop reads that end itself and
                    # returns; poll would report it at once again, so pace the loop.
                    time.sleep(period)
            if self.busy:
                try:
                    self.chan.keepalive(self.every)
                except OSError:  # stdout is gone: the next poll says so
                    pass


#: Fault injection for the deadline and orphan tests, inert unless set in the helper's
#: environment (over SSH: ``~/.ssh/environment`` where sshd permits it).
STALL_ENV = "FILESYNC_TEST_STALL"


def stall_point(name: str) -> None:
    """``FILESYNC_TEST_STALL=NAME:SECONDS`` makes the helper sleep SECONDS at step NAME,
    as a hung filesystem or a huge tree would keep it busy. Steps: ``list`` (before the
    walk of a listing), ``fetch`` (before each file of a fetch is read)."""
    want, _, seconds = os.environ.get(STALL_ENV, "").partition(":")
    if want == name:
        time.sleep(float(seconds or 0))
