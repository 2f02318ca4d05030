"""What a pass works from: its options, and the frozen inputs built once per pass.

``run_pass`` builds one ``PassInputs`` (who and where: options, roots, state, endpoint,
staging sink, run id, clock), then one ``Scans`` (what both sides and the ancestor hold)
and one ``Planned`` (what reconcile decided, with the versions it decided on). The
planning and the transition only read these; what they find or do comes back as return
values, which the engine folds into the ``Report``. Nothing is shared through a mutable
object or module state between the steps.

The state, the endpoint and the sink are I/O handles: frozen here means the pass never
swaps them, not that they hold nothing that changes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final

from filesync.core.exclude import ExcludeRule
from filesync.core.model import Listing, Skipped
from filesync.core.reconcile import Action, Direction, Version
from filesync.core.record import FrozenRecord
from filesync.endpoint.contract import Endpoint
from filesync.endpoint.idle import IDLE_TIMEOUT
from filesync.endpoint.renamed import Rename
from filesync.host.retention import KEEP_BYTES, KEEP_RUNS
from filesync.host.scan import LocalScan
from filesync.host.shared_scan import HostScans
from filesync.host.state import Ancestor, PairState, default_state_dir
from filesync.sync.carry import Carry
from filesync.sync.memo import PassMemo
from filesync.sync.progress import Progress
from filesync.sync.staging import StagingSink

if TYPE_CHECKING:
    from filesync.host.watched import WatchedTrees


@dataclass
class Options:
    """How one pass runs. Defaults are the CLI's defaults."""

    direction: Direction
    rule: ExcludeRule = field(default_factory=ExcludeRule.build)
    state_dir: Path = field(default_factory=default_state_dir)
    dry_run: bool = False
    force: bool = False
    lock_timeout: float = 0.0
    #: How the caller raises ``lock_timeout``, named by ``LockBusy``'s message.
    lock_option: str = "pass --lock-timeout SECONDS"
    #: Limits on what a pull or sync fetches from the remote (a push fetches only remote
    #: versions it must keep as conflict copies, whatever their size: never limited).
    max_file_size: int = 1 << 30
    max_pull_bytes: int = 2 << 30
    log: Callable[[str], None] | None = None
    #: Told about every file a limit of the run leaves out (the CLI prints a warning line
    #: on stderr); such files are in the report's ``skipped`` too.
    warn: Callable[[str], None] | None = None
    progress: Progress | None = None
    #: Retention of ``conflicts/`` and ``undo/`` (each): the last ``keep_runs`` runs that
    #: saved something, at most ``keep_bytes``; open conflicts are never dropped.
    keep_runs: int = KEEP_RUNS
    keep_bytes: int = KEEP_BYTES
    #: Seconds a remote that owes bytes may send nothing before the pass stops with
    #: ``RemoteSilent`` (``filesync.endpoint.idle``); > 0.
    idle_timeout: float = IDLE_TIMEOUT
    #: A single-file pass whose file has another name on the remote (the session's
    #: planner sets it): the pass sees the remote through ``RenamedEndpoint``.
    rename: Rename | None = None
    #: The umask of what the pass creates on the host (directories of the tree, the
    #: state's files): None is the process's, as for any program; a number is applied
    #: exactly, whatever the process's (the agent passes each client's).
    umask: int | None = None


class PassInputs(FrozenRecord):
    """Who and where: fixed for the whole pass.

    ``PassInputs`` and ``Scans`` are ``FrozenRecord``s, not dataclasses: every run imports
    this module, and creating a dataclass costs ~1 ms of CPU (``filesync.core.record``).
    ``Options`` and ``Planned`` stay dataclasses: callers ``dataclasses.replace`` them."""

    __slots__ = ("endpoint", "host_scans", "local_root", "memo", "now", "opts",
                 "remote_root", "run_id", "sink", "state", "trees")
    _fields = ("opts", "endpoint", "state", "local_root", "remote_root", "run_id", "now",
               "sink", "memo", "trees", "host_scans")

    def __init__(self, opts: Options, endpoint: Endpoint, state: PairState, local_root: Path,
                 remote_root: str, run_id: str, now: int, sink: StagingSink,
                 memo: PassMemo | None = None, trees: WatchedTrees | None = None,
                 host_scans: HostScans | None = None) -> None:
        self.opts: Final = opts
        self.endpoint: Final = endpoint
        self.state: Final = state
        self.local_root: Final = local_root
        self.remote_root: Final = remote_root
        self.run_id: Final = run_id
        #: the pass's clock (ns): the ``synced_ns`` of every ancestor row it writes
        self.now: Final = now
        self.sink: Final = sink
        #: the pair's memo (``sync.memo``), kept by a watching ``WarmState``; None: none
        self.memo: Final = memo
        #: the watched host trees of a watching ``WarmState`` the host is listed through
        self.trees: Final = trees
        #: the host walks, digests and upload reads this pass shares with the other
        #: passes of its run (a fan-out): one ``HostScans`` per run, None for a lone pass
        self.host_scans: Final = host_scans


class Scans(FrozenRecord):
    """Both sides and the ancestor as the pass found them."""

    __slots__ = ("ancestors", "carry", "excluded", "local", "old_cache", "remote", "skipped")
    _fields = ("ancestors", "local", "remote", "old_cache", "excluded", "skipped", "carry")

    def __init__(self, ancestors: Mapping[str, Ancestor], local: LocalScan, remote: Listing,
                 old_cache: Mapping[str, tuple[int, int, int, str]], excluded: int,
                 skipped: tuple[Skipped, ...], carry: Carry | None = None) -> None:
        self.ancestors: Final = ancestors
        self.local: Final = local
        self.remote: Final = remote
        #: the host stat cache as it was read: new rows are written only where they differ
        self.old_cache: Final = old_cache
        self.excluded: Final = excluded
        self.skipped: Final = skipped
        #: what the pair's previous watched pass carried, and what this one carries on
        #: (``sync.carry``); None for a pass whose inputs have no lineages
        self.carry: Final = carry


@dataclass(frozen=True)
class Planned:
    """What reconcile decided, and on which versions."""

    actions: Sequence[Action]
    local_versions: Mapping[str, Version]
    remote_versions: Mapping[str, Version]
    #: paths the full (unfiltered) plan holds in conflict: a ``resolve`` of one path
    #: leaves the others open
    full_conflicts: Set[str]
    #: everything skipped before the transition (scans included), in report order
    skipped: tuple[Skipped, ...]
    #: every path is quietly in sync on all three sides, nothing skipped (``sync.seal``)
    in_sync: bool = False
    #: every path is quiet or has an action, nothing skipped or left out (``sync.seal``)
    all_acted: bool = False
