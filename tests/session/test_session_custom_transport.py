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


def test_a_via_command_prefix_is_a_transport_too(tmp_path: Path) -> None:
    home, box = tmp_path / "home", tmp_path / "box"
    write(home / "d" / "f.md", "f\n")
    # ``env`` runs its arguments as they are, like ``docker exec -i NAME`` does.
    with Session(str(box), via="env", state_dir=tmp_path / "state") as s:
        assert s.push(Mapping(home / "d", "d")).uploaded == 1
    assert snapshot(box) == {"d/f.md": b"f\n"}
    # The pair's state is keyed like the CLI's --via (identity "via:env").
    assert "via:env" in "".join(p.read_text() for p in (tmp_path / "state").rglob("pair.json"))


def test_remote_strings_name_the_transport() -> None:
    from filesync.session.aio import remote_target

    cases = {
        "devbox": ("ssh", "devbox", None, None, "."),
        "ci@build.example.com": ("ssh", "build.example.com", "ci", None, "."),
        "devbox:work": ("ssh", "devbox", None, None, "work"),
        "ssh://ci@build:2222/srv": ("ssh", "build", "ci", 2222, "/srv"),
        "[::1]": ("ssh", "::1", None, None, "."),
        "/srv/box": ("local", "", None, None, "/srv/box"),
        "file:///srv/box": ("local", "", None, None, "/srv/box"),
    }
    for text, (kind, host, user, port, path) in cases.items():
        t = remote_target(text)
        assert (t.kind, t.host, t.user, t.port, t.path) == (kind, host, user, port, path), text
    assert remote_target("./box").kind == remote_target("~/box").kind == "local"
    assert remote_target(Path("relative")).kind == "local"  # a PathLike is always a path
