"""``filesync.toml``: several remotes and several mappings, synced over one connection each.

The format (every key, its type and default) is documented in docs/config.md. Example::

    remotes = ["devbox:", "ssh://ci@build:2222/"]   # REMOTE forms; the path part is a base
    # via = "docker exec -i web"                     # instead of SSH, a command transport

    [[mapping]]
    local = "~/.hermes/skills"        # relative: to this file's directory
    remote = ".hermes/skills"         # relative to the remote home (or the base path)
    mode = "two-way"                  # or "upload-only": pushed, never written back
    exclude = ["*.bak"]

Guarantees: a file that is not exactly this format is refused as a whole, with one line
naming the file and the key (an unknown key is refused too: a typo such as ``excludes``
would otherwise sync what it meant to exclude). Relative host paths (``local``, and a
REMOTE that is a local path) are relative to the file's directory, never to the working
directory. A remote file belongs to the mapping with the longest remote root that
contains it: an outer mapping's pass excludes the roots of the mappings nested inside it.
"""

from __future__ import annotations

import collections.abc
import os
import posixpath
from dataclasses import dataclass, field
from pathlib import Path

from filesync.errors import UsageError
from filesync.mapping import TWO_WAY, Mapping, nested_excludes
from filesync.transport.target import Target, parse_remote, via_argv
from filesync.tree.paths import expand_user


@dataclass(frozen=True)
class MappingSpec:
    """One mapping plus its own extra exclude patterns."""

    mapping: Mapping
    exclude: tuple[str, ...] = ()


@dataclass
class Config:
    remotes: list[str]
    mappings: list[MappingSpec] = field(default_factory=list)
    via: str | None = None

    def target(self, remote: str, spec: MappingSpec) -> Target:
        """The REMOTE of ``spec`` on ``remote`` (its path joined to the remote's base)."""
        base = parse_remote(remote, self.via)
        path = spec.mapping.remote
        if not path.startswith("/"):
            path = posixpath.join(base.path, path) if base.path not in ("", ".") else path
        return Target(base.kind, path, base.host, base.user, base.port, base.via)

    def nested_excludes(self, spec: MappingSpec) -> list[str]:
        """What ``spec``'s pass excludes so that the innermost mapping owns a path: the one
        rule, ``filesync.mapping.nested_excludes``, over this file's mappings."""
        return nested_excludes(spec.mapping, [other.mapping for other in self.mappings])


_TOP_KEYS = ("remotes", "remote", "via", "mapping")
_MAPPING_KEYS = ("local", "remote", "mode", "exclude")


def load_config(path: Path, via: str | None = None,
                env: collections.abc.Mapping[str, str] | None = None) -> Config:
    """Read and check a config file; raise ``UsageError`` naming the file and the key to fix.

    ``via`` (the command line's ``--via``) overrides the file's ``via``; ``~`` in the
    file's local paths is the home of ``env`` (None: the process's environment).
    """
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise UsageError(f"config file {path} does not exist; check the --config path") from None
    except OSError as exc:
        raise UsageError(f"cannot read config file {path} ({exc.strerror}); "
                         "check the --config path") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"config file {path} is not UTF-8 (byte {exc.start}); "
                         "save it as UTF-8") from None
    # Imported here: tomllib (and its regexes) loads only for a run that reads a config.
    import tomllib

    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"config file {path} is not valid TOML ({exc}); fix it") from None
    _known(path, "", raw, _TOP_KEYS)
    if "remotes" in raw and "remote" in raw:
        raise UsageError(f"{path}: set remotes or remote, not both")
    remotes = raw["remotes"] if "remotes" in raw else ([raw["remote"]] if "remote" in raw else [])
    if not isinstance(remotes, list) or not remotes or not all(isinstance(r, str) for r in remotes):
        raise UsageError(f"{path}: set remotes = [\"host:\", ...] (at least one REMOTE string)")
    file_via = raw.get("via")
    if file_via is not None and not isinstance(file_via, str):
        raise UsageError(f"{path}: via must be a string such as \"docker exec -i NAME\", "
                         f"not {file_via!r}")
    if file_via is not None and via is None:
        try:
            via_argv(file_via)  # an unusable via is refused before any pass
        except UsageError as exc:
            raise UsageError(f"{path}: via: {exc.message}") from None
    base = path.parent.absolute()
    via = file_via if via is None else via
    # With via every REMOTE is a path on the far side; without, a local one is ours.
    config = Config([r if via is not None else _remote(r, base, env) for r in remotes], via=via)
    tables = raw.get("mapping", [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise UsageError(f"{path}: mapping must be [[mapping]] tables, not {tables!r}")
    for i, entry in enumerate(tables):
        where = f"mapping {i + 1}"
        _known(path, where + ": ", entry, _MAPPING_KEYS)
        for key in ("local", "remote"):
            if key not in entry:
                raise UsageError(f"{path}: {where} lacks {key!r}; set local and remote")
        for key in ("local", "remote", "mode"):
            if key in entry and not isinstance(entry[key], str):
                raise UsageError(f"{path}: {where}: {key} must be a string, "
                                 f"not {entry[key]!r}")
        exclude = entry.get("exclude", [])
        if not isinstance(exclude, list) or not all(isinstance(p, str) for p in exclude):
            raise UsageError(f"{path}: {where}: exclude must be a list of pattern strings, "
                             f"not {exclude!r}")
        local = os.path.join(base, expand_user(entry["local"], env))
        try:
            mapping = Mapping(local, entry["remote"], entry.get("mode", TWO_WAY))
        except ValueError as exc:
            raise UsageError(f"{path}: {where}: {exc}") from None
        config.mappings.append(MappingSpec(mapping, tuple(exclude)))
    if not config.mappings:
        raise UsageError(f"{path}: no [[mapping]] tables; add at least one")
    return config


def _known(path: Path, where: str, table: dict[str, object], keys: tuple[str, ...]) -> None:
    unknown = sorted(set(table) - set(keys))
    if unknown:
        raise UsageError(f"{path}: {where}unknown key {unknown[0]!r}; the keys are "
                         f"{', '.join(keys)} (see docs/config.md)")


def _remote(text: str, base: Path, env: collections.abc.Mapping[str, str] | None) -> str:
    """A REMOTE of the file; a relative local path is made relative to the file's dir."""
    if text and parse_remote(text).kind == "local" and not text.startswith("file://"):
        return os.path.join(base, expand_user(text, env))
    return text
