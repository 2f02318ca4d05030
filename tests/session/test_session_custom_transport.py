"""The custom exec transport of docs/library.md: a Python object that starts a command and
hands over its pipes, as sandbox SDKs do, plugged in with ``conduit=``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sessionkit import doc_blocks
from synctree import snapshot, write

from filesync import Conduit, Mapping, Session


def _sandbox() -> dict[str, Any]:
    blocks = [b for b in doc_blocks() if "class SandboxConduit(Conduit)" in b]
    assert len(blocks) == 1
    namespace: dict[str, Any] = {"__name__": "doc_sandbox"}
    exec(compile(blocks[0], "docs/library.md", "exec"), namespace)
    return namespace


def test_the_documented_sandbox_conduit_syncs_through_a_session(tmp_path: Path) -> None:
    ns = _sandbox()
    opened: list[Conduit] = []

    async def factory() -> Conduit:
        conduit: Conduit = await ns["open_sandbox"]()
        opened.append(conduit)
        return conduit

    home, box = tmp_path / "home", tmp_path / "sandbox"
    write(home / "skills" / "a.md", "a\n")
    write(home / "token", "t\n", 0o600)
    mappings = [Mapping(home / "skills", "skills"), Mapping(home / "token", "token",
                                                            mode="upload-only")]
    with Session(box, conduit=factory, state_dir=tmp_path / "state") as s:
        assert s.push(mappings).uploaded == 2
        write(box / "skills" / "b.md", "b\n")
        assert s.pull(mappings).downloaded == 1
        assert s.status(mappings).plan == []
    assert snapshot(home / "skills") == {"a.md": b"a\n", "b.md": b"b\n"}
    assert snapshot(box) == {"skills/a.md": b"a\n", "skills/b.md": b"b\n", "token": b"t\n"}
    assert len(opened) == 1 and isinstance(opened[0], ns["SandboxConduit"])
    assert opened[0].identity == "sandbox:demo"
