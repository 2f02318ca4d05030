"""The ``--json`` document of push, pull, sync, status and resolve: one shape for every run.

One pair, a ``--config`` file and a fan-out print the same top-level keys: the totals over
all pairs (counters summed, lists joined in pair order, ``seconds`` the wall time), plus
``pairs``, one object per pair with its ``label``, ``local`` and ``remote`` and the same
per-pair keys. ``schema`` is bumped only when a key changes meaning or goes away; new keys
may appear at any time. ``docs/json.md`` documents every field.

Imports nothing heavy: ``filesync.cli.main`` prints the document of a run that failed
before any pass with it, on the path that must stay free of asyncio.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

SCHEMA = 1

#: The per-pair keys, in order, and how the top level totals each: counters are summed,
#: lists joined in pair order; ``seconds`` is the wall time of the whole run instead.
TOTALS = {
    "files": "join", "uploaded": "sum", "downloaded": "sum", "deleted_local": "sum",
    "deleted_remote": "sum", "conflicts": "join", "excluded": "sum", "skipped": "join",
    "bytes_sent": "sum", "bytes_received": "sum", "seconds": "wall", "pruned": "join",
}
COUNTS = tuple(k for k, how in TOTALS.items() if how == "sum")
#: Lists only a plan (``status``, ``--dry-run``) carries.
PLAN_LISTS = ("plan", "open_conflicts")


def pair_json(
    label: str, local: str, remote: str, fields: dict[str, Any],
    error: str | None = None, exit_code: int | None = None,
) -> dict[str, Any]:
    """One pair's object: where it is, its report's ``fields``, and its failure if any."""
    out: dict[str, Any] = {"label": label, "local": local, "remote": remote, **fields}
    if error is not None:
        out.update(error=error, exit_code=exit_code)
    return out


def document(
    pairs: Sequence[dict[str, Any]], seconds: float, plan: bool = False,
    error: str | None = None, exit_code: int | None = None,
) -> dict[str, Any]:
    """The whole run's object: totals over ``pairs``, then the pairs themselves."""
    out: dict[str, Any] = {"schema": SCHEMA}
    for key, how in TOTALS.items():
        if how == "sum":
            out[key] = sum(p.get(key, 0) for p in pairs)
        elif how == "join":
            out[key] = [item for p in pairs for item in p.get(key, [])]
        else:
            out[key] = round(seconds, 4)
    if plan:
        for key in PLAN_LISTS:
            out[key] = [item for p in pairs for item in p.get(key, [])]
    if error is not None:
        out.update(error=error, exit_code=exit_code)
    out["pairs"] = list(pairs)
    # Kept from before ``pairs`` (schema 1 still has it): one line of counters per pair.
    out["remotes"] = [
        {"remote": p["label"], **{k: p.get(k, 0) for k in COUNTS},
         **({"error": p["error"], "exit_code": p["exit_code"]} if "error" in p else {})}
        for p in pairs
    ]
    return out


def failed_document(error: str, exit_code: int) -> dict[str, Any]:
    """The document of a run that failed before any pass: zeros, no pairs, the error."""
    return document([], 0.0, error=error, exit_code=exit_code)
