"""An ``/etc/profile.d`` snippet that puts image directories back on PATH.

Debian's and Ubuntu's ``/etc/profile`` *replace* PATH with a fixed list, so a login shell inside a
container image loses directories such as ``/opt/app/bin``. Installing the snippet produced here as
``/etc/profile.d/<name>.sh`` makes every login shell prepend them again.

Stdlib only: the CLI (``filesync profile-snippet DIR...``) prints it without importing more.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

__all__ = ["profile_snippet"]

# Distinctive so that sourcing the snippet cannot clobber a variable a user profile relies on.
_VAR = "__filesync_pp"


def profile_snippet(dirs: Sequence[str]) -> str:
    """Return a POSIX-sh snippet that prepends each of ``dirs`` to PATH when it is missing.

    Guarantees, for any PATH the shell had before sourcing:

    * a directory already on PATH stays exactly where it is (never moved, never duplicated);
    * missing directories end up in front, in the order given in ``dirs``;
    * sourcing the snippet any number of times gives the same PATH as sourcing it once;
    * an empty or unset PATH becomes just the directories (no trailing ``:``, which would add the
      current directory);
    * no helper variable survives, and PATH is exported.

    ``dirs`` must be absolute paths without ``:``; duplicates are dropped. Raises ``ValueError``
    otherwise, because a relative entry on a system-wide PATH would resolve against whatever
    directory a shell happens to start in.
    """
    wanted = _checked_dirs(dirs)
    # Prepending one by one reverses the order, so walk the list back to front.
    words = " ".join(shlex.quote(d) for d in reversed(wanted))
    lines = [
        "# Installed by `filesync profile-snippet`: prepend image directories missing from PATH.",
        f"for {_VAR} in {words}; do",
        '    case ":${PATH-}:" in',
        f'        *":${_VAR}:"*) ;;',
        f'        *) if [ -n "${{PATH-}}" ]; then PATH="${_VAR}:$PATH"; else PATH="${_VAR}"; fi ;;',
        "    esac",
        "done",
        f"unset {_VAR}",
        "export PATH",
    ]
    return "\n".join(lines) + "\n"


def _checked_dirs(dirs: Sequence[str]) -> list[str]:
    if isinstance(dirs, str):
        raise TypeError("profile_snippet() takes a sequence of directories, not one string")
    seen: list[str] = []
    for d in dirs:
        if not d.startswith("/") or ":" in d:
            raise ValueError(f"profile snippet directory must be absolute, without ':': {d!r}")
        if d not in seen:
            seen.append(d)
    return seen
