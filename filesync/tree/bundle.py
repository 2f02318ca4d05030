"""The remote's copy of this package: one compressed bundle and the loader that runs it.

``payload`` is a Python script, zlib-compressed: a small import hook holding the source of
every module of ``filesync.tree``, installed ahead of anything the remote has installed
(an unrelated ``filesync`` there is never imported), then ``filesync.tree.server.main``.
``bootstrap_command`` is the shell command that feeds it to ``python3 -I -S -c`` from
stdin, or says ``FILESYNC-NO-PYTHON`` where the remote has no python3 (and
``FILESYNC-OLD-PYTHON 3.x`` where it is older than ``MIN_PYTHON``). ``-I`` keeps the
remote's working directory (its home: a ``json.py`` there would shadow the standard
library's) and its ``PYTHON*`` variables out of the helper, ``-S`` its site-packages.
The host imports the very same modules from its installed package, so both sides run one
body of code.
"""

from __future__ import annotations

import shlex
import zlib
from functools import cache
from importlib import resources

#: What a remote without python3 answers instead of the helper's hello.
NO_PYTHON = b"FILESYNC-NO-PYTHON"
#: What a remote whose python3 is older than ``MIN_PYTHON`` answers, then its version.
OLD_PYTHON = b"FILESYNC-OLD-PYTHON"
#: The oldest python3 the helper runs on (its code uses ``X | Y`` in ``isinstance``).
MIN_PYTHON = (3, 10)

_LOADER = '''
import importlib.util, sys
class _Bundle:
    """Imports filesync.tree.* from the sources below, never from the remote's disk."""
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name in _PACKAGES or name in _SOURCES:
            return importlib.util.spec_from_loader(name, cls, is_package=name in _PACKAGES)
        return None
    @staticmethod
    def create_module(spec):
        return None
    @staticmethod
    def exec_module(module):
        name = module.__name__
        code = compile(_SOURCES.get(name, ""), "<filesync>/" + name.replace(".", "/") + ".py",
                       "exec")
        exec(code, module.__dict__)
for _name in [n for n in sys.modules if n == "filesync" or n.startswith("filesync.")]:
    del sys.modules[_name]
sys.meta_path.insert(0, _Bundle)
from filesync.tree.server import main
main()
'''


@cache
def sources() -> dict[str, str]:
    """Module name -> source of every module of ``filesync.tree`` (the package included)."""
    out: dict[str, str] = {}
    for item in sorted(resources.files("filesync.tree").iterdir(), key=lambda i: i.name):
        if item.name.endswith(".py"):
            stem = item.name[:-3]
            name = "filesync.tree" if stem == "__init__" else f"filesync.tree.{stem}"
            out[name] = item.read_text(encoding="utf-8")
    return out


@cache
def payload() -> bytes:
    """The bundle as it is sent over stdin: the loader with every source, compressed."""
    script = (f"_PACKAGES = {{'filesync', 'filesync.tree'}}\n_SOURCES = {sources()!r}\n"
              + _LOADER)
    return zlib.compress(script.encode("utf-8"), 9)


def bootstrap_command() -> str:
    """A shell command that runs the bundle fed on stdin, or says python3 is missing, or
    names its version when it is older than ``MIN_PYTHON`` (the check is written for any
    python3, so an old one answers instead of failing on the bundle's syntax)."""
    n = len(payload())
    code = (
        "import sys,zlib;v=sys.version_info[:2];"
        f"exec(compile(zlib.decompress(sys.stdin.buffer.read({n})),'filesync-helper','exec'))"
        f" if v>={MIN_PYTHON!r} else sys.stdout.write('{OLD_PYTHON.decode()} %d.%d'%v)"
    )
    return (
        "if command -v python3 >/dev/null 2>&1; then exec python3 -I -S -c "
        f"{shlex.quote(code)}; else echo {NO_PYTHON.decode()}; fi"
    )
