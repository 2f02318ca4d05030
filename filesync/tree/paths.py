"""Paths: the one path-safety rule, and how a root is resolved.

Push, listing and pull all call ``unsafe_reason`` (or ``split_rel``, which refuses the
same names) before a relative path is used; the remote runs this same module.
"""

from __future__ import annotations

import os
import posixpath
import pwd
from functools import cache

#: ``typing`` and ``re`` are for the type checker here: a helper that only lists never
#: imports them (the expressions below are compiled on their first use).
TYPE_CHECKING = False
if TYPE_CHECKING:
    import re
    from collections.abc import Collection, Mapping


def home_dir() -> str:
    """The home directory ``~`` stands for (``$HOME``, else the password database)."""
    return os.path.expanduser("~")


def expand_user(path: str, env: Mapping[str, str] | None = None) -> str:
    """``path`` with a leading ``~`` or ``~/`` made the home of ``env`` (its ``HOME``, else
    the password database's), as ``os.path.expanduser`` does with the process's own
    environment, which is what ``env`` None means. ``~user`` is expanded as usual."""
    if env is None or not (path == "~" or path.startswith("~/")):
        return os.path.expanduser(path)
    home = env.get("HOME") or pwd.getpwuid(os.getuid()).pw_dir
    return home.rstrip("/") + path[1:] if home != "/" else "/" + path[2:]


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
STRUCTURE = r"^$|^/|//|(?:^|/)\.\.?(?:/|$)|/$"
# Unicode category Cc: C0, DEL and C1.
CONTROL = "[\x00-\x1f\x7f-\x9f]"
# Over names joined by newlines (``all_safe``): the ASCII control characters but the
# newline, which separates the names there.
_CONTROL_LINES = "[\x00-\x09\x0b-\x1f\x7f]"


@cache
def _compiled() -> tuple[re.Pattern[str], re.Pattern[str], re.Pattern[str]]:
    """``STRUCTURE``, ``CONTROL`` and ``_CONTROL_LINES``, compiled once, when first needed."""
    import re

    return re.compile(STRUCTURE), re.compile(CONTROL), re.compile(_CONTROL_LINES)


def plain_name(rel: str) -> bool:
    """True for a name ``unsafe_reason`` passes that is printable ASCII, decided by string
    scans (the common case: this runs once per path, and needs no regex). False for any
    other name, which the expressions then judge: for printable ASCII this is exactly
    "``STRUCTURE`` finds nothing" (no control character, so ``$`` is the end)."""
    if not (rel.isascii() and rel.isprintable()) or not rel or rel[0] == "/" \
            or rel[-1] == "/" or "//" in rel:
        return False
    if rel[0] == "." or "/." in rel:  # where a "." or ".." component can start
        framed = "/" + rel + "/"
        return "/./" not in framed and "/../" not in framed
    return True


# ... and the structure rule as substrings of "\n" + names + "\n": an empty name, an
# absolute one, an empty component, a trailing "/"; then "." and ".." components.
_EMPTY_PARTS = ("\n\n", "\n/", "//", "/\n")
_DOT_PARTS = ("\n./", "/./", "/.\n", "\n.\n", "\n../", "/../", "/..\n", "\n..\n")


def unsafe_reason(rel: str) -> str | None:
    """Why ``rel`` must not be synced, or ``None`` if it is safe.

    Refused: empty, absolute, ``.``/``..`` or empty components, NUL or other control
    characters (C0, DEL and C1: names with newlines break line-based tools on the other
    side), and names that are not valid UTF-8.
    """
    if plain_name(rel):
        return None
    structure, control, _ = _compiled()
    if structure.search(rel):
        return "unsafe path (absolute, '..' or empty component)"
    if control.search(rel):
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

    Exact for ASCII names without a newline, conservative otherwise. It runs over a whole
    listing (100k names) on every pass, so it is a few C-level scans of the names joined
    by newlines (one regex over that text would try a match at every position).
    """
    if not paths:
        return True
    framed = "\n" + "\n".join(paths) + "\n"
    if not framed.isascii() or framed.count("\n") != len(paths) + 1:
        return False  # non-ASCII, or a name holding a newline itself: check each
    if _compiled()[2].search(framed) is not None:
        return False
    if any(part in framed for part in _EMPTY_PARTS):
        return False
    # Most listings have few dotted names: the "." / ".." checks only run where one is.
    return not (("\n." in framed or "/." in framed)
                and any(part in framed for part in _DOT_PARTS))
