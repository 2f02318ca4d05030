"""The SSH terminal's tests run once per SSH client (``FILESYNC_SSH_CLIENT``): the OpenSSH
client, the default wherever ``ssh`` exists, and the in-process asyncssh client."""

from __future__ import annotations

from typing import Any

import pytest

CLIENTS = ("openssh", "asyncssh")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if (metafunc.definition.get_closest_marker("sshd") is not None
            and "ssh_client" in metafunc.fixturenames):
        metafunc.parametrize("ssh_client", CLIENTS, indirect=True)


@pytest.fixture(autouse=True)
def ssh_client(request: Any, monkeypatch: pytest.MonkeyPatch) -> str | None:
    """The client this test's terminals use (None: not an SSH test)."""
    client: str | None = getattr(request, "param", None)
    if client is not None:
        monkeypatch.setenv("FILESYNC_SSH_CLIENT", client)
    return client
