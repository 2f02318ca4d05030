"""Fixtures of the session tests (helpers live in sessionkit.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sessionkit import Factory
from sshd import SshdContainer, sshd_available

#: A private container for these tests, apart from the session-wide index 0 that other
#: suites (run concurrently on this machine) may hold.
SESSION_TESTS_SSHD_INDEX = 12


@pytest.fixture
def factory() -> Iterator[Factory]:
    made = Factory()
    yield made
    for conduit in made.opened:  # a test that held a gate must not leave a thread blocked
        conduit.gate.set()


@pytest.fixture
def state(tmp_path: Path) -> Path:
    return tmp_path / "state"


@pytest.fixture(scope="session")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshdContainer]:
    """A started OpenSSH sshd in namespaces (tests/sshd.py), shared by these tests."""
    import os

    ok, reason = sshd_available()
    if not ok:
        if os.environ.get("CI"):
            pytest.fail(f"sshd container unavailable in CI: {reason}", pytrace=False)
        pytest.skip(f"sshd container unavailable: {reason}")
    container = SshdContainer(tmp_path_factory.mktemp("session-sshd"),
                              index=SESSION_TESTS_SSHD_INDEX)
    container.start()
    try:
        yield container
    finally:
        container.stop()
