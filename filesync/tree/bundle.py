"""The remote's copy of this package: one compressed bundle and the loader that runs it.

``payload`` is a Python script, zlib-compressed: a small import hook for every module of
``filesync.tree``, installed ahead of anything the remote has installed (an unrelated
``filesync`` there is never imported), then ``filesync.tree.server.main``. The modules'
sources follow the script on stdin as a blob of their own (``sources_blob``: JSON,
compressed), which the script always reads but decodes only when it has to compile: the
script itself stays a few KB, so the remote never parses ~100 KB of source text just to
start from its cache.
``bootstrap_command`` is the shell command that feeds it to ``python3 -I -S -c`` from
stdin, or says ``FILESYNC-NO-PYTHON`` where the remote has no python3 (and
``FILESYNC-OLD-PYTHON 3.x`` where it is older than ``MIN_PYTHON``). ``-I`` keeps the
remote's working directory (its home: a ``json.py`` there would shadow the standard
library's) and its ``PYTHON*`` variables out of the helper, ``-S`` its site-packages.
The host imports the very same modules from its installed package, so both sides run one
body of code.

The remote keeps that code compiled, as an agent installed once per version: the first run
writes every module's code object to ``~/.cache/filesync/helper-<digest>-<cache tag>.bin``
(``digest``: of the sources; the cache tag names the remote's Python), and later runs load
it instead of compiling ~80 KB of source. The file is used only if it is whole (its own
BLAKE2b in its header), owned by the user and writable by nobody else (it and its
directory), and holds exactly this bundle's modules; anything else -- missing, corrupt, an
unwritable home -- compiles from the sources sent on stdin, which always come.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import zlib
from functools import cache

import filesync.tree as package

#: What a remote without python3 answers instead of the helper's hello.
NO_PYTHON = b"FILESYNC-NO-PYTHON"
#: What a remote whose python3 is older than ``MIN_PYTHON`` answers, then its version.
OLD_PYTHON = b"FILESYNC-OLD-PYTHON"
#: The oldest python3 the helper runs on (its code uses ``X | Y`` in ``isinstance``).
MIN_PYTHON = (3, 10)

_LOADER = '''
import sys
try:  # the interpreter's own ModuleSpec: ``importlib.util`` would import half a dozen modules
    from _frozen_importlib import ModuleSpec
except ImportError:
    from importlib.machinery import ModuleSpec
_BLOB = sys.stdin.buffer.read(_BLOB_SIZE)
#: A cache file's first bytes: its format (2: BLAKE2b; 1 was SHA-256), then its checksum.
_MAGIC = b"FSH2"
_DECODED = {}
def _source(name):
    """A module's source, from the blob (decoded once, on the first compile of one of
    its modules: the bare ``filesync`` package has none)."""
    if name not in _MODULES:
        return ""
    if not _DECODED:
        import json, zlib
        _DECODED.update(json.loads(zlib.decompress(_BLOB)))
    return _DECODED.get(name, "")
def _cache_path():
    import os
    home = os.path.expanduser("~")
    if not home.startswith("/"):
        return None
    tag = sys.implementation.cache_tag or "nocache"
    return os.path.join(home, ".cache", "filesync", "helper-" + _DIGEST + "-" + tag + ".bin")
def _check(body):
    """The cache file's checksum of ``body``: BLAKE2b from ``_blake2``, which ``hashlib``
    would wrap after loading OpenSSL and reading its configuration."""
    try:
        from _blake2 import blake2b
    except ImportError:
        from hashlib import blake2b
    return blake2b(body, digest_size=32).hexdigest().encode()
def _private(st):
    import os
    return st.st_uid == os.geteuid() and not st.st_mode & 0o022
def _cached():
    """Module name -> code, from this user's cache if it is whole, private and this
    version's (checked by its own digest), else {}: the sources are compiled instead."""
    import marshal, os
    path = _cache_path()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except (OSError, TypeError):
        return {}
    try:
        with os.fdopen(fd, "rb") as f:
            if not (_private(os.fstat(f.fileno())) and _private(os.stat(os.path.dirname(path)))):
                return {}
            data = f.read()
        head, body = data[:68], data[68:]
        if head != _MAGIC + _check(body):
            return {}
        codes = marshal.loads(body)
        if not isinstance(codes, dict) or set(codes) != _MODULES:
            return {}
        return codes
    except Exception:
        return {}
def _store():
    """Write every module's code for the next run: temp file, then rename, so a reader
    sees a whole file or none. Best effort: an unwritable home keeps compiling."""
    import marshal, os
    path = _cache_path()
    if path is None:
        return
    tmp = path + ".%d.tmp" % os.getpid()
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        body = marshal.dumps({n: _CODES.get(n) or _compile(n) for n in _MODULES})
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(_MAGIC + _check(body) + body)
        os.replace(tmp, path)
        _prune(os.path.dirname(path))
    except Exception:
        try:
            os.unlink(tmp)
        except OSError:
            pass
def _prune(folder):
    """Keep the newest few helpers (other clients' versions), drop older ones."""
    import os
    names = [n for n in os.listdir(folder) if n.startswith("helper-") and n.endswith(".bin")]
    names.sort(key=lambda n: os.stat(os.path.join(folder, n)).st_mtime, reverse=True)
    for name in names[8:]:
        try:
            os.unlink(os.path.join(folder, name))
        except OSError:
            pass
def _compile(name):
    return compile(_source(name), "<filesync>/" + name.replace(".", "/") + ".py", "exec")
class _Bundle:
    """Imports filesync.tree.* from the code below (or its cached compiled form), never
    from the remote's disk."""
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name in _PACKAGES or name in _MODULES:
            return ModuleSpec(name, cls, is_package=name in _PACKAGES)
        return None
    @staticmethod
    def create_module(spec):
        return None
    @staticmethod
    def exec_module(module):
        name = module.__name__
        code = _CODES.get(name)
        if code is None:
            code = _CODES[name] = _compile(name)
        exec(code, module.__dict__)
for _name in [n for n in sys.modules if n == "filesync" or n.startswith("filesync.")]:
    del sys.modules[_name]
_CODES = _cached()
_HIT = bool(_CODES)
sys.meta_path.insert(0, _Bundle)
from filesync.tree.server import main
if not _HIT:
    _store()
main()
'''


@cache
def sources() -> dict[str, str]:
    """Module name -> source of every module of ``filesync.tree`` (the package included)."""
    out: dict[str, str] = {}
    folders = [f for f in package.__path__ if os.path.isdir(f)]
    for folder in folders:
        for name in sorted(os.listdir(folder)):
            if name.endswith(".py"):
                with open(os.path.join(folder, name), encoding="utf-8") as f:
                    out[_module_name(name)] = f.read()
    if not folders:
        # Not on a file system (a zip import): the resource machinery reads it. Only
        # then: its import costs the client more than reading the files does.
        from importlib import resources

        for item in sorted(resources.files("filesync.tree").iterdir(), key=lambda i: i.name):
            if item.name.endswith(".py"):
                out[_module_name(item.name)] = item.read_text(encoding="utf-8")
    return out


def _module_name(file_name: str) -> str:
    stem = file_name[:-3]
    return "filesync.tree" if stem == "__init__" else f"filesync.tree.{stem}"


@cache
def digest() -> str:
    """What names this body of code in the remote's cache: every source, hashed."""
    return hashlib.sha256(repr(sorted(sources().items())).encode("utf-8")).hexdigest()[:32]


#: How hard the sources are compressed: they are compressed on the client's path to the
#: first byte, once per run, and level 1 costs a few KB more than 9 for a fraction of its
#: time (figures: docs/benchmarks.md).
_BLOB_LEVEL = 1


@cache
def sources_blob() -> bytes:
    """Every module's source as the loader reads it after itself: JSON, compressed."""
    return zlib.compress(json.dumps(sources()).encode("utf-8"), _BLOB_LEVEL)


@cache
def payload() -> bytes:
    """The bundle as it is sent over stdin: the loader, compressed, then ``sources_blob``."""
    script = (f"_PACKAGES = {{'filesync', 'filesync.tree'}}\n"
              f"_MODULES = set({sorted(sources())!r})\n_DIGEST = {digest()!r}\n"
              f"_BLOB_SIZE = {len(sources_blob())}\n" + _LOADER)
    return zlib.compress(script.encode("utf-8"), 9) + sources_blob()


def bootstrap_command() -> str:
    """A shell command that runs the bundle fed on stdin, or says python3 is missing, or
    names its version when it is older than ``MIN_PYTHON`` (the check is written for any
    python3, so an old one answers instead of failing on the bundle's syntax)."""
    n = len(payload()) - len(sources_blob())
    code = (
        "import sys,zlib;v=sys.version_info[:2];"
        f"exec(compile(zlib.decompress(sys.stdin.buffer.read({n})),'filesync-helper','exec'))"
        f" if v>={MIN_PYTHON!r} else sys.stdout.write('{OLD_PYTHON.decode()} %d.%d'%v)"
    )
    return (
        "if command -v python3 >/dev/null 2>&1; then exec python3 -I -S -c "
        f"{shlex.quote(code)}; else echo {NO_PYTHON.decode()}; fi"
    )
