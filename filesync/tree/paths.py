"""Paths: the one path-safety rule, and how a root is resolved.

Push, listing and pull all call ``unsafe_reason`` (or ``split_rel``, which refuses the
same names) before a relative path is used; the remote runs this same module.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Collection


def home_dir() -> str:
    """The home directory ``~`` stands for (``$HOME``, else the password database)."""
    return os.path.expanduser("~")


def resolve_root(path: str, cwd: str, home: str) -> str:
    """The absolute, normalized root for ``path`` as the user wrote it.

    ``~`` and ``~/...`` are relative to ``home``; other relative paths to ``cwd`` (over
    SSH that is the home too, through ``docker exec`` the container's working dir).
    ``~user`` is not expanded. The client resolves roots with this same function, so
    what it records in its state is what the helper uses.
    """
    if path == "~" or path.startswith("~/"):
        path = posixpath.join(home, path[2:])
    return posixpath.normpath(posixpath.join(cwd, path))


# The one path-safety rule, as regex text: empty, absolute, '.'/'..' or empty components.
_STRUCTURE = r"^$|^/|//|(?:^|/)\.\.?(?:/|$)|/$"
_UNSAFE_STRUCTURE = re.compile(_STRUCTURE)
# Unicode category Cc: C0, DEL and C1.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
# Either of the two, in one search: this runs once per listed path.
_SUSPECT = re.compile(_STRUCTURE + "|[\x00-\x1f\x7f-\x9f]")
# The same rule over names joined by newlines (the newline itself is the separator).
_SUSPECT_LINES = re.compile(_STRUCTURE + "|[\x00-\x09\x0b-\x1f\x7f-\x9f]", re.MULTILINE)


def unsafe_reason(rel: str) -> str | None:
    """Why ``rel`` must not be synced, or ``None`` if it is safe.

    Refused: empty, absolute, ``.``/``..`` or empty components, NUL or other control
    characters (C0, DEL and C1: names with newlines break line-based tools on the other
    side), and names that are not valid UTF-8.
    """
    if not _SUSPECT.search(rel) and rel.isascii():
        return None  # the common case, decided by one regex
    if _UNSAFE_STRUCTURE.search(rel):
        return "unsafe path (absolute, '..' or empty component)"
    if _CONTROL.search(rel):
        return "control character in name"
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        return "name is not valid UTF-8"
    return None


def split_rel(rel: str) -> list[str]:
    """The components of ``rel``; ``ValueError`` (with ``unsafe_reason``'s answer) for a
    name the rule refuses, so nothing that could leave the root is ever opened."""
    reason = unsafe_reason(rel)
    if reason is not None:
        raise ValueError(reason)
    return rel.split("/")


def all_safe(paths: Collection[str]) -> bool:
    """True if ``unsafe_reason`` is ``None`` for every path; False means "check each".

    One search of the same rule over all the names joined by newlines: a listing is
    mostly clean, and one C-level scan costs far less than a search per name.
    """
    blob = "\n".join(paths)
    return (
        blob.isascii()
        and blob.count("\n") == len(paths) - 1  # no name holds a newline itself
        and (not paths or _SUSPECT_LINES.search(blob) is None)
    )
