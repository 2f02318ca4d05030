"""Fault injection for the crash-safety tests: kill this process at a named step.

Inert unless ``FILESYNC_TEST_CRASH`` is set (one environment lookup per step). It lives in
``core`` and imports only the standard library, so every layer that marks a step (host
apply and journal, the endpoint's staging) may import it.
"""

from __future__ import annotations

import os
import signal

CRASH_ENV = "FILESYNC_TEST_CRASH"
_crash_counts: dict[str, int] = {}


def crash_point(name: str) -> None:
    """SIGKILL this process the Nth time step ``name`` is reached.

    ``FILESYNC_TEST_CRASH=NAME:N`` kills the process with a real SIGKILL the Nth time
    (1-based) step ``NAME`` is reached. Steps: ``staged`` (a fetched file is staged),
    ``journal-saved``, ``before-op``, ``kept`` (old file kept for undo), ``placed`` (a
    write or delete is done), ``ops-done``, ``manifest-written``. The crash-safety tests
    (tests/reliability/test_reliability_kill.py) use it.
    """
    spec = os.environ.get(CRASH_ENV)
    if not spec:
        return
    want, _, nth = spec.partition(":")
    if want != name:
        return
    _crash_counts[name] = _crash_counts.get(name, 0) + 1
    if str(_crash_counts[name]) == (nth or "1"):
        os.kill(os.getpid(), signal.SIGKILL)
