"""Terminal backends for agent frameworks, built on filesync (filesync never imports backends).

A terminal session snapshots a login shell's environment once, restores the launch PATH that
Debian's ``/etc/profile`` throws away, and applies the HOME mode to its children. See
``docs/terminal.md``.
"""

from ._session import RunResult
from .env import restore_path
from .local import LocalTerminal
from .ssh import SSHTerminal
from .sync import AsyncBackendSync, BackendSync

__all__ = ["AsyncBackendSync", "BackendSync", "LocalTerminal", "RunResult", "SSHTerminal",
           "restore_path"]
