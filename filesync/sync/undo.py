"""``filesync undo`` for one pair: resolve the remote root, lock the pair, undo on the host.

What needs the endpoint (resolving the remote root that names the pair) lives here; the
restore itself, and its guarantees, are ``filesync.host.undo``.
"""

from __future__ import annotations

from pathlib import Path

from filesync.host.state import PairState
from filesync.host.undo import undo_in
from filesync.sync.inputs import Options
from filesync.sync.warm import WarmState
from filesync.transport.base import Conduit


async def undo_last(
    conduit: Conduit, local_root: Path, remote_path: str, opts: Options,
    warm: WarmState | None = None,
) -> list[str]:
    """Undo the last pull of this pair; returns the restored paths. ``warm``: the owner
    whose endpoint on the conduit it uses (None: one started here and ended after)."""
    owner = warm if warm is not None else WarmState(keep_state=False)
    try:
        endpoint = await owner.endpoints.endpoint_for(conduit, opts.log)
        root = endpoint.resolve_root(remote_path)
        state = PairState.open(opts.state_dir, str(local_root), conduit.identity, root,
                               lock_timeout=opts.lock_timeout, pool=owner.states,
                               umask=opts.umask)
        try:
            return undo_in(state, local_root)
        finally:
            state.close()
    finally:
        if warm is None:
            await owner.close()
