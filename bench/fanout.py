"""Fan-out push through the library: one process, one ``run_pass`` per host, ``asyncio.gather``.

The bench uses this only when ``filesync push`` does not take several REMOTEs; it is what
the CLI's fan-out does, minus argument parsing and printing.

Usage: ``python3 fanout.py LOCAL SSH_CONFIG STATE_DIR ALIAS:PATH [ALIAS:PATH ...]``
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from filesync.core.exclude import ExcludeRule
from filesync.core.reconcile import Direction
from filesync.sync.engine import Options, run_pass
from filesync.transport.ssh.conduit import SshTarget, connect


async def one(local: Path, cfg: Path, state: Path, remote: str) -> dict[str, object]:
    alias, _, path = remote.partition(":")
    conduit = await connect(SshTarget(alias), ssh_config=cfg)
    try:
        opts = Options(Direction.PUSH, rule=ExcludeRule.build(root=local), state_dir=state)
        report = await run_pass(conduit, local, path or ".", opts)
        return {"remote": remote, **report.to_json()}
    finally:
        await conduit.close()


async def main(argv: list[str]) -> int:
    local, cfg, state = Path(argv[0]).resolve(), Path(argv[1]), Path(argv[2])
    rows = await asyncio.gather(*(one(local, cfg, state, r) for r in argv[3:]))
    print(json.dumps({"uploaded": sum(int(r["uploaded"]) for r in rows),  # type: ignore[call-overload]
                      "remotes": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
