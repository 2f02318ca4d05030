"""The remote keeps the helper compiled: used only when whole, private and this version's.

The helper runs as the remote runs it (``sh -c`` the bootstrap, the bundle on stdin) with
``HOME`` pointing at a test directory. Whether the cache was used is seen from outside: a
cache file crafted with a valid header but a ``server`` module of its own answers with a
marker instead of the hello, so a test knows which code ran.
"""

from __future__ import annotations

import hashlib
import json
import marshal
import os
import stat
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from filesync.tree.bundle import bootstrap_command, digest, payload, sources, sources_blob
from filesync.tree.wire import PROTOCOL

MARKER = b"FROM-THE-CACHE"


def cache_file(home: Path) -> Path:
    return home / ".cache" / "filesync" / f"helper-{digest()}-{sys.implementation.cache_tag}.bin"


def run_helper(home: Path, bundle: bytes | None = None) -> bytes:
    """One helper run (of ``bundle``, None: the real one) that says bye at once; its
    stdout."""
    bye = json.dumps({"op": "bye"}).encode()
    done = subprocess.run(["sh", "-c", bootstrap_command()],
                          input=(bundle or payload()) + struct.pack(">cI", b"J", len(bye)) + bye,
                          env={"HOME": str(home), "PATH": os.environ.get("PATH", "/usr/bin")},
                          cwd=home, capture_output=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stderr == b""
    return done.stdout


def answered_hello(out: bytes) -> bool:
    kind, length = struct.unpack(">cI", out[:5])
    return kind == b"J" and json.loads(out[5:5 + length]).get("hello") == PROTOCOL


def head(body: bytes) -> bytes:
    """A cache file's header for ``body``: format 2, its BLAKE2b."""
    return b"FSH2" + hashlib.blake2b(body, digest_size=32).hexdigest().encode()


def write_cache(path: Path, body: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.write_bytes(head(body) + body)
    path.chmod(0o600)


def marker_body() -> bytes:
    """Every module's code, but a ``server`` whose ``main`` writes MARKER and ends."""
    codes = {n: compile(s, n, "exec") for n, s in sources().items()}
    codes["filesync.tree.server"] = compile(
        f"def main():\n    import os\n    os.write(1, {MARKER!r})\n    os._exit(0)\n",
        "server", "exec")
    return marshal.dumps(codes)


@pytest.fixture(autouse=True)
def same_python() -> None:
    # The crafted caches are this interpreter's code objects: the remote's python3 must be
    # the same version for them to be found under this cache tag.
    probe = subprocess.run(["python3", "-c", "import sys; print(sys.implementation.cache_tag)"],
                           capture_output=True, text=True, check=False)
    if probe.stdout.strip() != sys.implementation.cache_tag:
        pytest.skip("the system python3 is another version than the test's")


def test_the_first_run_writes_a_private_cache_that_the_next_run_loads(tmp_path: Path) -> None:
    assert answered_hello(run_helper(tmp_path))
    path = cache_file(tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    data = path.read_bytes()
    assert data[:68] == head(data[68:])
    assert set(marshal.loads(data[68:])) == set(sources())
    # the next run loads it: a valid cache holding other code is the code that runs
    write_cache(path, marker_body())
    assert run_helper(tmp_path) == MARKER


def test_a_run_from_the_cache_never_decodes_the_sources(tmp_path: Path) -> None:
    """The sources ride behind the loader, always read but decoded only to compile: with
    a whole cache, a bundle whose sources are garbage of the same length still starts."""
    assert answered_hello(run_helper(tmp_path))  # writes the cache
    blob = sources_blob()
    garbage = payload()[: -len(blob)] + b"\0" * len(blob)
    assert answered_hello(run_helper(tmp_path, garbage))
    cache_file(tmp_path).unlink()  # without the cache, the same garbage cannot start
    with pytest.raises(AssertionError):
        run_helper(tmp_path, garbage)


def test_a_corrupted_cache_is_not_used_and_is_rewritten(tmp_path: Path) -> None:
    path = cache_file(tmp_path)
    body = marker_body()
    write_cache(path, body)
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF  # one byte of the code changed, the header not
    path.write_bytes(bytes(data))
    assert answered_hello(run_helper(tmp_path))  # compiled from the sources
    rewritten = path.read_bytes()
    assert rewritten[:68] == head(rewritten[68:])
    assert marshal.loads(rewritten[68:]).keys() == sources().keys()


def test_a_cache_others_could_write_is_not_used(tmp_path: Path) -> None:
    path = cache_file(tmp_path)
    write_cache(path, marker_body())
    path.chmod(0o620)
    assert answered_hello(run_helper(tmp_path))
    write_cache(path, marker_body())
    path.parent.chmod(0o770)
    assert answered_hello(run_helper(tmp_path))


def test_a_cache_of_other_modules_is_not_used(tmp_path: Path) -> None:
    path = cache_file(tmp_path)
    write_cache(path, marshal.dumps({"filesync.tree.server": compile("", "x", "exec")}))
    assert answered_hello(run_helper(tmp_path))


def test_an_unwritable_cache_dir_falls_back_to_the_sources(tmp_path: Path) -> None:
    # ~/.cache is a file: no directory can be made there, not even by root
    (tmp_path / ".cache").write_text("not a directory")
    for _ in range(2):
        assert answered_hello(run_helper(tmp_path))
    assert (tmp_path / ".cache").read_text() == "not a directory"
    assert not list(tmp_path.glob("**/*.tmp"))


def test_the_digest_names_the_sources(tmp_path: Path) -> None:
    """Another body of code gets another cache file, so a stale one is never loaded."""
    assert len(digest()) == 32 and digest() in cache_file(tmp_path).name
    assert digest() == hashlib.sha256(repr(sorted(sources().items())).encode()).hexdigest()[:32]
