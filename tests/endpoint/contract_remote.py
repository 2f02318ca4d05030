"""What the endpoint contract suite needs around a started endpoint (``tests/endpoint/
conftest.py`` builds it as the ``remote`` fixture): ``Remote``, process inspection of the
container, polling.

``remote`` is parametrized over ``helper`` (``HelperEndpoint``, python3 on the remote)
and ``posix`` (``PosixEndpoint``, on a remote whose python3 is whited out, as a host
without python3 looks). Each test gets a private container, so the container's home
(a host directory) and its process table belong to that test alone.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from sshd import SshdContainer

from filesync.endpoint.contract import Endpoint
from filesync.endpoint.helper import HelperEndpoint
from filesync.endpoint.posix import PosixEndpoint
from filesync.transport.ssh.conduit import SshConduit

#: sshd_factory index per endpoint kind (other modules own 1-8 and 12-14).
CONTRACT_BOX = {"helper": 9, "posix": 10}
#: Where each test's root is, relative to the remote home.
ROOT_REL = "tree"


@dataclass
class Remote:
    """A started endpoint, its remote root, and that root's host-side path."""

    kind: str
    endpoint: Endpoint
    conduit: SshConduit
    box: SshdContainer
    #: absolute remote root, as ``resolve_root("~/tree")`` gave it
    root: str
    #: the same directory seen from the host (the container's home is a host directory)
    path: Path


async def start_endpoint(kind: str, conduit: SshConduit) -> Endpoint:
    if kind == "helper":
        return await HelperEndpoint.start(conduit)
    return await PosixEndpoint.start(conduit)


def container_processes(box: SshdContainer) -> dict[int, str]:
    """Host pid -> command name of every live process in the container's pid namespace."""
    ns = os.stat(f"/proc/{box.ns_pid}/ns/pid").st_ino
    found: dict[int, str] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry.name}/ns/pid").st_ino != ns:
                continue
            raw = Path(f"/proc/{entry.name}/stat").read_text()
        except OSError:  # ended meanwhile
            continue
        head, _, tail = raw.rpartition(")")
        if tail.split()[0] not in ("Z", "X"):  # a zombie has ended
            found[int(entry.name)] = head.partition("(")[2]
    return found


async def wait_until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after a generous deadline.

    Polls with the event loop running, so the connection's own events (a drop noticed,
    a channel closed) are processed meanwhile.
    """
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting until {what}")
        await asyncio.sleep(0.01)
