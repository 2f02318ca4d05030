"""The bulk "in sync" filters (``filesync.core.quiet``) agree with ``decide()``.

Hypothesis builds rows over every combination of small field domains: an ancestor, the
remote's listed row, the host's hash and permission bits. The versions ``decide()`` is
given are those a pass gives it: the ancestor's ``(hash, mode)``; the host's hash and
listed permission bits; the remote's listed permission bits with the ancestor's hash when
its stat is trusted (size and mtime as the last transfer left them, outside the racy
window), else another hash. A filter that says "in sync" must be exactly where
``decide()`` has nothing to do in a sync, and nothing to do in every direction.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from filesync.core.model import Entry
from filesync.core.quiet import quiet_paths, unchanged_remote
from filesync.core.reconcile import Direction, Version, decide
from filesync.host.state import Ancestor

RACY_NS = 10
HASHES = ["h1", "h2"]
MODES = [0o644, 0o600]

ancestors = st.builds(
    Ancestor, hash=st.sampled_from(HASHES), size=st.integers(0, 1),
    mode=st.sampled_from(MODES), remote_size=st.integers(0, 1),
    remote_mtime_ns=st.integers(0, 2), synced_ns=st.sampled_from([0, 5, 12, 13, 20]),
)
listed = st.builds(
    lambda size, mtime, mode: Entry("p", "f", size, mtime, 0o100000 | mode, 0),
    st.integers(0, 1), st.integers(0, 2), st.sampled_from(MODES),
)
rows = st.dictionaries(
    st.sampled_from(["a", "b", "d/c", "d/e"]),
    st.tuples(ancestors, listed, st.sampled_from(HASHES), st.sampled_from(MODES)),
)


def stat_trusted(a: Ancestor, e: Entry) -> bool:
    return (e.size, e.mtime_ns) == (a.remote_size, a.remote_mtime_ns) \
        and a.remote_mtime_ns < a.synced_ns - RACY_NS


def versions(a: Ancestor, e: Entry, host_hash: str, host_mode: int) -> tuple[
        Version, Version, Version]:
    """The (ancestor, host, remote) versions a pass would give ``decide()`` for a row."""
    other = next(h for h in HASHES if h != a.hash)
    remote_hash = a.hash if stat_trusted(a, e) else other
    return (Version(a.hash, a.mode), Version(host_hash, host_mode),
            Version(remote_hash, e.mode & 0o777))


Table = dict[str, tuple[Ancestor, Entry, str, int]]
Sides = tuple[dict[str, Ancestor], dict[str, Entry], dict[str, str], dict[str, Entry]]


def sides(table: Table) -> Sides:
    """The ancestors, the remote listing, the host hashes and the host listing of rows."""
    anc = {p: a for p, (a, _, _, _) in table.items()}
    rfiles = {p: e._replace(path=p) for p, (_, e, _, _) in table.items()}
    hashes = {p: h for p, (_, _, h, _) in table.items()}
    host = {p: Entry(p, "f", 1, 1, 0o100000 | m, 1) for p, (_, _, _, m) in table.items()}
    return anc, rfiles, hashes, host


@given(rows)
def test_the_filters_hold_exactly_where_decide_has_nothing_to_do(table: Table) -> None:
    anc, rfiles, hashes, host = sides(table)
    same = unchanged_remote(anc, rfiles, RACY_NS)
    quiet = quiet_paths(anc, hashes, host, rfiles, same)
    assert quiet <= same
    for p, (a, e, host_hash, host_mode) in table.items():
        av, lv, rv = versions(a, e, host_hash, host_mode)
        # unchanged on the remote: the remote's version is the ancestor's
        assert (p in same) == (stat_trusted(a, e) and rv == av), p
        # quiet: nothing to do, in every direction
        if p in quiet:
            assert all(decide(av, lv, rv, d) is None for d in Direction), p
        # and every path whose three versions agree, as far as the stat tells, is quiet
        assert (p in quiet) == (stat_trusted(a, e) and decide(av, lv, rv, Direction.SYNC)
                                is None), p


@given(rows)
def test_the_listing_order_does_not_change_the_answer(table: Table) -> None:
    anc, rfiles, hashes, host = sides(table)
    same = unchanged_remote(anc, rfiles, RACY_NS)
    backwards = dict(reversed(rfiles.items()))
    assert unchanged_remote(anc, backwards, RACY_NS) == same
    # ``same`` may hold paths the listing lacks: the filter then reads ``same`` itself
    assert quiet_paths(anc, hashes, host, {}, same) \
        == quiet_paths(anc, hashes, host, backwards, same)
