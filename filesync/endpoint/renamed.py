"""A single file synced under another name on the remote: the one place paths are renamed.

A single-file pass walks the file's parent directory on each side with a rule admitting one
name. When the remote names the file differently (``Mapping("~/.secrets/gh-v2.json",
".agent/gh_token.json")``, or a symlinked credential mounted under the link's name), the
pass sees the remote through :class:`RenamedEndpoint`, which speaks the host's name to the
engine and the remote's name to the remote.

Guarantees:

- the engine only ever sees the host name: listings, fetch headers and outcomes carry it
  in place of the remote name, so state, plan, conflicts and reports are the host's;
- the remote is listed with the remote rule (admitting only the remote name), and only a
  regular file of exactly that name is listed: anything else of the parent directory is
  dropped, never synced; a directory of that name is refused (``BadMapping``) before any
  change;
- every path sent to the remote is the remote name: no other file of the remote parent is
  read, written or deleted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from filesync.core.exclude import ExcludeRule
from filesync.core.model import Entry, Listing
from filesync.endpoint.contract import Endpoint, FetchHeader, FetchSink, Outcome, SendItem
from filesync.errors import BadMapping


@dataclass(frozen=True)
class Rename:
    """The host name ``local`` is ``remote`` on the remote; ``rule`` is the remote side's
    rule (it admits only ``remote``), the pass's own rule admitting only ``local``."""

    local: str
    remote: str
    rule: ExcludeRule
    #: what errors name the mapping by (``mapping LOCAL -> REMOTE``)
    label: str = ""


class RenamedEndpoint:
    """``inner`` as the engine sees it when the pass's one file has another remote name."""

    def __init__(self, inner: Endpoint, rename: Rename) -> None:
        self._inner = inner
        self._rename = rename

    @property
    def watch(self) -> bool:
        return self._inner.watch

    @watch.setter
    def watch(self, value: bool) -> None:
        self._inner.watch = value

    @property
    def broken(self) -> bool:
        return self._inner.broken

    @broken.setter
    def broken(self, value: bool) -> None:
        self._inner.broken = value

    def resolve_root(self, path: str) -> str:
        return self._inner.resolve_root(path)

    async def prefetch_list(self, root: str, rule: ExcludeRule) -> None:
        await self._inner.prefetch_list(root, self._rename.rule)

    async def list_tree(self, root: str, rule: ExcludeRule) -> Listing:
        return self._listing(await self._inner.list_tree(root, self._rename.rule))

    async def list_tree_unless(self, root: str, rule: ExcludeRule, known: str) -> Listing | None:
        listing = await self._inner.list_tree_unless(root, self._rename.rule, known)
        return None if listing is None else self._listing(listing)

    async def seal_digest(self, root: str, rule: ExcludeRule) -> str:
        return await self._inner.seal_digest(root, self._rename.rule)

    async def fetch(self, root: str, paths: Sequence[str], sink: FetchSink) -> None:
        await self._inner.fetch(root, [self._out(p) for p in paths], _Sink(sink, self._in))

    async def send(self, root: str, items: Iterable[SendItem],
                   count: int | None = None) -> list[Outcome]:
        out = (item._replace(path=self._out(item.path)) for item in items)
        return [o._replace(path=self._in(o.path)) for o in
                await self._inner.send(root, out, count)]

    async def delete(self, root: str, files: Sequence[Entry]) -> list[Outcome]:
        out = [f._replace(path=self._out(f.path)) for f in files]
        return [o._replace(path=self._in(o.path)) for o in
                await self._inner.delete(root, out)]

    async def any_exists(self, paths: Sequence[str]) -> bool:
        return await self._inner.any_exists(paths)

    async def close(self) -> None:
        await self._inner.close()

    # -- the renaming ---------------------------------------------------------------

    def _out(self, path: str) -> str:
        if path != self._rename.local:
            # The plan is cut to the one name: another path here is a bug, never a write.
            raise BadMapping(f"single-file pass asked for {path!r}, not its file "
                             f"{self._rename.local!r}")
        return self._rename.remote

    def _in(self, path: str) -> str:
        return self._rename.local if path == self._rename.remote else path

    def _listing(self, listing: Listing) -> Listing:
        name = self._rename.remote
        if any(p.startswith(name + "/") for p in listing.entries) or any(
                s.path.startswith(name + "/") for s in listing.skipped):
            where = f"{self._rename.label}: " if self._rename.label else ""
            raise BadMapping(f"{where}the remote {listing.root}/{name} is a directory; give "
                             f"the file's full remote path ({name}/{self._rename.local}), or "
                             "end the remote path with / to put the file inside it")
        entries: dict[str, Entry] = {}
        found = listing.entries.get(name)
        if found is not None:
            entries[self._rename.local] = found._replace(path=self._rename.local)
        skipped = [s._replace(path=self._rename.local) for s in listing.skipped
                   if s.path == name]
        return Listing(listing.root, listing.exists, entries, skipped, listing.excluded,
                       listing.digest)


class _Sink:
    """``sink`` fed with host names."""

    def __init__(self, sink: FetchSink, to_host: Callable[[str], str]) -> None:
        self._sink = sink
        self._to_host = to_host

    def _head(self, head: FetchHeader) -> FetchHeader:
        return head._replace(path=self._to_host(head.path))

    def begin(self, head: FetchHeader) -> Callable[[bytes], None]:
        return self._sink.begin(self._head(head))

    def end(self, head: FetchHeader, ok: bool, reason: str) -> None:
        self._sink.end(self._head(head), ok, reason)

    def failed(self, path: str, reason: str) -> None:
        self._sink.failed(self._to_host(path), reason)
