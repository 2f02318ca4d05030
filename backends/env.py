"""Environment pieces of a terminal session: PATH restore, shell-init files, the env snapshot.

A session takes ONE snapshot of a login shell's environment. Debian's ``/etc/profile`` *replaces*
PATH, so the directories the launching process had are lost unless they are restored after the
profile ran and before the snapshot is printed. Background commands run through ``bash -lic`` and
get the same prelude, so foreground and background cannot disagree about which tools exist.

Everything here builds strings (shell text, argv lists) or parses output; nothing assumes the
shell runs on this machine, so an SSH terminal can send the same text to a remote ``bash``.

PATH strings are read as lists of entries split on ``:``, with these edge cases:

* ``""`` (empty or unset PATH) has no entries;
* every other string has ``s.count(":") + 1`` entries, so ``"a::b"``, ``":a"`` and ``"a:"`` each
  contain the empty entry, which a shell resolves against its working directory;
* a lone empty entry appended to an empty PATH is still written ``""`` (it cannot be spelled
  otherwise); it then reads as "no entries", which a shell treats as implementation-defined.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

__all__ = [
    "SNAPSHOT_MARKER",
    "ShellInit",
    "background_command",
    "expand_init_path",
    "first_snippet",
    "parse_env0",
    "parse_snapshot",
    "path_entries",
    "prelude_script",
    "put_first",
    "restore_path",
    "restore_snippet",
    "snapshot_script",
    "source_snippet",
]

# Printed between whatever the profiles echo and the NUL-separated environment.
SNAPSHOT_MARKER = "__FILESYNC_ENV_SNAPSHOT_7f3a__"

# Per-shell state, not environment a command should inherit: the next shell sets its own.
_SHELL_STATE_VARS = frozenset({"_", "PWD", "OLDPWD", "SHLVL"})

# Helper variable names are distinctive so the snippet cannot clobber a user's variable.
_P = "__filesync_rp"
_HAD = "__filesync_rp_had"
_F, _NEW, _REST, _LEFT, _ANY = ("__filesync_pf", "__filesync_pf_new", "__filesync_pf_rest",
                                "__filesync_pf_left", "__filesync_pf_any")


def path_entries(value: str) -> list[str]:
    """Split a PATH string into entries: ``""`` has none; otherwise split on every ``:``."""
    return value.split(":") if value else []


def restore_path(
    launch_path: str, login_path: str, isdir: Callable[[str], bool] = os.path.isdir
) -> str:
    """Return ``login_path`` with the launch-PATH entries it lacks appended at the end.

    Guarantees:

    * ``login_path``'s own entries come first, unchanged (even its own duplicates), so whatever
      nvm/pyenv/the profile put in front keeps precedence;
    * appended entries keep their relative order from ``launch_path``;
    * no entry is appended that is already present, and each is appended at most once;
    * absolute entries (starting with ``/``) are appended only when ``isdir`` says they exist;
      relative entries, including the empty entry (the working directory), are kept unchecked
      because they resolve against the shell's working directory, unknown at this point;
    * idempotent: ``restore_path(l, restore_path(l, p)) == restore_path(l, p)``.
    """
    present = path_entries(login_path)
    seen = set(present)
    added: list[str] = []
    for entry in path_entries(launch_path):
        if entry in seen:
            continue
        seen.add(entry)
        if entry.startswith("/") and not isdir(entry):
            continue
        added.append(entry)
    return ":".join(present + added)


def restore_snippet(launch_path: str) -> str:
    """Return POSIX-sh text that applies :func:`restore_path` to the running shell's PATH.

    Run after the login profile, it leaves PATH equal to ``restore_path(launch_path, $PATH)``
    with ``isdir`` being ``test -d``, exports PATH and unsets its helper variables. Running it
    twice gives the same PATH. Entries are quoted with :func:`shlex.quote` and compared as
    literal strings, so spaces, quotes, ``$``, backslashes, glob characters and newlines are
    safe. Works in ``sh`` (dash), ``bash`` and ``bash --posix``, also under ``set -eu``.
    """
    entries = list(dict.fromkeys(path_entries(launch_path)))
    words = " ".join(shlex.quote(e) for e in entries)
    # The "had" flag distinguishes an empty PATH (no entries) from a PATH that holds only the
    # empty entry: both are spelled "" but only the latter already contains "".
    return (
        f'if [ -n "${{PATH-}}" ]; then {_HAD}=1; else {_HAD}=0; fi; '
        f"for {_P} in {words}; do "
        f'case "${_P}" in /*) [ -d "${_P}" ] || continue ;; esac; '
        f'if [ "${_HAD}" = 1 ]; then '
        f'case ":$PATH:" in *":${_P}:"*) ;; *) PATH="$PATH:${_P}" ;; esac; '
        f'else PATH="${_P}"; {_HAD}=1; fi; '
        f"done; unset {_P} {_HAD}; export PATH"
    )


def first_dirs(dirs: Iterable[str]) -> list[str]:
    """``dirs`` in order without duplicates; ``ValueError`` for one that is not absolute or
    holds ``:`` (a relative entry first on PATH would resolve against any working dir)."""
    out = list(dict.fromkeys(dirs))
    bad = [d for d in out if not d.startswith("/") or ":" in d]
    if bad:
        raise ValueError(f"PATH-first dirs must be absolute paths without ':', not {bad!r}")
    return out


def put_first(
    dirs: Sequence[str], path: str, isdir: Callable[[str], bool] = os.path.isdir
) -> str:
    """Return ``path`` with ``dirs`` first: the ones ``isdir`` says exist, in the given order,
    each once, and no other copy of them later on; the other entries keep their order (the
    empty entry included). Idempotent. ``dirs`` as :func:`first_dirs` takes them."""
    front = [d for d in first_dirs(dirs) if isdir(d)]
    if not front:
        return path
    taken = set(front)
    return ":".join(front + [e for e in path_entries(path) if e not in taken])


def first_snippet(dirs: Sequence[str]) -> str:
    """Return POSIX-sh text that applies :func:`put_first` to the running shell's PATH (with
    ``test -d``), exports PATH and unsets its helpers; safe under ``set -eu``, literal
    matching of any characters."""
    words = " ".join(shlex.quote(d) for d in first_dirs(dirs))
    # Entries are split with parameter expansion, not IFS, so empty entries and glob
    # characters survive; ``PATH:`` gives every entry, the last one included, a ':' after it.
    return (
        f'{_NEW}=; for {_F} in {words}; do [ -d "${_F}" ] || continue; '
        f'case ":${_NEW}:" in *":${_F}:"*) ;; '
        f'*) if [ -n "${_NEW}" ]; then {_NEW}="${_NEW}:${_F}"; else {_NEW}="${_F}"; fi ;; '
        f'esac; done; '
        f'if [ -n "${_NEW}" ]; then '
        f'{_REST}=; {_ANY}=0; if [ -n "${{PATH-}}" ]; then {_LEFT}="$PATH:"; else {_LEFT}=; fi; '
        f'while [ -n "${_LEFT}" ]; do {_F}="${{{_LEFT}%%:*}}"; {_LEFT}="${{{_LEFT}#*:}}"; '
        f'case ":${_NEW}:" in *":${_F}:"*) continue ;; esac; '
        f'if [ "${_ANY}" = 1 ]; then {_REST}="${_REST}:${_F}"; '
        f'else {_REST}="${_F}"; {_ANY}=1; fi; done; '
        f'if [ "${_ANY}" = 1 ]; then PATH="${_NEW}:${_REST}"; else PATH="${_NEW}"; fi; fi; '
        f"unset {_F} {_NEW} {_REST} {_LEFT} {_ANY}; export PATH"
    )


@dataclass(frozen=True)
class ShellInit:
    """Which files a session sources after the login profile.

    ``shell_init_files`` (when not None) takes over completely; otherwise, with
    ``auto_source_bashrc``, the user's ``~/.profile``, ``~/.bash_profile`` and ``~/.bashrc``.
    """

    auto_source_bashrc: bool = True
    shell_init_files: Sequence[str] | None = None

    AUTO_FILES: ClassVar[tuple[str, ...]] = ("~/.profile", "~/.bash_profile", "~/.bashrc")

    def files(
        self,
        home: str,
        env: Mapping[str, str],
        exists: Callable[[str], bool] = os.path.isfile,
    ) -> list[str]:
        """Return the absolute paths to source, in order, each once, only those that exist.

        Names are expanded by :func:`expand_init_path`; ``exists`` is injectable so an SSH
        terminal can check on the remote side.
        """
        if self.shell_init_files is not None:
            names: Sequence[str] = self.shell_init_files
        elif self.auto_source_bashrc:
            names = self.AUTO_FILES
        else:
            names = ()
        expanded = (expand_init_path(n, home, env) for n in names)
        return [p for p in dict.fromkeys(expanded) if exists(p)]


_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_VAR_RE = re.compile(rf"\$(?:\{{(?P<braced>{_NAME})\}}|(?P<plain>{_NAME}))")


def expand_init_path(name: str, home: str, env: Mapping[str, str]) -> str:
    """Expand a configured init-file name the way a shell would, against ``home`` and ``env``.

    ``~`` and ``~/...`` become ``home``; then ``$VAR`` and ``${VAR}`` are substituted from
    ``env`` (``$HOME`` is ``home``). Unknown variables and ``~user`` stay literal, so the name
    points nowhere and the file is skipped instead of silently becoming another path. A name
    that is still relative is taken relative to ``home`` (``. name`` would search PATH).
    """
    if name == "~" or name.startswith("~/"):
        name = home + name[1:]
    lookup = {**env, "HOME": home}

    def substitute(m: re.Match[str]) -> str:
        var = m.group("braced") or m.group("plain")
        return lookup.get(var, m.group(0))

    name = _VAR_RE.sub(substitute, name)
    return name if name.startswith("/") else os.path.join(home, name)


def source_snippet(files: Iterable[str]) -> str:
    """Return sh text that sources each readable file in order; unreadable ones are skipped.

    The if-form (rather than ``[ -r f ] && . f``) keeps the exit status 0 under ``set -e``.
    """
    lines = (f"if [ -r {q} ]; then . {q}; fi" for q in map(shlex.quote, files))
    return "\n".join(lines)


def prelude_script(
    launch_path: str,
    init_files: Sequence[str] = (),
    *,
    pin_first: Sequence[str] = (),
    unset: Sequence[str] = (),
) -> str:
    """Return the sh text a session runs after the login profile, before any command.

    In order: source ``init_files``; restore the launch PATH (minus ``pin_first``); put the
    ``pin_first`` directories first (:func:`first_snippet`: absolute, in order, each once,
    moved there when the profile already had them: a sandbox shim dir that must shadow system
    tools, the launcher's venv ``bin`` that must win over ``/usr/bin``); unset ``unset``
    variables (e.g. the user-bus address a profile might set again).
    """
    pinned = set(pin_first)
    restore_from = ":".join(e for e in path_entries(launch_path) if e not in pinned)
    parts = [source_snippet(init_files), restore_snippet(restore_from)]
    if pin_first:
        parts.append(first_snippet(pin_first))
    if unset:
        parts.append("unset " + " ".join(_checked_names(unset)))
    return "\n".join(p for p in parts if p)


def snapshot_script(
    launch_path: str,
    init_files: Sequence[str] = (),
    *,
    pin_first: Sequence[str] = (),
    unset: Sequence[str] = (),
) -> str:
    """Return the script to run under ``bash -l -c`` to take the session's env snapshot.

    It runs :func:`prelude_script`, prints :data:`SNAPSHOT_MARKER` between NULs and then the
    environment as ``env -0`` (NUL-terminated ``NAME=value`` records: values may hold newlines,
    quotes and ``=``). ``exec`` keeps ``~/.bash_logout`` from printing after it. Read the output
    with :func:`parse_snapshot`.
    """
    prelude = prelude_script(launch_path, init_files, pin_first=pin_first, unset=unset)
    return f"{prelude}\nprintf '\\000%s\\000' {SNAPSHOT_MARKER}\nexec env -0\n"


def parse_env0(text: str) -> dict[str, str]:
    """Parse ``env -0`` output: NUL-terminated records split at their first ``=``.

    Records without ``=`` (never produced by ``env``) are ignored. Decode the raw bytes with
    ``errors="surrogateescape"`` so non-UTF-8 values survive the round trip to a child process.
    """
    env: dict[str, str] = {}
    for record in text.split("\0"):
        name, sep, value = record.partition("=")
        if sep and name:
            env[name] = value
    return env


def parse_snapshot(output: str) -> dict[str, str]:
    """Return the environment printed by :func:`snapshot_script`, minus per-shell state.

    Text the profiles printed before the marker is ignored. ``_``, ``PWD``, ``OLDPWD`` and
    ``SHLVL`` are dropped: each shell sets them itself. Raises ``ValueError`` when the marker
    is missing (the script did not get that far, e.g. a profile called ``exit``).
    """
    _noise, sep, body = output.partition(f"\0{SNAPSHOT_MARKER}\0")
    if not sep:
        raise ValueError("environment snapshot marker missing from the login shell's output")
    env = parse_env0(body)
    return {k: v for k, v in env.items() if k not in _SHELL_STATE_VARS}


def background_command(
    cmd: str,
    launch_path: str,
    init_files: Sequence[str] = (),
    *,
    pin_first: Sequence[str] = (),
    unset: Sequence[str] = (),
) -> list[str]:
    """Return the argv ``["bash", "-lic", "<prelude>\\n<cmd>"]`` for a background command.

    The prelude is the one the snapshot used, so a background command sees the same PATH as a
    foreground one. For a remote shell, join it with :func:`shlex.join`.
    """
    prelude = prelude_script(launch_path, init_files, pin_first=pin_first, unset=unset)
    return ["bash", "-lic", f"{prelude}\n{cmd}"]


_NAME_RE = re.compile(rf"{_NAME}\Z")


def _checked_names(names: Sequence[str]) -> list[str]:
    bad = [n for n in names if not _NAME_RE.match(n)]
    if bad:
        raise ValueError(f"not shell variable names: {bad!r}")
    return list(names)
