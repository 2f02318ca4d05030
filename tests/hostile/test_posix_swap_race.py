"""A hostile remote swaps a directory of the root with a symlink to the outside, in a loop,
while pushes go through the POSIX fallback (the real sshd, python3 whited out).

The swapper is ``renameat2(RENAME_EXCHANGE)`` on the container's home, which is a host
directory (``SshdContainer.home``): one atomic exchange of ``sub`` (a directory) and
``link`` (a symlink to ``/root/outside``), as fast as the host can call it. Whatever the
interleaving, nothing may appear in the outside directory, no temp file may be left
anywhere, and every path a push did not do is one it reports, under the swapped names.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from sshd import SshdContainer
from synctree import Pair, write

from filesync.core.exclude import ExcludeRule
from filesync.endpoint.contract import Outcome, SendItem
from filesync.endpoint.posix import PosixEndpoint
from filesync.transport.ssh.conduit import SshTarget, connect
from filesync.tree.wire import SAFETY, Reason

BOX = 15  # sshd_factory index used by this module
RENAME_EXCHANGE = 2
AT_FDCWD = -100
#: Bounds of the swap loop: it ends by itself even if the test body never stops it.
MAX_SWAPS = 2_000_000
MAX_SECONDS = 600.0
PUSHES = 6


def _renameat2() -> Any:
    libc = ctypes.CDLL(None, use_errno=True)
    fn = libc.renameat2
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    return fn


class Swapper(threading.Thread):
    """Exchanges ``a`` and ``b`` until stopped, ``MAX_SWAPS`` times or ``MAX_SECONDS``."""

    def __init__(self, a: Path, b: Path) -> None:
        super().__init__(daemon=True)
        self.a, self.b = bytes(a), bytes(b)
        self.stop = threading.Event()
        self.swaps = 0
        self.errors: list[int] = []

    def __enter__(self) -> Swapper:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        self.join()

    def run(self) -> None:
        exchange = _renameat2()
        deadline = time.monotonic() + MAX_SECONDS
        for _ in range(MAX_SWAPS):
            if self.stop.is_set() or time.monotonic() > deadline:
                return
            if exchange(AT_FDCWD, self.a, AT_FDCWD, self.b, RENAME_EXCHANGE) == 0:
                self.swaps += 1
            else:
                self.errors.append(ctypes.get_errno())
                return


def temp_files(top: Path) -> list[str]:
    """Every filesync temp name under ``top``, without following symlinks."""
    found = []
    for dirpath, dirnames, filenames in os.walk(top):
        found += [os.path.join(dirpath, n) for n in dirnames + filenames if ".filesync." in n]
    return found


@pytest.fixture
def box(sshd_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SshdContainer:
    home = tmp_path / "userhome"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    container: SshdContainer = sshd_factory(BOX)
    container.hide_python()
    return container


@pytest.mark.sshd
def test_a_directory_swapped_with_a_symlink_during_pushes_never_leaks_a_write(
    box: SshdContainer, tmp_path: Path
) -> None:
    local = tmp_path / "host" / "skills"
    racing = [f"sub/f{i}.txt" for i in range(12)] + [f"sub/deep/g{i}.txt" for i in range(12)]
    calm = [f"top{i}.txt" for i in range(4)]
    for rel in racing + calm:
        write(local / rel, f"{rel} v0\n")
    pair = Pair(local, box.home / "race" / "skills", tmp_path / "state")
    spec = f"{box.alias}:race/skills"

    def push() -> tuple[int, Any]:
        return pair.run("push", "-F", str(box.ssh_config), remote=spec)

    code, report = push()
    assert code == 0, (report, pair.stderr)
    outside = box.home / "outside"
    outside.mkdir()
    root = pair.remote
    (root / "link").symlink_to("/root/outside")  # the path inside the container
    swapper = Swapper(root / "sub", root / "link")
    swapper.start()
    reports = []
    try:
        for n in range(1, PUSHES + 1):
            for rel in racing + calm:
                write(local / rel, f"{rel} v{n}\n")
            reports.append(push())
    finally:
        swapper.stop.set()
        swapper.join()
    assert swapper.errors == [] and swapper.swaps > 0
    assert sorted(os.listdir(outside)) == []  # nothing written, created or moved outside
    assert temp_files(box.home) == []
    for code, report in reports:
        assert code in (0, 1), report
        # Every path not done is one of the swapped tree's, and says so.
        not_done = {s["path"].split("/", 1)[0] for s in report["skipped"]}
        assert not_done <= {"sub", "link"}, report
        if code == 1:
            assert re.search(r" of (sub|link)/", report["error"]), report
    # The calm files went through every push.
    for rel in calm:
        assert (root / rel).read_text() == f"{rel} v{PUSHES}\n"


def _send_rounds(box: SshdContainer, root: str, rounds: int) -> list[list[Outcome]]:
    """``rounds`` uploads of new files under ``sub/`` (and two at the top) in one session."""

    async def go() -> list[list[Outcome]]:
        conduit = await connect(SshTarget(box.alias), ssh_config=box.ssh_config)
        try:
            session = await PosixEndpoint.start(conduit)
            out = []
            for n in range(rounds):
                rels = ([f"sub/n{n}-{i}.txt" for i in range(16)]
                        + [f"sub/deep/n{n}-{i}.txt" for i in range(16)]
                        + [f"new{n}/x.txt", f"top{n}.txt"])
                items = [SendItem(rel, 0o644, 10**18, None, lambda rel=rel: iter([rel.encode()]))
                         for rel in rels]
                out.append(await session.send(root, items))
            await session.close()
            return out
        finally:
            await conduit.close()

    return asyncio.run(go())


@pytest.mark.sshd
def test_uploads_under_a_swap_loop_land_inside_the_root_or_are_refused(
    box: SshdContainer,
) -> None:
    """The endpoint itself, every upload straight into the swapping tree (no listing first
    that would already skip the swapped directory)."""
    root = box.home / "race2"
    write(root / "sub" / "deep" / "keep.txt", "keep\n")
    outside = box.home / "outside"
    outside.mkdir()
    (root / "link").symlink_to("/root/outside")
    with Swapper(root / "sub", root / "link") as swapper:
        rounds = _send_rounds(box, "/root/race2", 8)
    assert swapper.errors == [] and swapper.swaps > 0
    assert sorted(os.listdir(outside)) == []
    assert temp_files(box.home) == []
    refused = 0
    for outcomes in rounds:
        for o in outcomes:
            if o.path.startswith(("new", "top")):
                assert o.status == "ok", o
            elif o.status != "ok":
                assert o.status == "error" and o.code in SAFETY, o
                refused += 1
    inside = [p for p in root.rglob("n*.txt")]
    assert len(inside) + refused == 8 * 32  # each racing file: inside the root, or refused


@pytest.mark.sshd
def test_deletions_under_a_swap_loop_never_remove_a_file_outside(box: SshdContainer) -> None:
    """Decoys outside the root match the listed files exactly (name, size, mtime): a
    deletion that followed the swapped-in symlink would pass its check and remove them."""
    root, outside = box.home / "race3", box.home / "outside"
    names = [f"d{i}.txt" for i in range(40)]
    for name in names:
        for top in (root / "sub", outside):
            write(top / name, f"{name}\n")
            os.utime(top / name, ns=(10**18, 10**18))
    # Not deleted: ``sub`` never becomes empty, so it is never pruned under the swap loop.
    write(root / "sub" / "keep.txt", "keep\n")
    (root / "link").symlink_to("/root/outside")

    async def go() -> list[Outcome]:
        conduit = await connect(SshTarget(box.alias), ssh_config=box.ssh_config)
        try:
            session = await PosixEndpoint.start(conduit)
            listing = await session.list_tree("/root/race3", ExcludeRule.build())
            files = [listing.entries[f"sub/{name}"] for name in names]
            with Swapper(root / "sub", root / "link") as swapper:
                outcomes = await session.delete("/root/race3", files)
            assert swapper.errors == [] and swapper.swaps > 0
            await session.close()
            return outcomes
        finally:
            await conduit.close()

    outcomes = asyncio.run(go())
    assert sorted(os.listdir(outside)) == sorted(names)
    for o in outcomes:
        assert o.status == "ok" or o.code in SAFETY or o.code is Reason.CHANGED, o
