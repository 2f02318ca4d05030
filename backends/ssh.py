"""``SSHTerminal``: run an agent's commands on a remote host, with its trees synced.

Setup connects once (the user's OpenSSH config, host-key checks), pushes every
mapping, and snapshots the environment of one remote login shell with the launch
PATH restored. Commands then run over the same connection. Leaving the block is
the teardown hook: the two-way mappings are pulled back (remote bookkeeping trees
stay remote), then the connection closes. Teardown runs even when the block raised;
a sync-back failure is logged and kept in ``sync_back_errors``, never raised over
the block's own exception, and leaves nothing half-applied (the pull is journaled).
"""

from __future__ import annotations

import logging
import posixpath
import shlex
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from filesync import (
    TWO_WAY,
    Conduit,
    Direction,
    ExcludeRule,
    FilesyncError,
    Mapping,
    Options,
    RemoteProcess,
    Report,
    default_state_dir,
    drop_session,
    run_pass,
)

from ._session import RunResult, ShellPlan
from .env import ShellInit, parse_env0
from .home import child_env, home_mode_from_env, profile_dirs, resolve_home_mode

log = logging.getLogger(__name__)


def _decode(data: bytes) -> str:
    return data.decode("utf-8", "replace")


class RemoteBackground:
    """A background command on the remote; ``await wait()`` for its result."""

    def __init__(self, proc: RemoteProcess) -> None:
        self._proc = proc

    async def wait(self) -> RunResult:
        out = bytearray()
        while chunk := await self._proc.read(1 << 16):
            out += chunk
        code = await self._proc.wait()
        return RunResult(code, _decode(bytes(out)), _decode(await self._proc.read_stderr()))

    def kill(self) -> None:
        self._proc.kill()


class SSHTerminal:
    """An async context manager: a remote terminal session with sync at setup and teardown."""

    def __init__(
        self,
        host: str,
        ssh_config: Path | str | None = None,
        mappings: Sequence[Mapping] = (),
        home_mode: str | None = "auto",
        *,
        user: str | None = None,
        port: int | None = None,
        identity: Path | None = None,
        profile_home: str | None = None,
        shell_init_files: list[str] | None = None,
        auto_source_bashrc: bool = True,
        sync_before_run: bool = False,
        sync_interval: float = 5.0,
        state_dir: Path | None = None,
        exclude: Sequence[str] = (),
        accept_new_host_key: bool = False,
    ) -> None:
        self.host, self.user, self.port = host, user, port
        self.ssh_config = Path(ssh_config) if ssh_config is not None else None
        self.identity = identity
        self.mappings = list(mappings)
        self.home_mode = home_mode
        self.profile_home = profile_home
        self.init = ShellInit(auto_source_bashrc, shell_init_files)
        self.sync_before_run = sync_before_run
        self.sync_interval = sync_interval
        self.state_dir = state_dir or default_state_dir()
        self.exclude = list(exclude)
        self.accept_new_host_key = accept_new_host_key
        self.env: dict[str, str] = {}
        self._child_env: dict[str, str] = {}
        self.shell: ShellPlan | None = None
        self.sync_back_errors: list[FilesyncError] = []
        self.reports: list[Report] = []
        self._conduit: Conduit | None = None
        self._last_push = 0.0

    # -- setup and teardown -----------------------------------------------------

    async def __aenter__(self) -> SSHTerminal:
        from filesync import SshTarget
        from filesync import connect_ssh as connect

        self._conduit = await connect(
            SshTarget(self.host, self.user, self.port), ssh_config=self.ssh_config,
            identity=self.identity, accept_new_host_key=self.accept_new_host_key,
        )
        try:
            await self.push()
            await self._snapshot()
        except BaseException:
            await drop_session(self._conduit, polite=False)
            await self._conduit.close()
            self._conduit = None
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await self.sync_back()
        finally:
            if self._conduit is not None:
                await drop_session(self._conduit)
                await self._conduit.close()
                self._conduit = None

    async def push(self) -> None:
        """Push every mapping (two-way and upload-only) over the session's connection."""
        for mapping in self.mappings:
            self.reports.append(await self._pass(mapping, Direction.PUSH))
        self._last_push = time.monotonic()

    async def sync_back(self) -> None:
        """Pull the two-way mappings; failures are logged and kept, never raised."""
        for mapping in self.mappings:
            if mapping.mode != TWO_WAY:
                continue  # upload-only trees (credentials) are never written back
            try:
                self.reports.append(await self._pass(mapping, Direction.PULL))
            except FilesyncError as exc:
                log.warning("sync-back of %s failed: %s", mapping.local, exc)
                self.sync_back_errors.append(exc)

    async def _pass(self, mapping: Mapping, direction: Direction) -> Report:
        local = Path(mapping.local).expanduser().resolve()
        # A terminal runs many passes on one connection (setup, sync before commands,
        # teardown): its trees stay watched in between, so a quiet pass walks nothing.
        opts = Options(direction, ExcludeRule.build(self.exclude, root=local), self.state_dir,
                       watch=True)
        return await run_pass(self._require(), local, mapping.remote, opts)

    def _require(self) -> Conduit:
        if self._conduit is None:
            raise FilesyncError("the SSH terminal is not open; use it as 'async with'")
        return self._conduit

    # -- environment ------------------------------------------------------------

    async def _snapshot(self) -> None:
        conduit = self._require()
        # The session's own environment before any profile ran: the launch PATH.
        base = parse_env0(_decode((await conduit.run("env -0")).stdout))
        mode = home_mode_from_env(self.home_mode, base)
        real_home = base.get("HOME", "/")
        profile = Path(self.profile_home or posixpath.join(real_home, ".local/state/filesync/home"))
        # SSH targets are hosts, so "auto" keeps the real HOME there.
        env = child_env(base, mode, profile_home=profile, in_container=False, create_dirs=False)
        if resolve_home_mode(mode, False) == "profile":
            home, scratch = profile_dirs(profile)
            await conduit.run(f"mkdir -p {shlex.quote(str(home))} && mkdir -p -m 700 "
                              f"{shlex.quote(str(scratch))}")
        self._child_env = env
        files = tuple(self.init.files(env["HOME"], env, lambda _p: True))
        self.shell = ShellPlan(env.get("PATH", ""), files)
        done = await conduit.run(self._with_env(env, self.shell.snapshot_argv()))
        self.env = ShellPlan.read_snapshot(done.returncode, done.stdout, done.stderr)

    @staticmethod
    def _with_env(env: dict[str, str], argv: list[str]) -> str:
        assignments = [f"{k}={v}" for k, v in sorted(env.items()) if "=" not in k]
        return shlex.join(["env", "-i", *assignments, *argv])

    # -- commands ---------------------------------------------------------------

    async def run(self, cmd: str) -> RunResult:
        """Run ``cmd`` with the session's snapshot env and wait for it."""
        await self._maybe_push()
        done = await self._require().run(self._with_env(self.env, ShellPlan.foreground_argv(cmd)))
        return RunResult(done.returncode, _decode(done.stdout), _decode(done.stderr))

    async def spawn(self, cmd: str) -> RemoteBackground:
        """Start ``cmd`` in the background as ``bash -lic`` with the PATH restore in front."""
        if self.shell is None:
            raise FilesyncError("the SSH terminal is not open; use it as 'async with'")
        await self._maybe_push()
        argv = self.shell.background_argv(cmd)
        proc = await self._require().start(self._with_env(self._child_env, argv))
        await proc.write_eof()
        return RemoteBackground(proc)

    async def _maybe_push(self) -> None:
        if self.sync_before_run and time.monotonic() - self._last_push >= self.sync_interval:
            await self.push()
