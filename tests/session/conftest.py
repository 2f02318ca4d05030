"""Fixtures of the session tests (helpers live in sessionkit.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sessionkit import Factory
from sshd import SshdContainer, sshd_available

#: Indexes for a private container of these tests, tried in order: none of them is named
#: by another test (0 is the session-wide one; 1-9 and 12-14 belong to other modules), and
#: a suite running concurrently on this machine may hold any (containers lock their index).
SESSION_TESTS_SSHD_INDEXES = (15, 11, 10)


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
    container = None
    for index in SESSION_TESTS_SSHD_INDEXES:
        candidate = SshdContainer(tmp_path_factory.mktemp(f"session-sshd{index}-"), index=index)
        try:
            candidate.start()
        except RuntimeError as exc:
            if "in use" not in str(exc):
                raise
            continue
        container = candidate
        break
    if container is None:
        pytest.fail(f"every sshd index of {SESSION_TESTS_SSHD_INDEXES} is in use", pytrace=False)
    try:
        yield container
    finally:
        container.stop()
