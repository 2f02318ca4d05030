"""The self-sync guard: refuse a pair whose two roots are one tree reached twice.

A remote root that is the local root, contains it or lies inside it (``localhost``, a
shared mount, a bind mount seen under another name) would make a pass read its own
writes. Paths cannot tell (different mount points, symlinks, hosts), so the guard asks
the tree itself: it writes a nonce file with a unique name under the local root and
looks for it on the remote, under every place the local root would appear if the trees
were one:

- ``R/nonce``: the remote root ``R`` is the local root;
- ``R/<last k parts of the local root>/nonce``: ``R`` contains the local root;
- ``<k-th parent of R>/nonce``, lexically and through ``..``: ``R`` lies inside it.

The nonce is removed in every case (``finally``). Where this process cannot write in the
local tree (a read-only mount), the check is skipped: a pull into it fails as any write
does, and a push from it is what the caller meant. Its name has the engine's temp-file
form (``.filesync.1.N.tmp``), so no scan ever syncs it. Its pid part is 1, alive in every
PID namespace: a walk removes a temp file whose writer's pid is dead *in its own
namespace*, and the remote helper walking the very tree being checked (from a container,
another host's mount) would otherwise take a live nonce for a crashed writer's and remove
it before it was looked for. A nonce left by a process killed mid-check is removed by the
next check of that directory once it is an hour old. Where the local root does not exist
yet, its nearest existing parent carries the nonce and only the first two checks apply
(nothing can lie inside a tree that does not exist).
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import re
import secrets
import time
from collections.abc import Callable
from pathlib import Path

from filesync.endpoint.contract import Endpoint
from filesync.errors import FilesyncError, SelfSync

#: The nonce's name up to its random part: the temp-file form with pid 1 (see above).
NONCE_PREFIX = ".filesync.1."
_NONCE_RE = re.compile(r"^\.filesync\.1\.\d+\.tmp$")
NONCE_MAX_AGE = 3600.0


def candidates(local_root: Path, remote_root: str, nonce: str, inside: bool) -> list[str]:
    """The remote paths where ``nonce`` (written in ``local_root``) shows if the trees
    are one; ``inside``: also the parents of ``remote_root``."""
    root = posixpath.normpath(remote_root)
    out = [posixpath.join(root, nonce)]
    parts = local_root.parts[1:]
    for k in range(1, len(parts) + 1):
        out.append(posixpath.join(root, *parts[-k:], nonce))
    if inside:
        parent, ups = root, ""
        while parent != "/":
            parent = posixpath.dirname(parent)
            ups += "../"
            out.append(posixpath.join(parent, nonce))
            out.append(f"{root}/{ups}{nonce}")
    return out


async def refuse_self_sync(
    endpoint: Endpoint, local_root: Path, remote_root: str,
    log: Callable[[str], None] | None = None,
) -> None:
    """Raise ``SelfSync`` if ``remote_root`` (absolute, on ``endpoint``'s side) is
    ``local_root``, contains it or lies inside it; changes nothing either way. The
    remote side is asked through the endpoint's own process (``Endpoint.any_exists``):
    the check starts no remote process of its own."""
    carrier = local_root
    while not carrier.is_dir() and carrier != carrier.parent:
        carrier = carrier.parent
    _remove_old_nonces(carrier)
    nonce = f"{NONCE_PREFIX}{secrets.randbits(62)}.tmp"
    path = carrier / nonce
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            # A tree this process cannot write: a pull into it fails as any write does,
            # and a push from it (a read-only credential mount) is what the caller meant.
            if log is not None:
                log(f"self-sync check skipped: cannot write in {carrier} ({exc.strerror})")
            return
        raise FilesyncError(f"cannot write the self-sync check file in {carrier}: "
                            f"{exc.strerror}; check the local directory") from exc
    try:
        found = await endpoint.any_exists(candidates(carrier, remote_root, nonce,
                                                     carrier == local_root))
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    if found:
        raise SelfSync(
            f"remote root {remote_root} is the local root {local_root}, contains it or lies "
            "inside it (the same tree reached twice); map a different remote directory"
        )


def _remove_old_nonces(carrier: Path) -> None:
    """Remove the nonces of checks killed before their ``finally`` (an hour old: no live
    check waits that long on one short command, and a wrong guess only costs a check)."""
    cutoff = time.time() - NONCE_MAX_AGE
    with contextlib.suppress(OSError), os.scandir(carrier) as entries:
        for entry in entries:
            if entry.name.startswith(NONCE_PREFIX) and _NONCE_RE.match(entry.name):
                with contextlib.suppress(OSError):
                    if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                        os.unlink(entry.path)


