"""What ``ssh -G`` says about a destination: the user's fully resolved client config.

``ssh -G`` opens no connection (``Match exec`` commands do run). A config ssh refuses is
one ``TransportError`` line naming ssh's complaint and the fix.

Neither ``typing`` nor ``dataclasses`` at run time: the CLI resolves before it spawns
ssh's login (``openssh_login``).
"""

from __future__ import annotations

import os
import pwd
import re
import subprocess
import time
from pathlib import Path

from filesync.errors import TransportError
from filesync.transport.ssh.destination import DEFAULT_PORT, ssh_label

#: ``typing.TYPE_CHECKING`` without importing ``typing`` (mypy and ruff treat the name alike).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Final


class OpenSshSettings:
    """What ``ssh -G`` says about a destination: the fully resolved client config
    (``settings``: each lowercase key's values, in ssh's order). Never changes once made."""

    __slots__ = ("alias", "settings")

    def __init__(self, alias: str, settings: dict[str, list[str]]) -> None:
        self.alias: Final = alias
        self.settings: Final = settings

    def get(self, key: str, default: str = "") -> str:
        values = self.settings.get(key)
        return values[0] if values else default

    @property
    def host(self) -> str:
        return self.get("hostname", self.alias)

    @property
    def user(self) -> str:
        return self.get("user") or pwd.getpwuid(os.getuid()).pw_name

    @property
    def port(self) -> int:
        return int(self.get("port", str(DEFAULT_PORT)))

    @property
    def label(self) -> str:
        """``user@alias (host:port)`` as the asyncssh client spells it, for messages."""
        return ssh_label(self.user, self.alias, self.host, self.port)

    @property
    def identity(self) -> str:
        """``ssh://user@host:port``: the same state key as the asyncssh client's."""
        host = self.host.lower()
        return f"ssh://{self.user}@{f'[{host}]' if ':' in host else host}:{self.port}"

    def files(self, key: str) -> list[Path]:
        home = pwd.getpwuid(os.getuid()).pw_dir  # ssh expands ~ from the passwd entry
        out = []
        for value in self.settings.get(key, []):
            for item in value.split():
                if item.lower() != "none":
                    out.append(Path(re.sub(r"^~(?=/|$)", home, item)))
        return out


class Lookup:
    """One ``ssh -G`` under way, without an event loop: started when made, read by
    ``result``. Several run side by side (a fan-out's logins, ``openssh_login.begin_all``);
    each is given 60 s from its start."""

    __slots__ = ("alias", "deadline", "proc")

    def __init__(self, ssh: str, base: list[str], alias: str) -> None:
        self.alias: Final = alias
        self.deadline: Final = time.monotonic() + 60
        self.proc: Final = subprocess.Popen(
            [ssh, *base, "-T", "-G", "--", alias], stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)

    def result(self) -> OpenSshSettings:
        """The settings, or the ``TransportError`` of a config ssh refuses or a lookup
        that did not end in time (then it is killed)."""
        try:
            out, err = self.proc.communicate(timeout=max(0.0, self.deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            raise resolve_timeout(self.alias) from None
        return parse_resolved(self.alias, self.proc.returncode, out.decode(errors="replace"),
                              err.decode(errors="replace"))


def resolve_timeout(alias: str) -> TransportError:
    return TransportError(f"`ssh -G {alias}` did not finish in 60 s; check the Match exec "
                          "commands in your ssh config")


def parse_resolved(alias: str, code: int, out: str, err: str) -> OpenSshSettings:
    if code != 0:
        lines = [line for line in err.splitlines() if line.strip()]
        why = lines[0] if lines else f"exit status {code}"
        raise TransportError(f"ssh cannot use its config for {alias} ({why}); fix the ssh "
                             f"config (`ssh -G {alias}` shows the same)")
    settings: dict[str, list[str]] = {}
    for line in out.splitlines():
        key, _, value = line.partition(" ")
        settings.setdefault(key.lower(), []).append(value.strip())
    return OpenSshSettings(alias, settings)
