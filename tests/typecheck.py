"""Type-checking documented code as a user would: against filesync laid out as its wheel
installs it (typed only through ``py.typed``), with ``mypy --strict`` and no project
config."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import filesync

ROOT = Path(__file__).resolve().parents[1]


def shipped(target: Path) -> Path:
    """The package as the wheel lays it out: filesync's modules and package data, and the
    backends folder installed as filesync.backends."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extra = data["tool"]["setuptools"]["package-data"]["filesync"]
    src = Path(filesync.__file__).resolve().parent
    for base, dest in ((src, target / "filesync"),
                       (ROOT / "backends", target / "filesync" / "backends")):
        for path in base.rglob("*"):
            rel = path.relative_to(base)
            if path.is_file() and (path.suffix == ".py" or rel.as_posix() in extra):
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, dest / rel)
    return target


def mypy_strict(code: str, tmp_path: Path, name: str = "user.py") -> None:
    """Assert that ``code``, as a user's module, passes ``mypy --strict``."""
    user = tmp_path / "user" / name
    user.parent.mkdir()
    user.write_text(code, encoding="utf-8")
    site = shipped(tmp_path / "site")
    assert (site / "filesync" / "py.typed").is_file()
    # On PYTHONPATH, mypy treats filesync as an installed package: typed only through
    # py.typed, exactly as after `pip install`.
    env = {**os.environ, "PYTHONPATH": str(site)}
    env.pop("MYPYPATH", None)
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--cache-dir",
         str(tmp_path / "cache"), "--config-file", os.devnull, str(user)],
        capture_output=True, text=True, cwd=user.parent, env=env, timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Success" in out.stdout
