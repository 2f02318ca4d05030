"""The endpoint contract: what a pass may ask of the remote tree, and what each call promises.

Two endpoints implement it, without inheritance between them:
``filesync.endpoint.helper.HelperEndpoint`` (the python helper of ``filesync.tree``, run on
the remote) and ``filesync.endpoint.posix.PosixEndpoint`` (``sh``, ``find`` and ``tar``,
for a remote without python3). ``tests/endpoint/test_contract.py`` runs one suite against
both over a real sshd.

Common guarantees of every method that takes a ``root``:

- ``root`` is absolute, as ``resolve_root`` returned it; nothing outside it is read,
  written or created, whatever the remote does meanwhile (symlinks swapped in, directories
  renamed): a path that would leave it is refused with a safety reason code;
- a name that ``filesync.tree.paths.unsafe_reason`` refuses is never opened;
- a method either completes, or raises ``TransportError`` (``ConnectionLost`` when the
  connection dropped); a raised call may have done part of its work, but never half of a
  file: every file is old or new.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple, Protocol

from filesync.core.exclude import ExcludeRule
from filesync.core.model import Entry, Listing
from filesync.errors import FilesyncError
from filesync.tree.wire import Reason, Status


class SendItem(NamedTuple):
    """One file to upload. ``expect`` is the remote (size, mtime_ns) it may replace.

    ``SendItem``, ``Outcome`` and ``FetchHeader`` are named tuples, not dataclasses: every
    run imports this module, and creating a dataclass compiles its methods from source
    (~0.7 ms of CPU each); a transfer makes one per file."""

    path: str
    mode: int
    mtime_ns: int
    expect: tuple[int, int] | None
    chunks: Callable[[], Iterator[bytes]]  # may raise to abort this one file


class Outcome(NamedTuple):
    """What the remote did with one file: ``Status.OK``, ``CHANGED`` or ``ERROR``.

    ``size``/``mtime_ns`` are what the remote stored (``ok`` of a send); ``code`` says why
    a file was not done, ``reason`` in words (derived from the code, with the OS detail).
    """

    path: str
    status: Status
    size: int = 0
    mtime_ns: int = 0
    reason: str = ""
    #: what the decision is taken on (``reason`` is its human text, for reports)
    code: Reason | None = None


class FetchHeader(NamedTuple):
    """A fetched file as the remote saw it when it opened it."""

    path: str
    size: int
    mtime_ns: int
    mode: int


class FetchSink(Protocol):
    """Receives fetched files, one at a time, in the order the remote sends them."""

    def begin(self, head: FetchHeader) -> Callable[[bytes], None]:
        """A new file starts; returns the writer its bytes are passed to, in order."""

    def end(self, head: FetchHeader, ok: bool, reason: str) -> None:
        """The file ended: ``ok`` if it was read whole and unchanged, else ``reason``."""

    def failed(self, path: str, reason: str) -> None:
        """``path`` could not be sent at all (vanished, refused, unreadable)."""


class Endpoint(Protocol):
    """The remote tree of one connection, serving any number of roots."""

    #: Keep listed roots current between listings (inotify), for sessions that outlive
    #: one pass; an endpoint that cannot watch lists afresh, with the same results.
    watch: bool
    #: Set once the stream can no longer be trusted; ``close`` then ends it at once.
    broken: bool

    def resolve_root(self, path: str) -> str:
        """The absolute, normalized root for ``path`` as the user wrote it (``~``,
        ``~/x``, relative to the remote's working directory, or absolute). Pure: no I/O."""

    async def prefetch_list(self, root: str, rule: ExcludeRule) -> None:
        """Ask for ``list_tree(root, rule)`` ahead, so the remote walks while the caller
        works; the next ``list_tree`` with the same arguments reads it. May do nothing."""

    async def list_tree(self, root: str, rule: ExcludeRule) -> Listing:
        """The regular files under ``root``, as fresh as the walk that made them.

        Excluded directories are pruned before they are read; symlinks, special files,
        remote hard links and unsafe names come back in ``skipped`` with their reason,
        never in ``entries``; a missing root lists as ``exists=False``. Stale temp files
        of dead filesync runs are removed.
        """

    async def list_tree_unless(self, root: str, rule: ExcludeRule, known: str) -> Listing | None:
        """``list_tree(root, rule)``, or None only if that listing would equal, field by
        field and in order, the listing this endpoint once returned with ``digest ==
        known``. An endpoint that takes no digests always lists (with ``digest=""``)."""

    async def seal_digest(self, root: str, rule: ExcludeRule) -> str:
        """The ``digest`` a later ``list_tree(root, rule)`` on a new endpoint would have,
        provided the root is then exactly as this endpoint's last listing of it left it
        plus what this endpoint's ``send`` and ``delete`` made of it since; ``""`` if it is
        not so now (or the endpoint cannot tell). Lets a pass that changed only this side
        seal the pair as it left it (``filesync.sync.seal``)."""

    async def fetch(self, root: str, paths: Sequence[str], sink: FetchSink) -> None:
        """Stream each of ``paths`` into ``sink``: ``begin``/``end`` per file sent,
        ``failed`` per file that could not be. A file that changed while it was read
        ends with ``ok=False``. Only the asked paths, each at most once."""

    async def send(self, root: str, items: Iterable[SendItem],
                   count: int | None = None) -> list[Outcome]:
        """Upload ``items`` (``count`` of them, if they come from a generator); one
        ``Outcome`` per item, in order.

        Each file is written to a temp name inside the root, fsynced, given its mode and
        mtime, and renamed over its target only if the target still has the ``expect``ed
        size and mtime (absent when ``expect`` is None); otherwise ``changed``, target
        untouched. Missing parent directories are created; existing ones are never
        chmodded. No temp file is left behind, inside the root or outside it. The root is
        created if missing, also by an empty send (which writes nothing else).
        """

    async def delete(self, root: str, files: Sequence[Entry]) -> list[Outcome]:
        """Unlink each file if it is still as listed (size, mtime), else ``changed``;
        directories a deletion leaves empty are removed, never the root. One ``Outcome``
        per regular file of ``files``, in order."""

    async def any_exists(self, paths: Sequence[str]) -> bool:
        """Whether any of the absolute ``paths`` exists on the remote, symlinks followed.
        May run while a ``prefetch_list`` reply is pending, as long as nothing else is
        asked of the endpoint until it returns (the self-sync check does)."""

    async def close(self) -> None:
        """End the remote side and wait for it; never raises. A broken endpoint is
        killed at once; a polite one is asked to exit, and killed if it does not."""


def call_sink(fn: Callable[..., Any], *args: Any, path: str = "") -> Any:
    """Run a ``FetchSink`` call; a host-side write failure (disk full) ends the run cleanly
    with a ``FilesyncError``, as both endpoints promise."""
    try:
        return fn(*args)
    except OSError as exc:
        what = path or getattr(args[0], "path", "") if args else path
        raise FilesyncError(
            f"cannot stage {what!r} on the host: {exc.strerror or exc}; free space in the "
            "state dir (or pass --state-dir) and rerun, nothing was applied"
        ) from exc
