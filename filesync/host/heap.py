"""Giving the heap's free memory back to the OS between the passes of a long watch.

A watched pass over a large tree builds transient copies (each side's listing handed
out, the state's tables) of a few MB each and frees them when it ends. glibc keeps freed
heap pages mapped, so a watch that runs for hours would hold its largest pass's peak for
good; ``trim`` asks glibc (``malloc_trim``) to return what is free now. Elsewhere (another
C library, no ctypes) it does nothing: only memory is at stake, never a result. ctypes is
loaded on the first ``trim``, not on import: a one-shot command never trims, and its cold
start does not pay for it.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc (musl has none)
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


def trim() -> bool:
    """Return the heap's free pages to the OS; False where that cannot be asked for."""
    fn = _malloc_trim()
    if fn is None:
        return False
    fn(0)
    return True
