"""The seal: a pass that found nothing to do is not repeated on the same listings.

A pass that finds the pair in sync on all three sides records a ``Seal``
(``filesync.host.state``): the digests of the host walk and of the remote listing it
compared (``Listing.digest``), and a fingerprint of everything else its decisions read
(the direction, the exclusion rule, the size limit, filesync's version). It records one
only when nothing stands between those listings and "in sync":

- every path is quiet (``Planned.in_sync``: host, remote and ancestor agree, and no path
  is only on one side), nothing is skipped, no conflict is open, nothing failed;
- no host file's mtime is within ``RACY_NS`` of the walk's start (the remote files'
  are not either: a quiet remote file passed the same test against its ancestor);
- the pass is not a dry run, nor a watched or fan-out pass (those have their own paths).

A later pass whose fingerprint and both listings' digests are the sealed ones, with
nothing written to the state since (every write drops the seal), has the inputs the
sealed pass had: its decisions would be the same, nothing to do. So it reads neither
the state's tables nor the remote listing's rows and plans nothing.

A pass that changed only the remote seals the pair as it left it (``seal_for``), so the
first pass after a push is as cheap as any later one. It does so only when carrying out
its plan leaves every path quiet on all three sides:

- every path was quiet or had an action (``Planned.all_acted``), every action was an
  upload, a remote deletion or a forgotten ancestor (none touches the host tree), and
  every one succeeded (``clean``); the host-side conditions above hold as well;
- the remote is exactly as its listing plus those uploads and deletions: its helper
  walks it again after them and compares every row (``Endpoint.seal_digest``), and the
  seal's remote digest is that of the listing a new helper would send of that walk. The
  walk is asked as soon as the remote is changed (``asks_remote`` decides before the
  transition whether a clean end would need it), so that it runs while the host side
  records the pass; a pass that does not end clean discards it.

Then a later pass matching the seal has the host this pass walked, the remote as this
pass left it, and the state this pass wrote: the inputs of a pass that finds nothing to
do. Any change on either side since breaks a digest, and the pass compares in full.

The engine runs the seal as named steps of a pass: ``check`` after the host's recovery
and before the scan, ``asks_remote`` before the transition, ``seal_for`` once the pass
is done.
A file is taken as unchanged when its size, mtime, permission bits and inode are, as the
stat cache and the per-file quiet test take it.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable
from dataclasses import dataclass

from filesync.core.model import Listing
from filesync.core.reconcile import Direction, Kind
from filesync.host.scan import RACY_NS
from filesync.host.state import Seal
from filesync.sync.inputs import Options, PassInputs, Planned, Scans
from filesync.sync.plan import Walk
from filesync.version import __version__


@dataclass(frozen=True)
class Sealed:
    """Both listings are those of the pass that sealed the pair."""

    #: what that pass reported excluded
    excluded: int


def fingerprint(opts: Options, direction: Direction | None = None) -> str:
    """What a pass's decisions read besides the listings and the state (``direction``:
    instead of the pass's own)."""
    return json.dumps([__version__, (direction or opts.direction).value, opts.rule.wire(),
                       opts.max_file_size], sort_keys=True)


def host_digest(inputs: PassInputs) -> str | None:
    """The host walk digest of the pair's seal, if the seal may speak for this pass's host
    side (None: no seal, or one this pass may not use), for ``plan.scan``.

    A pass whose host walk has that digest has the host tree the sealing pass walked
    (every row: path, size, mtime, mode, inode, links), and the sealing pass left every
    host file's hash equal to its ancestor's, and the stat cache holding that hash for it
    (none was within ``RACY_NS`` of its walk, so every one was cached). Nothing was
    written to the state since (every write drops the seal). So the stat cache would give
    each host file its ancestor's hash again, and none would be read: the host side is
    the ancestors', whatever the remote did since. Only the direction may differ from the
    sealing pass's: host hashes do not depend on it (a teardown pull after a push)."""
    seal = inputs.state.seal() if may_use(inputs) else None
    if seal is None or not any(seal.fingerprint == fingerprint(inputs.opts, d)
                               for d in Direction):
        return None
    return seal.host


def may_use(inputs: PassInputs) -> bool:
    """Whether a pass may seal, or skip its work on a seal: not one listed through watched
    trees, nor one sharing its host scans with a fan-out."""
    return inputs.trees is None and inputs.host_scans is None


async def check(inputs: PassInputs, walk: Walk | None) -> Sealed | Listing | None:
    """The seal step before the scan: ``Sealed`` when the pair's seal holds for this pass
    (same fingerprint, same host walk, same remote listing); else the remote listing it
    read to find out, or None when it read none (no seal, another fingerprint, another
    host walk, or a pass that may not use the seal: ``walk`` None or ``may_use``)."""
    opts = inputs.opts
    seal = inputs.state.seal() if walk is not None and may_use(inputs) else None
    # The host walk (done long before the remote's listing, usually) decides whether
    # the listing is worth comparing before it is decoded.
    if walk is None or seal is None or seal.fingerprint != fingerprint(opts) \
            or (await walk.listing).digest != seal.host:
        return None
    remote = await inputs.endpoint.list_tree_unless(inputs.remote_root, opts.rule, seal.remote)
    if remote is not None:
        return remote
    if opts.log is not None:
        opts.log("both listings are as the last pass found them in sync: nothing to compare")
    return Sealed(seal.excluded)


#: The actions that leave the host tree as it was walked.
REMOTE_ONLY = frozenset({Kind.UPLOAD, Kind.DELETE_REMOTE, Kind.FORGET})


def _may_seal(inputs: PassInputs, scans: Scans) -> bool:
    """The conditions on the pass and its host walk (see the module doc)."""
    host = scans.local.listing
    if not (may_use(inputs) and not inputs.opts.dry_run and host.digest and host.entries):
        return False
    newest = max(e.mtime_ns for e in host.entries.values())
    return newest < scans.local.started_ns - RACY_NS


def asks_remote(inputs: PassInputs, scans: Scans, planned: Planned, *,
                whole_plan: bool = True) -> bool:
    """Whether this pass, if it ends clean, seals with the helper's walk
    (``Endpoint.seal_digest``): its plan changes only the remote, and every condition on
    the pass and its host walk holds. Known before the transition, so that the engine
    can ask the walk as soon as the remote is changed (``transition``'s ``remote_done``)."""
    return (not planned.in_sync and whole_plan and planned.all_acted
            and all(a.kind in REMOTE_ONLY and a.then is None for a in planned.actions)
            and _may_seal(inputs, scans))


async def seal_for(inputs: PassInputs, scans: Scans, planned: Planned, clean: bool, *,
                   asked: Awaitable[str] | None = None) -> Seal | None:
    """The seal a finished pass leaves, or None when it may not leave one (see the module
    doc). ``clean``: the pass skipped nothing, failed nothing, and no conflict is open;
    ``asked``: the helper's digest (``Endpoint.seal_digest``), asked once the remote was
    changed where ``asks_remote`` held before the transition (the caller awaits it if
    this does not); a pass that changed the remote and asked none leaves no seal."""
    if not clean:
        return None
    if asked is not None:
        remote_digest = await asked
    elif planned.in_sync and _may_seal(inputs, scans):
        remote_digest = scans.remote.digest
    else:
        return None
    if not remote_digest:
        return None
    return Seal(fingerprint(inputs.opts), scans.local.listing.digest, remote_digest,
                scans.excluded)


__all__ = ["REMOTE_ONLY", "Sealed", "asks_remote", "check", "fingerprint", "host_digest",
           "may_use", "seal_for"]
