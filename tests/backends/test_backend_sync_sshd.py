"""The framework-backend adoption of docs/library.md, run as written against a real OpenSSH
sshd: the backend keeps its own command path (``ssh``), ``BackendSync`` pushes at setup and
before commands, a symlinked credential goes up under another name and is never written
back, and ``cleanup()`` runs on another thread; the block also passes ``mypy --strict``
against the package as shipped."""

from __future__ import annotations

import re
import shutil
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from synctree import snapshot, write
from typecheck import mypy_strict

ROOT = Path(__file__).resolve().parents[2]


def _block() -> str:
    text = (ROOT / "docs" / "library.md").read_text(encoding="utf-8")
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.S)
              if "class SSHBackend" in b]
    assert len(blocks) == 1
    return blocks[0]


@pytest.fixture
def box(sshd_factory: Callable[[int], Any]) -> Any:
    return sshd_factory(8)


def _in_thread(fn: Callable[[], Any]) -> Any:
    out: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if errors:
        raise errors[0]
    return out[0]


@pytest.mark.sshd
def test_the_documented_backend_adopts_the_sync_helper_over_a_real_sshd(
    box: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ssh_client: str | None,
) -> None:
    monkeypatch.setenv("FILESYNC_STATE_DIR", str(tmp_path / "state"))
    home, vault = tmp_path / "agent", tmp_path / "vault"
    write(home / "skills" / "pdf" / "SKILL.md", "# pdf\n")
    write(home / "skills" / "pdf" / "scripts" / "run.py", "print('pdf')\n")
    write(vault / "gh-2026.json", '{"token": "v2"}\n', 0o600)
    (home / "secrets").mkdir()
    (home / "secrets" / "github-token-v2.json").symlink_to(vault / "gh-2026.json")
    remote = box.home / ".hermes"
    namespace: dict[str, Any] = {"__name__": "doc_backend"}
    exec(compile(_block(), "docs/library.md", "exec"), namespace)
    try:
        backend = _in_thread(lambda: namespace["SSHBackend"](box.alias, home, box.ssh_config))
        assert snapshot(remote) == {"skills/pdf/SKILL.md": b"# pdf\n",
                                    "skills/pdf/scripts/run.py": b"print('pdf')\n",
                                    "gh_token.json": b'{"token": "v2"}\n'}
        assert stat.S_IMODE((remote / "gh_token.json").stat().st_mode) == 0o600
        r = _in_thread(lambda: backend.execute(
            "cat .hermes/gh_token.json && echo improved >> .hermes/skills/pdf/SKILL.md && "
            "mkdir -p .hermes/skills/new && echo '# new' > .hermes/skills/new/SKILL.md && "
            "echo tampered > .hermes/gh_token.json"))
        assert (r.returncode, r.stdout) == (0, '{"token": "v2"}\n'), r.stderr
        _in_thread(backend.cleanup)  # the reaper's thread
        assert snapshot(home / "skills") == {"pdf/SKILL.md": b"# pdf\nimproved\n",
                                             "pdf/scripts/run.py": b"print('pdf')\n",
                                             "new/SKILL.md": b"# new\n"}
        assert (home / "secrets" / "github-token-v2.json").is_symlink()
        assert snapshot(vault) == {"gh-2026.json": b'{"token": "v2"}\n'}  # never pulled
    finally:
        shutil.rmtree(remote, ignore_errors=True)


def test_the_documented_backend_passes_mypy_strict(tmp_path: Path) -> None:
    mypy_strict(_block(), tmp_path, "backend.py")
