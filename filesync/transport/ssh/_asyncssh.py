"""asyncssh for the SSH client modules, imported without the liboqs lookup.

Guarantees: ``conduit``, ``config``, ``hostkeys`` and the demo's server
(``filesync.cli.demo_server``) take asyncssh from here only, so whichever of them is
imported first, asyncssh is imported once with the lookup
skipped and ``ctypes.util.find_library`` put back. ``reason()`` renders an asyncssh
or OS error as one line, the form every ``TransportError`` and ``ConnectionLost``
of these modules embeds. asyncssh is an extra (``filesync[asyncssh]``): without it,
importing this module raises ``UsageError`` naming the pip command; the default OpenSSH
path never imports it.
"""

from __future__ import annotations

import ctypes.util

from filesync.errors import UsageError

# asyncssh.crypto.pq looks for liboqs at import with ctypes.util.find_library("oqs")
# and ("liboqs"); on Linux each call runs `ldconfig -p` (and may try gcc and ld), a
# subprocess in every CLI start that imports asyncssh. liboqs only adds the sntrup761
# key exchange, which filesync does not want (it prefers curve25519; ML-KEM still comes
# from `cryptography`), so the lookup is answered "not found" for those two names during
# the import, and the real function is put back right after. Where liboqs is installed,
# sntrup761 is merely unavailable; nothing else changes (if asyncssh was imported
# before, this is a no-op).
_real_find_library = ctypes.util.find_library


def _find_library_without_oqs(name: str) -> str | None:
    return None if name in ("oqs", "liboqs") else _real_find_library(name)


#: What a missing extra says (``pip install filesync`` leaves asyncssh, and with it
#: ``cryptography``, out: a framework's pinned ``cryptography`` is never replaced).
MISSING = ("asyncssh is not installed, and --ssh-client asyncssh and the demo need it: "
           "pip install 'filesync[asyncssh]' (the default OpenSSH client needs nothing more)")

ctypes.util.find_library = _find_library_without_oqs
try:
    import asyncssh
except ImportError as exc:
    raise UsageError(MISSING) from exc
finally:
    ctypes.util.find_library = _real_find_library

__all__ = ["asyncssh", "reason"]


def reason(exc: BaseException) -> str:
    """``exc`` as one line without a trailing period (asyncssh's reason, or strerror)."""
    if isinstance(exc, asyncssh.DisconnectError):
        text = exc.reason or type(exc).__name__
    elif isinstance(exc, OSError) and exc.strerror:
        text = exc.strerror
    else:
        text = str(exc) or type(exc).__name__
    return " ".join(text.split()).rstrip(".")
