"""HOME isolation for terminal children, and the opt-in sandbox for eval/batch runs.

``TERMINAL_HOME_MODE`` decides which HOME terminal children get:

* ``auto`` (default): the real HOME on hosts, the profile home in containers;
* ``real``: always the real HOME;
* ``profile`` (aliases ``isolated``, ``profile_home``): always the profile home. The real home is
  recorded in ``TERMINAL_REAL_HOME`` and TMPDIR/TMP/TEMP point at ``<profile_home>/tmp``, so
  both "write a file under ~" and "write a temp file" land in the profile.

Isolating HOME covers one of four exits an eval run can leak through; :func:`sandbox_env`
covers two more (the crontab and the systemd user bus). Count exits, not directories.
"""

from __future__ import annotations

import os
import pwd
import shlex
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from .env import path_entries

__all__ = [
    "HOME_MODES",
    "MODE_ENV_VAR",
    "REAL_HOME_ENV_VAR",
    "TEMP_VARS",
    "USER_BUS_VARS",
    "child_env",
    "crontab_shim",
    "detect_container",
    "home_mode_from_env",
    "normalize_home_mode",
    "profile_dirs",
    "protected_homes",
    "resolve_home_mode",
    "sandbox_bin_dir",
    "sandbox_env",
]

HOME_MODES = ("auto", "real", "profile")
MODE_ENV_VAR = "TERMINAL_HOME_MODE"
REAL_HOME_ENV_VAR = "TERMINAL_REAL_HOME"
TEMP_VARS = ("TMPDIR", "TMP", "TEMP")
USER_BUS_VARS = ("DBUS_SESSION_BUS_ADDRESS", "XDG_RUNTIME_DIR")
_ALIASES = {"isolated": "profile", "profile_home": "profile"}


def normalize_home_mode(value: str | None) -> str:
    """Return ``auto``, ``real`` or ``profile`` for a configured value.

    None and blank mean ``auto``; case and surrounding blanks are ignored; ``isolated`` and
    ``profile_home`` are aliases of ``profile``. Anything else raises ``ValueError`` with a
    one-line message naming the valid values.
    """
    mode = (value or "").strip().lower() or "auto"
    mode = _ALIASES.get(mode, mode)
    if mode not in HOME_MODES:
        raise ValueError(
            f"invalid terminal home mode {value!r}: use auto, real or profile "
            "(isolated and profile_home are aliases of profile)"
        )
    return mode


def home_mode_from_env(explicit: str | None, environ: Mapping[str, str]) -> str:
    """Return the normalized mode: ``explicit`` when non-blank, else ``$TERMINAL_HOME_MODE``."""
    if explicit is not None and explicit.strip():
        return normalize_home_mode(explicit)
    return normalize_home_mode(environ.get(MODE_ENV_VAR))


def detect_container(root: Path = Path("/"), environ: Mapping[str, str] | None = None) -> bool:
    """Return True when this process looks like it runs in a container.

    Docker leaves ``/.dockerenv``, podman ``/run/.containerenv``; systemd-nspawn, podman and LXC
    set ``$container``.
    """
    env = os.environ if environ is None else environ
    markers = (root / ".dockerenv", root / "run" / ".containerenv")
    return bool(env.get("container")) or any(m.exists() for m in markers)


def resolve_home_mode(mode: str, in_container: bool) -> Literal["real", "profile"]:
    """Resolve ``auto`` for this machine: profile home in containers, real home on hosts."""
    mode = normalize_home_mode(mode)
    if mode == "auto":
        return "profile" if in_container else "real"
    return "profile" if mode == "profile" else "real"


def profile_dirs(profile_home: Path) -> tuple[Path, Path]:
    """Return ``(home, scratch)``: the directories profile mode needs (scratch is mode 0700)."""
    return profile_home, profile_home / "tmp"


def child_env(
    base_env: Mapping[str, str],
    mode: str,
    *,
    profile_home: Path,
    in_container: bool,
    real_home: str | None = None,
    overrides: Mapping[str, str] | None = None,
    create_dirs: bool = True,
) -> dict[str, str]:
    """Return the environment for terminal children under HOME ``mode``.

    The real home is ``real_home``, else ``$TERMINAL_REAL_HOME`` (set when the parent itself
    already runs in a profile), else ``$HOME``, else the passwd entry. In ``real`` mode HOME is
    the real home. In ``profile`` mode HOME is ``profile_home``, ``TERMINAL_REAL_HOME`` holds
    the real home and TMPDIR/TMP/TEMP point at ``<profile_home>/tmp``: temp variables
    inherited from ``base_env`` are replaced, since they point outside the profile.

    ``overrides`` are what the caller set explicitly; they are applied last and win over every
    rule above (an explicit TMPDIR is kept). With ``create_dirs`` the profile directories are
    created locally (scratch with mode 0700); pass False and create :func:`profile_dirs`
    yourself when the children run elsewhere.
    """
    env = dict(base_env)
    real = real_home or env.get(REAL_HOME_ENV_VAR) or env.get("HOME") or _passwd_home()
    if resolve_home_mode(mode, in_container) == "real":
        env["HOME"] = real
    else:
        home, scratch = profile_dirs(profile_home)
        if create_dirs:
            _make_profile_dirs(home, scratch)
        env["HOME"] = str(home)
        env[REAL_HOME_ENV_VAR] = real
        env.update(dict.fromkeys(TEMP_VARS, str(scratch)))
    env.update(overrides or {})
    return env


def _passwd_home() -> str:
    return pwd.getpwuid(os.getuid()).pw_dir


def _make_profile_dirs(home: Path, scratch: Path) -> None:
    home.mkdir(parents=True, exist_ok=True)
    scratch.mkdir(mode=0o700, exist_ok=True)
    # mkdir's mode is filtered by the umask, and an existing dir keeps its old mode.
    scratch.chmod(0o700)


def protected_homes(
    *,
    process_home: str | os.PathLike[str] | None = None,
    real_home: str | os.PathLike[str] | None = None,
    subprocess_home: str | os.PathLike[str] | None = None,
    profile_home: str | os.PathLike[str] | None = None,
) -> set[str]:
    """Return every home a write could land in, for a write guard.

    The union matters: with HOME pinned to the profile, an absolute write into the real home
    must still count as a write into a home. Each given path appears both normalized and with
    symlinks resolved, so a guard comparing resolved targets matches either spelling. None and
    empty values are ignored.
    """
    homes: set[str] = set()
    for h in (process_home, real_home, subprocess_home, profile_home):
        if h is not None and os.fspath(h):
            p = os.path.abspath(os.fspath(h))
            homes.update({p, os.path.realpath(p)})
    return homes


# Behaviour-compatible crontab: same options and messages, one plain file as the table.
# -e runs the editor as crontab does, through `sh -c "$EDITOR FILE"`: EDITOR is a shell
# command line (quotes, arguments, assignments), not a word list.
_CRONTAB_SHIM = """#!/bin/sh
# crontab shim (filesync sandbox): the real crontab of the operator is never touched.
tab=@TAB@
user=${USER:-${LOGNAME:-$(id -un)}}
if [ "${1-}" = -u ]; then user=$2; shift 2; fi
nocrontab() { echo "no crontab for $user" >&2; exit 1; }
store() { cat -- "$1" >"$tab.new" && mv -f -- "$tab.new" "$tab"; }
case ${1-} in
    -l) [ -f "$tab" ] || nocrontab; cat -- "$tab" ;;
    -r) [ -f "$tab" ] || nocrontab; rm -f -- "$tab" ;;
    -e) tmp=$(mktemp) || exit 1
        if [ -f "$tab" ]; then cat -- "$tab" >"$tmp"; fi
        sh -c "${VISUAL:-${EDITOR:-vi}}"' "$1"' sh "$tmp" && store "$tmp"; rc=$?
        rm -f -- "$tmp"; exit "$rc" ;;
    ''|-) store - ;;
    -*) echo "crontab: invalid option -- '${1#-}'" >&2
        echo "usage: crontab [-u user] { -l | -r | -e | file | - }" >&2; exit 1 ;;
    *) [ -r "$1" ] || { echo "crontab: $1: No such file or directory" >&2; exit 1; }
       store "$1" ;;
esac
"""


def crontab_shim(table: Path) -> str:
    """Return the shim script storing its table in ``table`` (a quoted absolute path)."""
    return _CRONTAB_SHIM.replace("@TAB@", shlex.quote(str(table)))


def sandbox_bin_dir(run_dir: Path) -> Path:
    """Return the directory :func:`sandbox_env` puts first on PATH."""
    return run_dir / "bin"


def sandbox_env(env: Mapping[str, str], run_dir: Path) -> dict[str, str]:
    """Return ``env`` prepared for an eval/batch run whose state lives in ``run_dir``.

    Writes an executable ``crontab`` shim into ``<run_dir>/bin`` (table: ``<run_dir>/crontab``)
    and puts that directory first on PATH; drops DBUS_SESSION_BUS_ADDRESS and XDG_RUNTIME_DIR so
    ``systemctl --user`` cannot reach the operator's user manager. Combine with HOME mode
    ``profile`` so writes under ``~`` stay in the run too.
    """
    bin_dir = sandbox_bin_dir(run_dir)
    bin_dir.mkdir(parents=True, exist_ok=True)
    shim = bin_dir / "crontab"
    shim.write_text(crontab_shim(run_dir / "crontab"))
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    out = {k: v for k, v in env.items() if k not in USER_BUS_VARS}
    rest = [e for e in path_entries(out.get("PATH", "")) if e != str(bin_dir)]
    out["PATH"] = ":".join([str(bin_dir), *rest])
    return out
