"""What the distribution installs: one top-level import package, ``filesync``, typed.

The repository folder ``backends/`` installs as ``filesync.backends`` (pyproject.toml's
``package-dir``), so the distribution claims no generic top-level name. Checked on a wheel
built from a copy of the sources, installed with ``pip install --target``, and on the
editable install the development venv runs from.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

_CONSUMER = """\
from pathlib import Path

from filesync.backends import LocalTerminal, SSHTerminal


def make(host: str) -> SSHTerminal:
    return SSHTerminal(host, identity="~/.ssh/id_ed25519", state_dir=Path("~/state"))


local: type[LocalTerminal] = LocalTerminal
"""


def _pip(*args: str, cwd: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", *args, "-q"], cwd=cwd,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel built the way ``pip wheel . --no-deps`` builds it, from a copy of the sources."""
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    for name in ("filesync", "backends"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    # The venv's own build backend (the test extras pin it), not an isolated one fetched from
    # an index: the suite runs in a network namespace of its own (scripts/dev).
    _pip("wheel", str(src), "--no-deps", "--no-build-isolation", "-w", str(work / "dist"),
         cwd=work)
    (built,) = (work / "dist").glob("filesync-*.whl")
    return built


@pytest.fixture(scope="module")
def target(wheel: Path) -> Path:
    """The wheel installed into an empty directory with ``pip install --target``."""
    into = wheel.parent.parent / "target"
    _pip("install", "--no-deps", "--no-index", "--target", str(into), str(wheel),
         cwd=wheel.parent)
    return into


def _python(code: str, target: Path) -> subprocess.CompletedProcess[str]:
    """Run ``code`` with only ``target`` and the venv's dependencies importable.

    ``-S`` skips site (and so the editable install's finder); the venv's site-packages
    follows ``target`` on the path only for the dependencies (asyncssh, xxhash).
    """
    deps = [p for p in sys.path if p.endswith("site-packages")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), *deps])}
    return subprocess.run([sys.executable, "-S", "-c", code], cwd=target.parent, env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_wheel_holds_only_filesync_with_the_backends_and_py_typed(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"filesync"}
    assert "filesync/py.typed" in names
    # Every module of both folders is in it, backends/ under filesync/backends/.
    expected = {f"filesync/{p.relative_to(ROOT / 'filesync').as_posix()}"
                for p in (ROOT / "filesync").rglob("*.py")}
    expected |= {f"filesync/backends/{p.relative_to(ROOT / 'backends').as_posix()}"
                 for p in (ROOT / "backends").rglob("*.py")}
    assert {n for n in names if n.endswith(".py")} == expected
    (top_level,) = [n for n in names if n.endswith(".dist-info/top_level.txt")]
    assert zipfile.ZipFile(wheel).read(top_level).decode().split() == ["filesync"]


def test_installed_the_backends_are_filesync_backends_and_backends_is_not_a_name(
    target: Path,
) -> None:
    assert sorted(p.name for p in target.iterdir() if not p.name.endswith(".dist-info")
                  and p.name != "bin") == ["filesync"]
    done = _python("import filesync.backends as b\nprint(b.__file__)\n"
                   "print(b.SSHTerminal.__module__, b.LocalTerminal.__module__)", target)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert Path(lines[0]) == target / "filesync" / "backends" / "__init__.py"
    assert lines[1] == "filesync.backends.ssh filesync.backends.local"
    gone = _python("import backends", target)
    assert gone.returncode == 1
    assert "ModuleNotFoundError: No module named 'backends'" in gone.stderr


def test_installed_backends_pass_mypy_strict_for_a_consumer(target: Path) -> None:
    """py.typed makes the installed package typed: mypy --strict accepts a consumer."""
    work = target.parent / "consumer"
    work.mkdir(exist_ok=True)
    (work / "consumer.py").write_text(_CONSUMER)
    env = {**os.environ, "PYTHONPATH": str(target)}
    done = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--cache-dir",
                           str(work / ".mypy_cache"), "consumer.py"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_editable_install_resolves_filesync_backends_to_the_folder(tmp_path: Path) -> None:
    """``pip install -e .`` (scripts/dev) maps filesync.backends onto backends/."""
    code = "import filesync, filesync.backends as b\nprint(filesync.__file__)\nprint(b.__file__)"
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert [Path(p) for p in done.stdout.splitlines()] == [
        ROOT / "filesync" / "__init__.py", ROOT / "backends" / "__init__.py"]


_TOP_LEVEL_IMPORT = re.compile(r"^\s*(from\s+backends[\s.]|import\s+backends\b)", re.M)


def test_nothing_imports_the_old_top_level_name() -> None:
    files = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "tests").rglob("*.py"),
             *(ROOT / "bench").rglob("*.py"), *(ROOT / "backends").rglob("*.py")]
    offenders = [p.relative_to(ROOT).as_posix() for p in files
                 if _TOP_LEVEL_IMPORT.search(p.read_text(encoding="utf-8"))]
    assert offenders == []


def test_asyncssh_and_cryptography_are_only_in_extras(wheel: Path) -> None:
    """``pip install filesync`` must not replace a framework's pinned ``cryptography``:
    asyncssh (which brings it) is required only by the extras ``asyncssh`` and ``test``."""
    info = next(n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".dist-info/METADATA"))
    requires = [line.split(":", 1)[1].strip()
                for line in zipfile.ZipFile(wheel).read(info).decode().splitlines()
                if line.startswith("Requires-Dist:")]
    plain = [r for r in requires if "extra ==" not in r]
    assert plain and not any(n in r for r in plain for n in ("asyncssh", "cryptography"))
    assert any(r.startswith("asyncssh") and 'extra == "asyncssh"' in r for r in requires)
