"""``filesync.toml``: several remotes and several mappings, synced over one connection each.

Example::

    remotes = ["devbox:", "ssh://ci@build:2222/"]   # REMOTE forms; the path part is a base
    # via = "docker exec -i web"                     # instead of SSH, a command transport

    [[mapping]]
    local = "~/.hermes/skills"
    remote = ".hermes/skills"         # relative to the remote home (or the base path)
    mode = "two-way"                  # or "upload-only": pushed, never written back
    exclude = ["*.bak"]

A remote file belongs to the mapping with the longest remote root that contains it:
an outer mapping's pass excludes the roots of the mappings nested inside it.
"""

from __future__ import annotations

import posixpath
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from filesync.errors import UsageError
from filesync.mapping import Mapping
from filesync.transport.target import Target, parse_remote


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
        """Anchored patterns for the roots of other mappings nested inside ``spec``'s."""
        root = posixpath.normpath(spec.mapping.remote)
        out = []
        for other in self.mappings:
            inner = posixpath.normpath(other.mapping.remote)
            if other is not spec and inner.startswith(root.rstrip("/") + "/"):
                # Escaped: a root's name is taken literally, never as a glob.
                out.append("/" + re.sub(r"([\\*?\[])", r"\\\1", inner[len(root) + 1 :]) + "/")
        return out


def load_config(path: Path) -> Config:
    """Read and check a config file; raise ``UsageError`` naming what to fix."""
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"config file {path} does not exist; check the --config path") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"config file {path} is not valid TOML ({exc}); fix it") from None
    remotes = raw.get("remotes") or ([raw["remote"]] if "remote" in raw else [])
    if not isinstance(remotes, list) or not remotes or not all(isinstance(r, str) for r in remotes):
        raise UsageError(f"{path}: set remotes = [\"host:\", ...] (at least one REMOTE)")
    config = Config([str(r) for r in remotes], via=raw.get("via"))
    for i, entry in enumerate(raw.get("mapping", [])):
        try:
            mapping = Mapping(str(entry["local"]), str(entry["remote"]),
                              str(entry.get("mode", "two-way")))
        except KeyError as exc:
            raise UsageError(
                f"{path}: mapping {i + 1} lacks {exc}; set local and remote"
            ) from None
        except ValueError as exc:
            raise UsageError(f"{path}: mapping {i + 1}: {exc}") from None
        exclude = entry.get("exclude", [])
        if not isinstance(exclude, list) or not all(isinstance(e, str) for e in exclude):
            raise UsageError(f"{path}: mapping {i + 1}: set exclude = [\"PATTERN\", ...]")
        config.mappings.append(MappingSpec(mapping, tuple(exclude)))
    if not config.mappings:
        raise UsageError(f"{path}: no [[mapping]] tables; add at least one")
    return config
