"""From the mappings of one session call to the passes that carry it out.

Guarantees:

- one pass per mapping, in the order given; ``pull`` leaves upload-only mappings out,
  ``sync`` and ``status`` push them (an upload-only mapping is never written back);
- nested mappings: the innermost owns a path (``filesync.mapping.nested_excludes``, fed
  with remote roots resolved as the remote helper resolves them), upload-only inner
  mappings included, so an outer two-way pull never brings an inner credential back;
- a single-file mapping is a pass over the file's parent directory whose rule admits only
  that one name (and whose plan is cut to it), with its own state under
  ``STATE_DIR/files/``: it never lists, changes or deletes another file of either parent,
  and it shares no ancestor, lock or journal with a directory mapping of the same parent.
  The remote may name it differently (``filesync.endpoint.renamed``: the one place a
  path is renamed); a remote path ending in ``/`` (or the remote base itself) puts it
  inside that directory under the host name, as ``cp`` does;
- a single file that is a symlink syncs its target's bytes (as ``cp`` does) under the
  link's name on the remote; a two-way pull writes the target, atomically, and never the
  link; directory walks still skip symlinks;
- a mapping that cannot be planned is refused with a ``BadMapping`` naming it; with
  ``failed`` given, it is recorded there and the other mappings are still planned.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from filesync.core.exclude import ExcludeRule
from filesync.core.reconcile import Action, Direction
from filesync.endpoint.contract import Endpoint
from filesync.endpoint.renamed import Rename
from filesync.errors import BadMapping, FilesyncError, UsageError
from filesync.host.state import default_state_dir
from filesync.mapping import UPLOAD_ONLY, Mapping, literal_pattern, nested_excludes


class Call(Enum):
    """What a session call does."""

    PUSH = "push"
    PULL = "pull"
    SYNC = "sync"
    STATUS = "status"


@dataclass(frozen=True)
class Rules:
    """The session-wide exclusion settings."""

    exclude: tuple[str, ...]
    default_excludes: bool


@dataclass(frozen=True)
class PassSpec:
    """One pass of one mapping."""

    mapping: Mapping
    direction: Direction
    local_root: Path  # the directory the pass walks: the mapping's, or a file's parent
    remote_path: str  # the remote root as written, joined to the session's base
    remote_root: str  # ``remote_path`` resolved by the remote helper (absolute)
    name: str | None  # a single-file mapping's file name (on the host)
    rule: ExcludeRule
    state_dir: Path
    rename: Rename | None = None  # a single file named otherwise on the remote

    def plan_filter(self) -> Callable[[list[Action]], list[Action]] | None:
        """For a single file, the plan cut to that file (the rule already admits only it;
        this keeps the promise even if a listing brought something else)."""
        name = self.name
        if name is None:
            return None
        return lambda plan: [a for a in plan if a.path == name]


def as_list(mappings: Mapping | Sequence[Mapping]) -> list[Mapping]:
    """The call's mappings as a list; refuses anything that is not a ``Mapping``."""
    items = [mappings] if isinstance(mappings, Mapping) else list(mappings)
    for m in items:
        if not isinstance(m, Mapping):
            raise UsageError(f"{m!r} is not a filesync.Mapping; pass Mapping(local, remote)")
    return items


def join_remote(base: str, remote: str) -> str:
    """A mapping's remote path on the session's remote: relative paths go under ``base``."""
    if remote.startswith(("/", "~")) or base in ("", "."):
        return remote
    return posixpath.join(base, remote)


def direction_of(call: Call, mapping: Mapping) -> Direction | None:
    """The pass direction of ``mapping`` in ``call``; None: the mapping is left out."""
    if mapping.mode == UPLOAD_ONLY:
        return None if call is Call.PULL else Direction.PUSH
    return {Call.PUSH: Direction.PUSH, Call.PULL: Direction.PULL}.get(call, Direction.SYNC)


async def plan_passes(
    call: Call,
    mappings: list[Mapping],
    endpoint: Endpoint,
    base: str,
    rules: Rules,
    state_dir: Path,
    *,
    labels: Sequence[str] | None = None,
    failed: list[tuple[Mapping, FilesyncError]] | None = None,
) -> list[PassSpec]:
    """The passes of ``call``; raises ``BadMapping`` before any pass runs.

    ``labels``: one per mapping, what an invalid pattern of that mapping's own
    ``exclude`` is named by in the ``PatternError`` (a config file's mapping); without
    them every pattern is named ``--exclude``. ``failed``: where a mapping that cannot be
    planned goes (with its ``BadMapping``) instead of raising, so the others still run.
    """
    if labels is not None and len(labels) != len(mappings):
        raise ValueError("plan_passes: give one label per mapping")
    out: list[PassSpec] = []
    for i, m in enumerate(mappings):
        direction = direction_of(call, m)
        if direction is None:
            continue
        label = None if labels is None else labels[i]
        try:
            out.append(await _plan_one(m, direction, mappings, endpoint, base, rules,
                                       state_dir, label))
        except BadMapping as exc:
            if failed is None:
                raise
            failed.append((m, exc))
    return out


async def _plan_one(m: Mapping, direction: Direction, mappings: list[Mapping],
                    endpoint: Endpoint, base: str, rules: Rules, state_dir: Path,
                    label: str | None) -> PassSpec:
    def resolved(remote: str) -> str:
        return endpoint.resolve_root(join_remote(base, remote))

    remote_path = join_remote(base, m.remote)
    remote_root = endpoint.resolve_root(remote_path)
    local = _local_path(m)
    own: list[tuple[str, list[str]]] = []
    patterns = [*rules.exclude, *m.exclude]
    if label is not None:
        patterns, own = [*rules.exclude], [(label, list(m.exclude))]
    if await _is_file(m, local, remote_root, endpoint):
        # The remote name: the one written, or the host's (the link's, for a symlink)
        # when the remote path names a directory to put it in.
        shown = os.path.basename(os.path.normpath(m.local))
        if _names_directory(m.remote):
            remote_path = posixpath.join(remote_path, shown)
            remote_root = endpoint.resolve_root(remote_path)
        name, rname = local.name, posixpath.basename(remote_root)
        if not rname:
            raise _bad(m, "the remote path names no file; give the file's remote path")
        rule = _build(["/*", "!" + literal_pattern(name), *patterns], rules, None, own)
        rename = None
        if rname != name:
            rename = Rename(name, rname, _build(["/*", "!" + literal_pattern(rname),
                                                 *patterns], rules, None, own), _label(m))
        # Keyed by the names the mapping is written with (a link's, not its target's), so
        # two mappings of one file under two remote names keep apart.
        keyed = shown if shown == rname else f"{shown}\0{rname}"
        key = hashlib.sha256(keyed.encode("utf-8", "surrogateescape")).hexdigest()[:16]
        parent = posixpath.dirname(remote_path) or "."
        return PassSpec(m, direction, local.parent, parent, posixpath.dirname(remote_root),
                        name, rule, state_dir / "files" / key, rename)
    nested = nested_excludes(m, mappings, remote_root=resolved)
    if label is not None:
        own.append((f"{label} (a nested mapping's root)", nested))
        nested = []
    rule = _build([*patterns, *nested], rules, local, own)
    return PassSpec(m, direction, local, remote_path, remote_root, None, rule, state_dir)


def _label(m: Mapping) -> str:
    return f"mapping {m.local} -> {m.remote}"


def _bad(m: Mapping, why: str) -> BadMapping:
    return BadMapping(f"{_label(m)}: {why}")


def _names_directory(remote: str) -> bool:
    """Whether a single file's remote path names the directory to put it in, as ``cp``
    reads ``host:dir/``: a trailing ``/``, or the remote base itself."""
    return remote in ("", ".", "~") or remote.endswith("/")


def _local_path(m: Mapping) -> Path:
    """The mapping's local path with its parents resolved; the last part is resolved too
    when it is a directory (as the CLI does), or a symlink to a regular file: the target
    is what is synced (the walk never follows a symlink itself)."""
    path = Path(os.path.abspath(m.local))
    if path.is_symlink() and not path.is_dir():
        target = path.resolve()
        if not target.exists():
            raise _bad(m, f"{m.local} is a symlink to {target}, which does not exist; "
                          "fix the link or map the file itself")
        if not target.is_file():
            raise _bad(m, f"{m.local} is a symlink to {target}, not a regular file; map a "
                          "directory or a file")
        return target
    return path.resolve() if path.is_dir() else path.parent.resolve() / path.name


def _build(patterns: list[str], rules: Rules, root: Path | None,
           more: list[tuple[str, list[str]]]) -> ExcludeRule:
    try:
        return ExcludeRule.build(patterns, default_excludes=rules.default_excludes, root=root,
                                 more=more)
    except (ValueError, TypeError) as exc:
        raise UsageError(f"bad exclude pattern ({exc}); use gitignore syntax") from None


async def _is_file(m: Mapping, local: Path, remote_root: str, endpoint: Endpoint) -> bool:
    """Whether the mapping names a single file: the local side says so when it exists
    (a directory or a regular file), else the remote side does."""
    if local.is_dir():
        return False
    if local.exists():
        if not local.is_file():
            raise _bad(m, f"{local} is neither a directory nor a regular file; map a "
                          "directory or a file")
        return True
    name = posixpath.basename(remote_root)
    if not name or _names_directory(m.remote):
        return False
    only = ExcludeRule.build(["/*", "!" + literal_pattern(name)], default_excludes=False)
    listing = await endpoint.list_tree(posixpath.dirname(remote_root), only)
    return name in listing.files()


def state_dir_of(path: str | os.PathLike[str] | None) -> Path:
    """The state dir: the given one with ``~`` expanded, else the CLI's default."""
    if path is None:
        return default_state_dir()
    return Path(os.path.expanduser(os.fspath(path)))
