"""``filesync undo`` for one pair: resolve the remote root, lock the pair, undo on the host.

What needs the endpoint (resolving the remote root that names the pair) lives here; the
restore itself, and its guarantees, are ``filesync.host.undo``.
"""

from __future__ import annotations

from pathlib import Path

from filesync.endpoint.connect import session_for
from filesync.host.state import PairState
from filesync.host.undo import undo_in
from filesync.sync.inputs import Options
from filesync.transport.base import Conduit


async def undo_last(
    conduit: Conduit, local_root: Path, remote_path: str, opts: Options
) -> list[str]:
    """Undo the last pull of this pair; returns the restored paths."""
    session = await session_for(conduit, opts.log)
    root = session.resolve_root(remote_path)
    state = PairState.open(
        opts.state_dir, str(local_root), conduit.identity, root, lock_timeout=opts.lock_timeout
    )
    try:
        return undo_in(state, local_root)
    finally:
        state.close()
