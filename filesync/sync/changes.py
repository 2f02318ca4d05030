"""Per-file records of a pass: what was done to each file, built only from confirmations.

A ``Change`` is appended by the transition at the moment the side that changed confirmed
it (the remote helper's ``ok``, the host journal's ``done``, a conflict copy written), so
a report never lists a file the plan meant to move but did not. Paths the plan only
bookkept (``record``: both sides already agree; ``forget``: gone on both sides) touch no
file and get no record.

The actions (``ChangeAction``), each with what ``bytes`` counts:

- ``upload``: the host's file was written on the remote (``push`` and ``sync``, a
  resolve ``--keep local``, and the upload that ends a push conflict); bytes sent.
- ``download``: the remote's file was written on the host (``pull``, ``sync``, a resolve
  ``--keep remote``); bytes of the file written.
- ``delete-remote``: the file was deleted on the remote; 0.
- ``delete-local``: the file was deleted on the host; 0.
- ``conflict``: neither side was changed; the remote version was saved under the state
  dir (a ``sync`` or ``pull`` conflict, or a download found edited on the host since the
  scan); bytes of the saved copy, 0 when an earlier run's copy of the same version was
  kept. A push conflict is an ``upload`` (or ``delete-remote``) record: the remote *was*
  changed, and its saved version is listed with the report's conflicts.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class ChangeAction(enum.StrEnum):
    """What a pass did to one file; the values are the JSON ``action`` strings, and
    each member equals its string (``change.action == "upload"``)."""

    UPLOAD = "upload"
    DOWNLOAD = "download"
    DELETE_REMOTE = "delete-remote"
    DELETE_LOCAL = "delete-local"
    CONFLICT = "conflict"


@dataclass(frozen=True, slots=True)
class Change:
    """One confirmed change: the path (relative to the roots), its action, its bytes."""

    path: str
    action: ChangeAction
    bytes: int = 0



class CountsChanges:
    """The per-action counters of a record that holds ``changes``, counted from them: a
    counter never disagrees with the list it counts."""

    changes: list[Change]

    def _count(self, action: ChangeAction) -> int:
        return sum(1 for c in self.changes if c.action is action)

    @property
    def uploaded(self) -> int:
        """Files written on the remote (``upload`` records)."""
        return self._count(ChangeAction.UPLOAD)

    @property
    def downloaded(self) -> int:
        """Files written on the host (``download`` records)."""
        return self._count(ChangeAction.DOWNLOAD)

    @property
    def deleted_local(self) -> int:
        """Files deleted on the host (``delete-local`` records)."""
        return self._count(ChangeAction.DELETE_LOCAL)

    @property
    def deleted_remote(self) -> int:
        """Files deleted on the remote (``delete-remote`` records)."""
        return self._count(ChangeAction.DELETE_REMOTE)
