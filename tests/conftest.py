"""Shared pytest fixtures."""

from __future__ import annotations

# ============================================================================================
# sshd fixtures: a real OpenSSH sshd in Linux namespaces (tests/sshd.py).
# Self-contained block: its imports live here so the rest of this file can change freely.
# ============================================================================================
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# tests/ is not a package; make `import sshd` work however pytest was started.
_TESTS_DIR = str(Path(__file__).resolve().parent)
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)

from sshd import MAX_INDEX, SshdContainer, sshd_available  # noqa: E402

#: Index of the session-wide container (env FILESYNC_TEST_SSHD_INDEX, so that concurrent
#: suites need not queue for index 0); sshd_factory hands out the others.
SESSION_SSHD_INDEX = int(os.environ.get("FILESYNC_TEST_SSHD_INDEX", "0"))
#: How long a fixture waits for an index another live container (another suite) holds.
_INDEX_WAIT = 1200.0


def _start(container: SshdContainer) -> None:
    """Start ``container``, waiting while another process holds its index."""
    deadline = time.monotonic() + _INDEX_WAIT
    while True:
        try:
            container.start()
            return
        except RuntimeError as exc:
            if "is in use by another live container" not in str(exc):
                raise
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _require_sshd() -> None:
    """Skip when namespaces/sshd are unavailable -- but fail under CI, where a skip is a hole."""
    ok, reason = sshd_available()
    if ok:
        return
    if os.environ.get("CI"):
        pytest.fail(f"sshd container unavailable in CI: {reason}", pytrace=False)
    pytest.skip(f"sshd container unavailable: {reason}")


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshdContainer]:
    """One started container (index 0) shared by the whole session; stopped at the end.

    Shared state: a test that changes it (hide, link_down, files in home) must undo that,
    or use ``sshd_factory`` for a private container.
    """
    _require_sshd()
    container = SshdContainer(tmp_path_factory.mktemp("sshd"), index=SESSION_SSHD_INDEX)
    _start(container)
    try:
        yield container
    finally:
        container.stop()


@pytest.fixture
def sshd_factory(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[[int], SshdContainer]]:
    """``make(index)`` starts a private container (index 1..15); all are stopped at teardown."""
    _require_sshd()
    started: list[SshdContainer] = []

    def make(index: int) -> SshdContainer:
        if not 1 <= index <= MAX_INDEX:
            raise ValueError(f"sshd_factory index must be 1..{MAX_INDEX} (0 is the session's)")
        container = SshdContainer(tmp_path_factory.mktemp(f"sshd{index}-"), index=index)
        _start(container)
        started.append(container)
        return container

    try:
        yield make
    finally:
        errors: list[BaseException] = []
        for container in reversed(started):
            try:
                container.stop()
            except Exception as exc:  # stop the others anyway, then report
                errors.append(exc)
        if errors:
            raise errors[0]


# ============================================================================================
# end of sshd fixtures
# ============================================================================================
