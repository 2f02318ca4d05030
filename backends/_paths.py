"""The one reading of a path parameter of the backends.

Every path a caller passes (``profile_home``, ``sandbox_dir``, ``cwd``, ``identity``,
``ssh_config``, ``state_dir``; ``Mapping.local`` does the same in filesync) may be a ``str``
or an ``os.PathLike[str]``, and a leading ``~`` or ``~user`` is expanded like
:func:`os.path.expanduser` does, so ``"~/x"`` never becomes a directory named ``~``. A
relative path stays relative (to the working directory, as for ``open``).
"""

from __future__ import annotations

import os
import posixpath
from pathlib import Path

__all__ = ["StrPath", "local_path", "optional_local_path", "remote_path"]

StrPath = str | os.PathLike[str]


def local_path(value: StrPath) -> Path:
    """``value`` as a local :class:`Path` with ``~`` expanded."""
    return Path(os.path.expanduser(os.fspath(value)))


def optional_local_path(value: StrPath | None) -> Path | None:
    """:func:`local_path`, passing None through."""
    return None if value is None else local_path(value)


def remote_path(value: StrPath, home: str) -> str:
    """A path on the remote side, made absolute: ``~`` and relative paths are under ``home``
    (the remote HOME). ``~user`` is not expanded: the remote's users are not known here."""
    text = os.fspath(value)
    if text == "~" or text.startswith("~/"):
        text = home + text[1:]
    return posixpath.normpath(posixpath.join(home, text))
