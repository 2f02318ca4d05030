"""Fixtures of the endpoint tests: ``remote``, a started endpoint of each kind over the
real namespaced sshd (see ``contract_remote``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from contract_remote import CONTRACT_BOX, ROOT_REL, Remote, start_endpoint
from sshd import SshdContainer

from filesync.transport.ssh.conduit import SshTarget, connect


@pytest.fixture(params=["helper", "posix"])
async def remote(
    request: pytest.FixtureRequest,
    sshd_factory: Callable[[int], SshdContainer],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[Remote]:
    kind: str = request.param
    # HOME is empty and there is no agent: the machine's own ~/.ssh never decides.
    home = tmp_path / "userhome"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    box = sshd_factory(CONTRACT_BOX[kind])
    if kind == "posix":
        box.hide_python()
    conduit = await connect(SshTarget(box.alias), ssh_config=box.ssh_config)
    try:
        endpoint = await start_endpoint(kind, conduit)
        try:
            root = endpoint.resolve_root(f"~/{ROOT_REL}")
            yield Remote(kind, endpoint, conduit, box, root, box.home / ROOT_REL)
        finally:
            await endpoint.close()
    finally:
        await conduit.close()
