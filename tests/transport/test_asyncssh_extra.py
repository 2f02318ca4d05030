"""asyncssh is an extra (``filesync[asyncssh]``): without it, ``--ssh-client asyncssh`` and
the demo fail in one line naming the pip command (exit 2), and the default OpenSSH path
still syncs over the real sshd. Run in child interpreters where asyncssh (and
cryptography) cannot be imported, as after ``pip install filesync``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from sshd import SshdContainer
from synctree import write

#: A meta-path finder that makes asyncssh and cryptography unimportable.
BLOCK = """
import sys
class Missing:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("asyncssh", "cryptography"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Missing())
"""

PIP = "pip install 'filesync[asyncssh]'"


def child(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", BLOCK + code], capture_output=True, text=True,
                          timeout=240, check=False, cwd=tmp_path)


@pytest.mark.parametrize("argv", [
    ["push", "--ssh-client", "asyncssh", "LOCAL", "somehost:box"],
    ["demo"],
])
def test_without_asyncssh_its_commands_fail_in_one_line_naming_the_extra(
        tmp_path: Path, argv: list[str]) -> None:
    (tmp_path / "LOCAL").mkdir()
    done = child(f"from filesync.cli.main import main\nsys.exit(main({argv!r}))", tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and PIP in done.stderr, done.stderr
    assert done.stderr.startswith("filesync: error: asyncssh is not installed")


@pytest.mark.sshd
def test_without_asyncssh_the_default_openssh_path_syncs(tmp_path: Path,
                                                        sshd: SshdContainer) -> None:
    write(tmp_path / "skills" / "a.md", "a\n")
    code = f"""
from filesync import Mapping, Session
with Session({sshd.alias!r}, ssh_config={str(sshd.ssh_config)!r},
             state_dir={str(tmp_path / "state")!r}) as s:
    print(s.push(Mapping({str(tmp_path / "skills")!r}, "extra-test/skills")).uploaded)
print(sorted(m for m in sys.modules if m.split(".")[0] in ("asyncssh", "cryptography")))
"""
    try:
        done = child(code, tmp_path)
        assert (done.returncode, done.stderr) == (0, "")
        assert done.stdout.split("\n")[:2] == ["1", "[]"]
        assert (sshd.home / "extra-test" / "skills" / "a.md").read_text() == "a\n"
    finally:
        subprocess.run(["rm", "-rf", str(sshd.home / "extra-test")], check=True)
