"""Shared pytest fixtures."""

from __future__ import annotations

# ============================================================================================
# sshd fixtures: a real OpenSSH sshd in Linux namespaces (tests/sshd.py).
# Self-contained block: its imports live here so the rest of this file can change freely.
# ============================================================================================
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# tests/ is not a package; make `import sshd` work however pytest was started.
_TESTS_DIR = str(Path(__file__).resolve().parent)
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)

from sshd import MAX_INDEX, IndexInUse, SshdContainer, sshd_available  # noqa: E402

#: Index of the session-wide container; sshd_factory hands out the others.
SESSION_SSHD_INDEX = 0


def _require_sshd() -> None:
    """Skip when namespaces/sshd are unavailable -- but fail under CI, where a skip is a hole."""
    ok, reason = sshd_available()
    if ok:
        return
    if os.environ.get("CI"):
        pytest.fail(f"sshd container unavailable in CI: {reason}", pytrace=False)
    pytest.skip(f"sshd container unavailable: {reason}")


def _start_free(factory: pytest.TempPathFactory, name: str, index: int) -> SshdContainer:
    """A started container at ``index``, or at the next index no live container holds.

    Indexes are machine-wide; another suite running at the same time (a second checkout)
    may hold the one asked for. Tests use the container's own address and alias, never the
    index, so which one they get does not matter.
    """
    for offset in range(MAX_INDEX + 1):
        candidate = (index + offset) % (MAX_INDEX + 1)
        container = SshdContainer(factory.mktemp(name), index=candidate)
        try:
            container.start()
        except IndexInUse:
            continue
        return container
    raise RuntimeError(f"every sshd container index 0..{MAX_INDEX} is in use")


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshdContainer]:
    """One started container (index 0) shared by the whole session; stopped at the end.

    Shared state: a test that changes it (hide, link_down, files in home) must undo that,
    or use ``sshd_factory`` for a private container.
    """
    _require_sshd()
    container = _start_free(tmp_path_factory, "sshd", SESSION_SSHD_INDEX)
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
        container = _start_free(tmp_path_factory, f"sshd{index}-", index)
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


# Hypothesis measures the machine's speed by default: an example slower than 200 ms fails
# (the deadline), and so does slow input generation (the too_slow health check). No test
# may depend on how fast the machine is, so neither applies anywhere. A test's own
# ``suppress_health_check`` replaces this list: it must name ``too_slow`` as well.
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile("any-speed", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("any-speed")
