"""The remote helper starts and answers its first listing without the modules it can spare.

Every cold run waits for the helper's hello and first listing, so what the helper imports
before them is paid on every run. The helper runs here as the remote runs it (``sh -c``
the bootstrap, the bundle on stdin, its cache filled by a first run), with
``-X importtime`` added to its interpreter, which names every module imported after the
interpreter's own start on stderr. On the client's side, the bundle module itself is
imported before ssh's login starts, so what it needs only to build the payload waits.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import zipfile
import zlib
from pathlib import Path
from typing import Any

from filesync.core.exclude import DEFAULT_EXCLUDED_DIRS, ExcludeRule
from filesync.tree.bundle import bootstrap_command, payload, sources
from filesync.tree.bundle import digest as bundle_digest
from filesync.tree.wire import PROTOCOL

REPO = Path(__file__).resolve().parents[2]

#: What the helper's start-up and a listing under the default rule never import: each was
#: on that path once (``typing`` for annotations, ``hashlib`` loading OpenSSL, ``json``
#: and ``re`` for the codec and the path rule, ``importlib.util`` in the loader,
#: ``contextlib`` for ``suppress``, ``threading`` for the watchdog).
SPARED = ("typing", "hashlib", "_hashlib", "json", "re", "importlib.util", "contextlib",
          "threading", "warnings")

INTERPRETER = "python3 -I -S"


def request(obj: dict[str, Any]) -> bytes:
    data = json.dumps(obj).encode()
    return struct.pack(">cI", b"J", len(data)) + data


def frames(out: bytes) -> list[tuple[bytes, dict[str, Any]]]:
    got = []
    while out:
        kind, length = struct.unpack(">cI", out[:5])
        body = out[5:5 + length]
        got.append((kind, json.loads(zlib.decompress(body) if kind == b"Z" else body)))
        out = out[5 + length:]
    return got


def listing_run(home: Path, root: Path, rule: ExcludeRule) -> tuple[list[Any], set[str]]:
    """One helper run that lists ``root`` under ``rule`` and says bye: its replies and the
    modules it imported."""
    command = bootstrap_command()
    assert command.count(INTERPRETER) == 1
    command = command.replace(INTERPRETER, "python3 -X importtime -I -S")
    stdin = (payload() + request({"op": "list", "root": str(root), **rule.wire(),
                                  "delta": True}) + request({"op": "bye"}))
    done = subprocess.run(["sh", "-c", command], input=stdin,
                          env={"HOME": str(home), "PATH": os.environ.get("PATH", "/usr/bin")},
                          cwd=home, capture_output=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    imported = {line.split("|")[-1].strip() for line in done.stderr.decode().splitlines()
                if line.startswith("import time:")}
    return frames(done.stdout), imported


def test_the_helper_lists_without_the_modules_it_spares(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    (root / "src").mkdir(parents=True)
    (root / "src" / "a.txt").write_text("a")
    (root / "node_modules").mkdir()
    rule = ExcludeRule()
    listing_run(tmp_path, root, rule)  # fills the cache: the next runs start from it
    replies, imported = listing_run(tmp_path, root, rule)
    assert [kind for kind, _ in replies] == [b"J", b"Z", b"J"]
    assert replies[0][1]["hello"] == PROTOCOL
    assert [row[0] for row in replies[1][1]["entries"]] == ["src/a.txt"]
    assert replies[1][1]["excluded"] == 1
    assert "filesync.tree.server" in imported  # the helper's own imports are seen
    assert sorted(set(SPARED) & imported) == []


def test_patterns_load_re_when_the_listing_needs_it(tmp_path: Path) -> None:
    # The other side of the rule above: the lazy import is there when patterns are.
    root = tmp_path / "tree"
    root.mkdir()
    (root / "a.log").write_text("a")
    (root / "b.txt").write_text("b")
    rule = ExcludeRule(DEFAULT_EXCLUDED_DIRS, ("*.log",))
    listing_run(tmp_path, root, rule)
    replies, imported = listing_run(tmp_path, root, rule)
    assert [row[0] for row in replies[1][1]["entries"]] == ["b.txt"]
    assert "re" in imported
    assert sorted((set(SPARED) - {"re"}) & imported) == []


def test_the_client_reads_the_bundle_without_importlib_resources() -> None:
    # The sources are files of the installed package: reading them needs no resource
    # machinery (its import costs the client more than the reads do).
    loaded = "print('importlib.resources' in sys.modules)\n"
    said = subprocess.run(
        [sys.executable, "-I", "-S", "-c",
         f"import sys; sys.path.insert(0, {str(REPO)!r})\n"
         "import filesync.endpoint.helper, filesync.tree.bundle\n"
         + loaded + "filesync.tree.bundle.sources()\n" + loaded],
        capture_output=True, text=True, timeout=60, check=False)
    assert said.stdout.split() == ["False", "False"], said.stderr


def test_a_zip_imported_package_gives_the_same_sources(tmp_path: Path) -> None:
    # Where the package is not on a file system, the resource machinery reads it, and
    # the remote gets the same bundle.
    archive = tmp_path / "filesync.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for path in sorted((REPO / "filesync").rglob("*.py")):
            zf.write(path, path.relative_to(REPO).as_posix())
    said = subprocess.run(
        [sys.executable, "-I", "-S", "-c",
         f"import sys, json; sys.path.insert(0, {str(archive)!r})\n"
         "import filesync.tree.bundle as b\n"
         "assert b.__file__.startswith(sys.path[0]), b.__file__\n"
         "print(json.dumps([b.sources(), b.digest(), 'importlib.resources' in sys.modules]))"],
        capture_output=True, text=True, timeout=60, check=False)
    assert said.returncode == 0, said.stderr
    zipped, digest, via_resources = json.loads(said.stdout)
    assert zipped == sources() and digest == bundle_digest() and via_resources
