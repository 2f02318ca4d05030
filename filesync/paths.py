"""Path mapping and path-safety checks: the one place that decides if a name is safe.

Push, listing and pull all call ``unsafe_reason`` before a relative path is used,
and ``host_path`` is the only mapping from a relative path to a host path.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from pathlib import Path

from filesync.helper import split_rel

# Unicode category Cc: C0, DEL and C1. One regex: this runs once per listed path.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
# Anything that needs the slow, exact check: empty, absolute, '.'/'..'/empty components.
_SUSPECT = re.compile("^$|^/|//|(?:^|/)\\.\\.?(?:/|$)|/$|[\x00-\x1f\x7f-\x9f]")


def unsafe_reason(rel: str) -> str | None:
    """Why ``rel`` must not be synced, or ``None`` if it is safe.

    Refused: empty, absolute, ``.``/``..`` or empty components, NUL or other control
    characters (C0, DEL and C1) (names with newlines break line-based tools on the other side), and
    names that are not valid UTF-8.
    """
    if not _SUSPECT.search(rel) and rel.isascii():
        return None  # the common case, decided by one regex
    try:
        split_rel(rel)
    except ValueError:
        return "unsafe path (absolute, '..' or empty component)"
    if _CONTROL.search(rel):
        return "control character in name"
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        return "name is not valid UTF-8"
    return None


# The checks of ``_SUSPECT`` on paths joined by (and framed in) newlines, as substrings.
_BAD_JOINED = ("//", "\n/", "/\n", "\n\n", "/./", "\n./", "/.\n", "\n.\n",
               "/../", "\n../", "/..\n", "\n..\n")
# Control characters other than the newline that joins the paths.
_CONTROL_NOT_NL = re.compile("[\x00-\x09\x0b-\x1f\x7f]")


def all_safe(paths: Collection[str]) -> bool:
    """True if ``unsafe_reason`` is ``None`` for every path; False means "check each".

    One pass over all the names joined by newlines, with substring searches in C: a
    third of the time of one regex search per path, and a listing is mostly clean.
    """
    blob = "\n" + "\n".join(paths) + "\n"
    return (
        blob.isascii()
        and blob.count("\n") == len(paths) + 1  # no name holds a newline itself
        and not any(bad in blob for bad in _BAD_JOINED)
        and _CONTROL_NOT_NL.search(blob) is None
    )


def host_path(root: Path, rel: str) -> Path:
    """``root / rel`` for a relative path already checked by ``unsafe_reason``."""
    reason = unsafe_reason(rel)
    if reason is not None:
        raise ValueError(f"{rel!r}: {reason}")
    return root.joinpath(*rel.split("/"))
