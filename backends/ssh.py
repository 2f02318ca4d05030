"""``SSHTerminal``: run an agent's commands on a remote host, with its trees synced.

Setup refuses a mapping whose local root is missing (before connecting), connects once
(the OpenSSH client by default, the user's config and host keys as ``ssh`` applies them;
``ssh_client="asyncssh"`` for the in-process client), pushes every mapping, and snapshots the
environment of one remote login shell with the launch PATH restored. Commands then run over
the same connection. Leaving the block is the teardown hook: every remote process the
terminal started is killed (background, cancelled or timed-out commands alike: see
``_remote.py``), the two-way mappings are pulled back (remote bookkeeping trees stay
remote), then the connection closes. Teardown runs even when the block raised; a sync-back
failure is logged and kept in ``sync_back_errors`` (the other mappings are still pulled),
never raised over the block's own exception, and leaves nothing half-applied (the pull is
journaled). ``reports`` holds one ``Report`` per pass, in the order the passes ran.

Every sync (the setup push, ``sync_before_run``, the teardown pull) is a call of one
:class:`filesync.AsyncSession` over the terminal's own connection, so a terminal follows
the library's rules from the same code (``filesync.session``): a mapping may be a
directory or a single file (a file's pass touches no other file of either parent
directory, and may have another name on the remote); the innermost of nested mappings
owns a path (:func:`filesync.mapping.nested_excludes`), so an outer mapping's passes leave
an inner one's files alone on both sides. When and how it syncs is
:class:`filesync.backends.sync.AsyncBackendSync`'s policy, the one a framework backend with
its own command path adopts: a push before a command that fails is logged and retried at
the next command; a mapping whose remote root is its local tree reached twice (a loopback
target) turns sync off with one warning before anything changed, and the terminal keeps
working (``on_self_sync="raise"``: setup raises ``SelfSync`` instead). ``path_first``
directories come first on PATH after the profile ran, for foreground and background
commands.

With ``watch=True`` the mappings are synced continuously after the setup push
(``AsyncSession.watch``): what the remote agent writes reaches the host while the session
runs, and host edits reach the remote without waiting for a command. Teardown stops the
watch (after its last pass) before the commands' trees are pulled; a watch stopped early
(a safety guard, the connection lost) is logged and kept in ``sync_back_errors``. A watch
never starts while sync is off (self-sync).
"""

from __future__ import annotations

import logging
import os
import shlex
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from filesync import (
    AsyncSession,
    Conduit,
    FilesyncError,
    Mapping,
    Report,
    SessionReport,
    WatchLoop,
    default_state_dir,
    open_ssh,
)

from ._paths import StrPath, local_path, optional_local_path, remote_path
from ._remote import TAG_VAR, Commands, Tracked
from ._session import RunResult, ShellPlan
from .env import ShellInit, first_dirs, parse_env0
from .home import child_env, home_mode_from_env, profile_dirs, resolve_home_mode
from .sync import AsyncBackendSync, check_on_self_sync

log = logging.getLogger(__name__)


def _decode(data: bytes) -> str:
    return data.decode("utf-8", "replace")


class RemoteBackground:
    """A background command on the remote; ``await wait()`` for its result."""

    def __init__(self, tracked: Tracked, commands: Commands) -> None:
        self._tracked = tracked
        self._commands = commands

    async def wait(self) -> RunResult:
        """Wait for the command to end; its status (negative: killed) and all its output."""
        done = await self._tracked.complete()
        return RunResult(done.returncode, _decode(done.stdout), _decode(done.stderr))

    def kill(self) -> None:
        """SIGKILL the command and whatever it started on the remote; does not wait."""
        self._commands.kill_soon(self._tracked)


class SSHTerminal:
    """An async context manager: a remote terminal session with sync at setup and teardown.

    Local path parameters (``ssh_config``, ``identity``, ``state_dir``, ``Mapping.local``)
    take ``str`` or ``os.PathLike[str]`` and expand ``~`` on this machine; ``profile_home``
    is a path on the remote, where ``~`` and relative paths are under the remote HOME.
    """

    def __init__(
        self,
        host: str,
        ssh_config: StrPath | None = None,
        mappings: Sequence[Mapping] = (),
        home_mode: str | None = "auto",
        *,
        user: str | None = None,
        port: int | None = None,
        identity: StrPath | None = None,
        profile_home: StrPath | None = None,
        shell_init_files: list[str] | None = None,
        auto_source_bashrc: bool = True,
        sync_before_run: bool = False,
        sync_interval: float = 5.0,
        state_dir: StrPath | None = None,
        exclude: Sequence[str] = (),
        accept_new_host_key: bool = False,
        ssh_client: str | None = None,
        on_self_sync: str = "disable",
        path_first: Sequence[StrPath] = (),
        watch: bool = False,
    ) -> None:
        self.host, self.user, self.port = host, user, port
        self.ssh_config = optional_local_path(ssh_config)
        self.identity = optional_local_path(identity)
        self.mappings = list(mappings)
        self.home_mode = home_mode
        self.profile_home = None if profile_home is None else os.fspath(profile_home)
        self.init = ShellInit(auto_source_bashrc, shell_init_files)
        self.sync_before_run = sync_before_run
        self.sync_interval = sync_interval
        self.state_dir = local_path(state_dir) if state_dir is not None else default_state_dir()
        self.exclude = list(exclude)
        self.accept_new_host_key = accept_new_host_key
        #: "openssh" or "asyncssh"; None: $FILESYNC_SSH_CLIENT, else OpenSSH whenever an
        #: ``ssh`` binary is on PATH (the CLI's rule, docs/ssh.md)
        self.ssh_client = ssh_client
        #: "disable" (one warning, the terminal runs with sync off) or "raise" (SelfSync)
        self.on_self_sync = check_on_self_sync(on_self_sync)
        #: remote dirs put first on PATH after the profile (``~``, relative: remote HOME)
        self.path_first = [os.fspath(d) for d in path_first]
        self.env: dict[str, str] = {}
        self._base_env: dict[str, str] = {}
        self._child_env: dict[str, str] = {}
        self.shell: ShellPlan | None = None
        self.sync_back_errors: list[FilesyncError] = []
        #: One ``Report`` per pass (setup push, pushes before commands, teardown pull).
        self.reports: list[Report] = []
        self._conduit: Conduit | None = None
        self._session: AsyncSession | None = None
        self._commands: Commands | None = None
        self._sync: AsyncBackendSync | None = None
        #: sync continuously while the session runs (see the module docstring)
        self.watch = watch
        self._watch: WatchLoop[SessionReport] | None = None

    # -- setup and teardown -----------------------------------------------------

    async def __aenter__(self) -> SSHTerminal:
        self._check_local_roots()
        # One connection for the terminal: over OpenSSH, one master (the user's own when
        # their config multiplexes) and each command a multiplexed session on it.
        self._conduit = await open_ssh(
            self.host, user=self.user, port=self.port, ssh_config=self.ssh_config,
            identity=self.identity, accept_new_host_key=self.accept_new_host_key,
            ssh_client=self.ssh_client,
        )
        self._commands = Commands(self._conduit)
        # A terminal runs many passes on one connection (setup, sync before commands,
        # teardown): its trees stay watched in between, so a quiet pass walks nothing.
        self._session = AsyncSession(conduit=self._conduit, state_dir=self.state_dir,
                                     exclude=self.exclude, watch=True)
        self._sync = AsyncBackendSync(self._session, self.mappings,
                                      interval=self.sync_interval,
                                      on_self_sync=self.on_self_sync)
        try:
            # The session's own environment before any profile ran: the launch PATH, HOME.
            base = await self._commands.run(["env", "-0"], None)
            self._base_env = parse_env0(_decode(base.stdout))
            self._base_env.pop(TAG_VAR, None)
            await self.push()  # a terminal starts with every tree in place, or not at all
            if self.watch and self.mappings and self.sync_enabled:
                self._watch = await self._session.watch(self.mappings, self._keep)
            await self._snapshot()
        except BaseException:
            await self._close()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await self._kill_commands()  # nothing may still write into a tree being pulled
            await self._stop_watch()
            await self.sync_back()
        finally:
            await self._close()

    async def _kill_commands(self) -> None:
        commands, self._commands = self._commands, None
        if commands is not None:
            try:
                await commands.close()
            except FilesyncError as exc:
                log.warning("could not kill the remote commands: %s", exc)

    async def _stop_watch(self) -> None:
        watching, self._watch = self._watch, None
        if watching is not None:
            try:
                await watching.stop()
            except FilesyncError as exc:
                log.warning("the watch stopped: %s", exc)
                self.sync_back_errors.append(exc)

    async def _close(self) -> None:
        await self._kill_commands()
        await self._stop_watch()
        # The session runs on the terminal's connection: its close() ends the helper (and
        # the connection, once a call used it); the connection is closed here in any case.
        session, self._session = self._session, None
        self._sync = None
        conduit, self._conduit = self._conduit, None
        try:
            if session is not None:
                await session.close()
        finally:
            if conduit is not None:
                await conduit.close()  # idempotent

    def _check_local_roots(self) -> None:
        # Refused before connecting: the setup push would only fail later, half done.
        for mapping in self.mappings:
            if not os.path.exists(mapping.local):
                raise FilesyncError(
                    f"the local root {mapping.local} of mapping {mapping.local} -> "
                    f"{mapping.remote} does not exist; create it or fix the mapping"
                )

    @property
    def sync_enabled(self) -> bool:
        """False once self-sync turned sync off (``on_self_sync="disable"``)."""
        return self._sync is None or self._sync.enabled

    async def push(self) -> None:
        """Push every mapping (two-way and upload-only) over the session's connection;
        raises the first mapping's failure (the others were still pushed)."""
        report = await self._require_sync().setup()
        self._keep(report)
        if report.failed:
            raise report.failed[0][1]

    async def sync_back(self) -> None:
        """Pull the two-way mappings; failures are logged and kept, never raised."""
        # One call for all of them (``AsyncBackendSync.teardown``): the nested rule sees
        # every mapping, and a failed pass does not keep the others from pulling.
        report = await self._require_sync().teardown()
        self._keep(report)
        self.sync_back_errors += [failure for _mapping, failure in report.failed]

    def _keep(self, report: SessionReport) -> None:
        self.reports += [one for _mapping, one in report.passes]

    def _require_sync(self) -> AsyncBackendSync:
        if self._sync is None:
            raise FilesyncError("the SSH terminal is not open; use it as 'async with'")
        return self._sync

    def _require_commands(self) -> Commands:
        if self._commands is None:
            raise FilesyncError("the SSH terminal is not open; use it as 'async with'")
        return self._commands

    # -- environment ------------------------------------------------------------

    async def _snapshot(self) -> None:
        commands = self._require_commands()
        base = self._base_env
        mode = home_mode_from_env(self.home_mode, base)
        real_home = base.get("HOME", "/")
        profile = Path(remote_path(self.profile_home or ".local/state/filesync/home", real_home))
        # SSH targets are hosts, so "auto" keeps the real HOME there.
        env = child_env(base, mode, profile_home=profile, in_container=False, create_dirs=False)
        if resolve_home_mode(mode, False) == "profile":
            home, scratch = profile_dirs(profile)
            script = (f"mkdir -p {shlex.quote(str(home))} && "
                      f"mkdir -p -m 700 {shlex.quote(str(scratch))}")
            await commands.run(["sh", "-c", script], None)
        self._child_env = env
        files = tuple(self.init.files(env["HOME"], env, lambda _p: True))
        first = tuple(first_dirs(remote_path(d, real_home) for d in self.path_first))
        self.shell = ShellPlan(env.get("PATH", ""), files, first)
        done = await commands.run(self.shell.snapshot_argv(), env)
        snapshot = ShellPlan.read_snapshot(done.returncode, done.stdout, done.stderr)
        snapshot.pop(TAG_VAR, None)
        self.env = snapshot

    # -- commands ---------------------------------------------------------------

    async def run(self, cmd: str) -> RunResult:
        """Run ``cmd`` with the session's snapshot env and wait for it.

        Cancelling the call (``task.cancel()``, ``asyncio.wait_for``) kills the command and
        whatever it started on the remote before the cancellation propagates.
        """
        await self._maybe_push()
        argv = ShellPlan.foreground_argv(cmd)
        done = await self._require_commands().run(argv, self.env)
        return RunResult(done.returncode, _decode(done.stdout), _decode(done.stderr))

    async def spawn(self, cmd: str) -> RemoteBackground:
        """Start ``cmd`` in the background as ``bash -lic`` with the PATH restore in front.

        It is killed, with whatever it started, when the terminal closes.
        """
        if self.shell is None:
            raise FilesyncError("the SSH terminal is not open; use it as 'async with'")
        await self._maybe_push()
        commands = self._require_commands()
        tracked = await commands.start(self.shell.background_argv(cmd), self._child_env)
        await tracked.proc.write_eof()
        return RemoteBackground(tracked, commands)

    async def _maybe_push(self) -> None:
        if self.sync_before_run:
            # A failure is logged and retried at the next command; the command still runs.
            report = await self._require_sync().before_command()
            if report is not None:
                self._keep(report)
