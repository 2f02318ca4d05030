"""The POSIX fallback's modules (and ``tarfile``, ``decimal`` with them) are imported only
when a remote falls back to it: a run on the helper, a long watch above all, never holds
them in memory."""

from __future__ import annotations

import subprocess
import sys

FALLBACK = ("filesync.endpoint.posix", "filesync.endpoint.posix_tar",
            "filesync.endpoint.posix_parse", "tarfile", "decimal")


def test_the_posix_fallback_is_imported_only_when_used() -> None:
    code = ("import sys\n"
            "import filesync.cli.main, filesync.cli.watch, filesync.endpoint.connect\n"
            "import filesync.session.aio, filesync.sync.engine\n"
            f"print(sorted(m for m in {FALLBACK!r} if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
