"""Mappings: which host tree goes to which remote tree, and in which directions.

Guarantees:

- ``Mapping.local`` is stored as a ``str`` with ``~`` expanded, from any ``str`` or
  ``os.PathLike[str]`` (a relative path stays relative to the working directory);
  ``Mapping.remote`` is a path on the remote side, kept as written (``~`` there is the
  remote's home, resolved by the remote helper).
- ``mode`` is ``"two-way"`` or ``"upload-only"``; anything else raises ``ValueError``.
- ``nested_excludes`` is the one ownership rule for mappings synced together: the
  innermost mapping owns a path, so an outer mapping excludes what an inner one covers.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

TWO_WAY = "two-way"
UPLOAD_ONLY = "upload-only"


@dataclass(frozen=True, init=False)
class Mapping:
    """One synced tree or file. ``upload-only`` mappings are pushed but never written back.

    ``local`` is a directory or a single regular file; ``exclude`` holds this mapping's
    own gitignore-syntax patterns, added to the caller's.
    """

    local: str
    remote: str
    mode: str
    exclude: tuple[str, ...]

    def __init__(
        self,
        local: str | os.PathLike[str],
        remote: str | os.PathLike[str],
        mode: str = TWO_WAY,
        *,
        exclude: Iterable[str] = (),
    ) -> None:
        if mode not in (TWO_WAY, UPLOAD_ONLY):
            raise ValueError(
                f"mapping mode {mode!r} is not valid; use {TWO_WAY!r} or {UPLOAD_ONLY!r}"
            )
        if isinstance(exclude, str):
            raise ValueError("mapping exclude takes a list of patterns, not one string")
        patterns = tuple(exclude)
        object.__setattr__(self, "local", os.path.expanduser(os.fspath(local)))
        object.__setattr__(self, "remote", os.fspath(remote))
        object.__setattr__(self, "mode", mode)
        object.__setattr__(self, "exclude", patterns)


_SPECIAL = re.compile(r"([\\*?\[\]!# ])")


def literal_pattern(rel: str) -> str:
    """An anchored gitignore pattern matching exactly the POSIX path ``rel`` (a file or a
    directory), whatever characters its names hold."""
    return "/" + _SPECIAL.sub(r"\\\1", rel)


def nested_excludes(
    owner: Mapping,
    mappings: Sequence[Mapping],
    *,
    remote_root: Callable[[str], str] = posixpath.normpath,
) -> list[str]:
    """The exclude patterns ``owner``'s pass needs so that the innermost mapping owns a path.

    Another mapping of ``mappings`` whose local path lies strictly inside ``owner``'s
    local path, or whose remote path lies strictly inside ``owner``'s remote path, is
    excluded from ``owner`` by an anchored pattern for its path relative to ``owner``'s
    root (on that side). The pattern matches a file or a directory of that name, so the
    rule is the same for directory and single-file inner mappings. ``remote_root`` maps
    a remote path to the form the paths are compared in (by default ``normpath``; a
    caller that can resolve ``~`` and relative paths on the remote passes that).
    """
    mine_local = os.path.normpath(os.path.abspath(owner.local))
    mine_remote = remote_root(owner.remote)
    out: list[str] = []
    for other in mappings:
        if other is owner or other == owner:
            continue
        for rel in (
            _inside(os.path.normpath(os.path.abspath(other.local)), mine_local, os.sep),
            _inside(remote_root(other.remote), mine_remote, "/"),
        ):
            if rel is not None:
                pattern = literal_pattern(rel.replace(os.sep, "/"))
                if pattern not in out:
                    out.append(pattern)
    return out


def _inside(path: str, root: str, sep: str) -> str | None:
    """``path`` relative to ``root`` if strictly inside it, else None."""
    prefix = root.rstrip(sep) + sep
    if path != root and path.startswith(prefix):
        return path[len(prefix):]
    return None
