"""A real OpenSSH ``sshd`` in its own Linux namespaces, for tests and benchmarks.

No Docker engine exists on these machines, so a "container" here is an ``unshare``'d set of
network, mount, uts and pid namespaces around ``/usr/sbin/sshd -D``.  The recipe and its gotchas
are in ``/work/shared/notes/sshd-container.md``; this module follows it.

What a started :class:`SshdContainer` looks like from inside (what an ssh session sees):

* hostname ``remote``; one interface ``fsv<index>r`` with ``10.203.<index>.2/24`` (plus ``lo``);
  sshd listens on that address only, port 22.  IPv6 is off on the veth pair, so the only traffic
  on the wire is ARP and the TCP connections the tests make.
* ``/root`` is :attr:`SshdContainer.home` (a fresh host directory, mode 0700) with
  ``.ssh/authorized_keys`` -- so root's real ``~/.bashrc`` (pyenv init) is not there and sessions
  get sshd's default root ``PATH``
  (``/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin``).
* private ``/run`` and ``/tmp`` (tmpfs), ``/var/log/{wtmp,btmp,lastlog}`` covered by
  ``/dev/null``; everything else (``/usr``, ``/etc``, ...) is the host's, read-write.

On the host side a started container owns: the veth end ``fsv<index>h`` (``10.203.<index>.1/24``),
a fallback ``unreachable 10.203.<index>.0/24 metric 4000`` route (so the subnet never leaks out by
the default route while the link is down) and a lock on the index (an abstract unix socket, so
tests and benchmarks in separate processes cannot share an index).  :meth:`SshdContainer.stop`
removes all of them; if the owning process dies without stopping, the kernel kills the
container (PDEATHSIG on ``unshare``) and the next start on that index removes the leftovers.

The module imports nothing from pytest and does not rely on being in a package: the benchmark
scripts do ``sys.path.insert(0, "<repo>/tests")`` and ``import sshd``.  Everything needs root.

Typical use::

    ok, why = sshd_available()
    with SshdContainer(Path(tempfile.mkdtemp()), index=0) as box:
        subprocess.run(["ssh", "-F", str(box.ssh_config), box.alias, "true"], check=True)
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import functools
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import threading
import time
import weakref
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType

__all__ = ["MAX_INDEX", "IndexInUse", "SshdContainer", "sshd_available"]

#: Highest container index; each index owns veth ``fsv<index>h``/``fsv<index>r`` and the
#: subnet ``10.203.<index>.0/24``.
MAX_INDEX = 15

SSHD = "/usr/sbin/sshd"  # sshd refuses to re-exec itself unless started by absolute path
_REQUIRED_TOOLS = ("unshare", "nsenter", "ip", "mount", "mknod", "ssh", "ssh-keygen")
# Where the workdir is bind-mounted inside the namespace.  It has to be reachable after /root
# and /tmp are covered (the workdir often lives under /tmp, sometimes under /root).
_INSIDE = "/run/filesync-sshd"
# A clean environment for commands run inside the namespace (what "docker exec" would give),
# so the host's pyenv PATH does not leak into the "remote".
_INSIDE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "LANG": "C.UTF-8",
}
# Deadlines of waits that end as soon as their condition holds: generous, so that a loaded
# machine (scripts/dev test-under-load) is slow, never a failure.
_START_TIMEOUT = 60.0
_STOP_TIMEOUT = 30.0


# --------------------------------------------------------------------------------------------
# Availability
# --------------------------------------------------------------------------------------------


@functools.cache
def sshd_available() -> tuple[bool, str]:
    """Tell whether :class:`SshdContainer` can work on this machine, and if not, why.

    Checks: running as root; ``unshare``, ``nsenter``, ``ip``, ``mount``, ``mknod``, ``ssh``,
    ``ssh-keygen`` on PATH and ``/usr/sbin/sshd`` present; and that creating the
    net/mount/uts/pid namespaces actually works (a trial ``unshare ... true``).  The answer is
    cached for the life of the process.  Returns ``(True, "")`` or ``(False, reason)``.
    """
    if os.geteuid() != 0:
        return False, "needs root (creates namespaces, veth pairs and mounts)"
    missing = [tool for tool in _REQUIRED_TOOLS if shutil.which(tool) is None]
    if not os.access(SSHD, os.X_OK):
        missing.append(SSHD)
    if missing:
        return False, "missing tools: " + ", ".join(missing) + " (apt: openssh-server, iproute2)"
    try:
        probe = subprocess.run(
            ["unshare", "--net", "--mount", "--uts", "--pid", "--fork", "--mount-proc", "true"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=_START_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"unshare failed: {exc}"
    if probe.returncode != 0:
        return False, f"namespaces unusable: unshare exited {probe.returncode}: {probe.stderr}"
    return True, ""


# --------------------------------------------------------------------------------------------
# /proc helpers
# --------------------------------------------------------------------------------------------


def _proc_stat(pid: int) -> tuple[str, str, int] | None:
    """(comm, state, ppid) of ``pid`` or None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # comm may contain spaces and parentheses: it ends at the *last* ')'.
    head, _, tail = raw.rpartition(")")
    comm = head.partition("(")[2]
    fields = tail.split()
    return comm, fields[0], int(fields[1])


def _alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie.

    The machine's PID 1 reaps orphans late, so a zombie counts as dead.
    """
    stat = _proc_stat(pid)
    return stat is not None and stat[1] not in ("Z", "X")


def _process_table() -> dict[int, tuple[str, str, int]]:
    """pid -> (comm, state, ppid) for every process (scanned, so no CONFIG_PROC_CHILDREN need)."""
    table: dict[int, tuple[str, str, int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            stat = _proc_stat(int(entry.name))
            if stat is not None:
                table[int(entry.name)] = stat
    return table


def _children(pid: int, table: dict[int, tuple[str, str, int]]) -> list[int]:
    return sorted(p for p, (_, state, ppid) in table.items() if ppid == pid and state != "Z")


def _descendants(pid: int, table: dict[int, tuple[str, str, int]]) -> set[int]:
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in _children(todo.pop(), table):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _wait_dead(pids: Iterable[int], timeout: float) -> bool:
    """Poll until none of ``pids`` is alive (zombies count as dead); False on timeout."""
    pending = set(pids)
    deadline = time.monotonic() + timeout
    while True:
        pending = {pid for pid in pending if _alive(pid)}
        if not pending:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _run(argv: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30, check=False
    )
    if check and result.returncode != 0:
        raise RuntimeError(
            f"{shlex.join(argv)} exited {result.returncode}: {result.stderr.strip()}"
        )
    return result


def _tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(none)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty)"


def _link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


# Containers still running at interpreter exit get stopped, so a benchmark script that forgets
# (or dies of an exception outside a ``with``) leaves no sshd behind.
_RUNNING: weakref.WeakSet[SshdContainer] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for box in list(_RUNNING):
        with contextlib.suppress(Exception):
            box.stop()


# --------------------------------------------------------------------------------------------
# The container
# --------------------------------------------------------------------------------------------


class IndexInUse(RuntimeError):
    """The container index is held by another live container (this or another process)."""


class SshdContainer:
    """One OpenSSH sshd in private net/mount/uts/pid namespaces, reachable over a veth pair.

    Construction creates the workdir's files (host key, client key, ``authorized_keys``,
    ``known_hosts``, ``sshd_config``, ``ssh_config``) but starts nothing.  :meth:`start` and
    :meth:`stop` may alternate: the keys survive a restart, so clients' ``known_hosts`` stays
    valid.  Indexes are exclusive machine-wide while started (an abstract-socket lock), so two
    processes (pytest and a benchmark) cannot fight over one veth name or subnet.

    Attributes (valid from construction on, except :attr:`ns_pid`):

    * ``address`` -- ``10.203.<index>.2``, the only address sshd listens on (port 22).
    * ``host_address`` -- ``10.203.<index>.1``, the host end of the veth pair.
    * ``alias`` -- ``remote<index>``, a ``Host`` in :attr:`ssh_config`.
    * ``user`` -- ``root``.
    * ``home`` -- host path of the directory that is ``/root`` inside.
    * ``client_key`` -- ed25519 private key authorised for root; ``client_key_pub`` its .pub.
    * ``known_hosts`` -- ``<address> <type> <key>``; strict host key checking works with it.
    * ``host_key_pub`` -- ``"ssh-ed25519 AAAA..."`` (type and key, no comment).
    * ``ssh_config`` -- client config for ``ssh -F``: ``Host <alias>`` and ``Host <address>``.
    * ``ns_pid`` -- host PID of PID 1 inside (the listening sshd); 0 when not started.
    """

    user: str = "root"

    def __init__(self, workdir: Path, index: int = 0) -> None:
        if not 0 <= index <= MAX_INDEX:
            raise ValueError(f"index must be 0..{MAX_INDEX}, got {index}")
        self.workdir = Path(workdir).resolve()
        if self.workdir == Path("/run") or Path("/run") in self.workdir.parents:
            # /run gets a private tmpfs inside before the workdir is bind-mounted.
            raise ValueError(f"workdir must not be under /run: {self.workdir}")
        if any(c in str(self.workdir) for c in '\n"'):
            raise ValueError(f"workdir path has characters unusable in configs: {self.workdir}")
        self.index = index
        self.address = f"10.203.{index}.2"
        self.host_address = f"10.203.{index}.1"
        self.alias = f"remote{index}"
        self.veth_host = f"fsv{index}h"
        self.veth_remote = f"fsv{index}r"
        self.home = self.workdir / "home"
        self.host_key = self.workdir / "ssh_host_ed25519_key"
        self.client_key = self.workdir / "client_ed25519"
        self.client_key_pub = self.workdir / "client_ed25519.pub"
        self.known_hosts = self.workdir / "known_hosts"
        self.ssh_config = self.workdir / "ssh_config"
        self.sshd_config = self.workdir / "sshd_config"
        self.sshd_log = self.workdir / "sshd.log"
        self.container_log = self.workdir / "container.log"
        self._child_script = self.workdir / "container.sh"
        self.ns_pid = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock: socket.socket | None = None
        self._hide_count = 0
        # parent dir -> names whited out of it, see whiteout()
        self._whiteouts: dict[str, set[str]] = {}
        self._whiteout_mounts: set[str] = set()
        self._prepare_files()

    # -- setup ------------------------------------------------------------------------------

    def _prepare_files(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "hidden").mkdir(exist_ok=True)
        for key in (self.host_key, self.client_key):
            # ssh-keygen would ask before overwriting; a reused workdir gets fresh keys.
            for path in (key, key.with_name(key.name + ".pub")):
                path.unlink(missing_ok=True)
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", self.alias, "-f", str(key)])
        key_type, key_b64 = (
            self.host_key.with_name(self.host_key.name + ".pub").read_text().split()[:2]
        )
        self.host_key_pub = f"{key_type} {key_b64}"

        self.home.mkdir(mode=0o700, exist_ok=True)
        self.home.chmod(0o700)  # mkdir's mode is masked by umask; be exact
        ssh_dir = self.home / ".ssh"
        ssh_dir.mkdir(mode=0o700, exist_ok=True)
        authorized = ssh_dir / "authorized_keys"
        authorized.write_text(self.client_key_pub.read_text())
        authorized.chmod(0o600)

        self.known_hosts.write_text(f"{self.address} {self.host_key_pub}\n")

        client_settings = "\n".join(
            [
                f"    HostName {self.address}",
                f"    User {self.user}",
                "    Port 22",
                f'    IdentityFile "{self.client_key}"',
                "    IdentitiesOnly yes",
                f'    UserKnownHostsFile "{self.known_hosts}"',
                # the host's /etc/ssh/ssh_known_hosts must not vouch for (or against) us
                "    GlobalKnownHostsFile /dev/null",
                "    StrictHostKeyChecking yes",
                # never sit at a prompt in a test
                "    BatchMode yes",
            ]
        )
        self.ssh_config.write_text(
            f"Host {self.alias}\n{client_settings}\n\nHost {self.address}\n{client_settings}\n"
        )

        self.sshd_config.write_text(
            "\n".join(
                [
                    "Port 22",
                    "AddressFamily inet",
                    f"ListenAddress {self.address}",
                    f"HostKey {_INSIDE}/{self.host_key.name}",
                    # a namespace-local PID; only there because sshd wants one somewhere
                    "PidFile /run/sshd.pid",
                    "AuthorizedKeysFile .ssh/authorized_keys",
                    "PubkeyAuthentication yes",
                    "PermitRootLogin prohibit-password",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    "StrictModes no",
                    "UseDNS no",
                    "PrintMotd no",
                    "PrintLastLog no",
                    "PermitUserEnvironment yes",
                    "ClientAliveInterval 0",
                    "MaxStartups 100:30:200",
                    "MaxSessions 50",
                    "Subsystem sftp internal-sftp",
                    "LogLevel INFO",
                    "",
                ]
            )
        )

        inside = shlex.quote(_INSIDE)
        self._child_script.write_text(
            f"""#!/bin/sh
# PID 1 of the container's namespaces (started by unshare from SshdContainer.start).
set -eu
hostname remote
# private /run: sshd's privilege separation dir and pid file never touch the host
mount -t tmpfs -o mode=755 tmpfs /run
mkdir -m 755 /run/sshd {inside}
# the workdir goes to a fixed place before /root and /tmp are covered (it may live under either)
mount --bind {shlex.quote(str(self.workdir))} {inside}
mount --bind {inside}/home /root
mount -t tmpfs -o mode=1777 tmpfs /tmp
# login records of pty sessions must not land in the host's logs
for f in /var/log/wtmp /var/log/btmp /var/log/lastlog; do
    if [ -f "$f" ]; then mount --bind /dev/null "$f"; fi
done
ip link set lo up
# stdin is a pipe: the host writes a line once the veth peer is in our namespace, and closes
# it without writing if it gives up (EOF -> exit, so PID 1 never lingers)
read -r go || exit 97
exec </dev/null
ipv6=/proc/sys/net/ipv6/conf/{self.veth_remote}/disable_ipv6
if [ -w "$ipv6" ]; then echo 1 > "$ipv6"; fi
ip addr add {self.address}/24 dev {self.veth_remote}
ip link set {self.veth_remote} up
exec {SSHD} -D -f {inside}/{self.sshd_config.name} -E {inside}/{self.sshd_log.name}
"""
        )

    # -- lifecycle --------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """True between a successful :meth:`start` and :meth:`stop` while PID 1 lives."""
        return self._proc is not None and self.ns_pid != 0 and _alive(self.ns_pid)

    def start(self) -> None:
        """Start sshd and return once ``address:22`` accepts and sends an SSH banner.

        Takes ~0.04 s here (median; up to ~0.1 s).  On failure, everything started so far is
        stopped again and a RuntimeError carries the sshd log and container log tails; an index
        held by another live container fails at once with "in use".
        """
        if self._proc is not None:
            raise RuntimeError(f"{self.alias} already started")
        self._lock = self._take_index_lock()
        go_write: int | None = None
        try:
            self._remove_stale_link()
            self.sshd_log.write_text("")
            go_read, go_write = os.pipe()
            with self.container_log.open("wb") as log:
                self._proc = subprocess.Popen(
                    [
                        *self._pdeathsig_prefix(),
                        "unshare",
                        "--net",
                        "--mount",
                        "--uts",
                        "--pid",
                        "--fork",
                        "--mount-proc",
                        "--kill-child=SIGTERM",
                        "/bin/sh",
                        str(self._child_script),
                    ],
                    stdin=go_read,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # a Ctrl-C to the test run is for pytest, not sshd
                )
            os.close(go_read)
            self.ns_pid = self._wait_for_ns_child()
            self._create_link()
            os.write(go_write, b"go\n")
            os.close(go_write)
            go_write = None
            self._wait_until_serving()
        except Exception as exc:
            if go_write is not None:
                os.close(go_write)  # EOF makes a still-waiting PID 1 exit by itself
            report = (
                f"{self.alias}: sshd container failed to start: {exc}\n"
                f"--- sshd log ({self.sshd_log}) ---\n{_tail(self.sshd_log)}\n"
                f"--- container log ({self.container_log}) ---\n{_tail(self.container_log)}"
            )
            self._teardown(graceful=False)
            raise RuntimeError(report) from exc
        _RUNNING.add(self)

    def stop(self) -> None:
        """Stop sshd and everything in its namespaces; remove the veth pair.  Idempotent.

        PID 1 inside gets SIGTERM (SIGKILL if it is still there after ``_STOP_TIMEOUT``);
        once it is gone the kernel has killed every other process of the pid namespace.
        Afterwards no process of this container is alive, ``fsv<index>h`` and the subnet's
        fallback route are gone and the index is free.
        Takes ~0.025 s.  A container that never started, or a second call, touches nothing.
        """
        self._teardown(graceful=True)

    def __enter__(self) -> SshdContainer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"ns_pid={self.ns_pid}" if self.running else "stopped"
        return f"<SshdContainer {self.alias} {self.address} {state}>"

    def _take_index_lock(self) -> socket.socket:
        # An abstract unix socket name is a lock the kernel drops when its holder dies, and it
        # leaves no file behind.
        lock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            lock.bind(f"\0filesync-sshd-{self.veth_host}")
        except OSError as exc:
            lock.close()
            if exc.errno == errno.EADDRINUSE:
                raise IndexInUse(
                    f"sshd container index {self.index} is in use by another live container "
                    "(this or another process); pick another index"
                ) from exc
            raise
        return lock

    @staticmethod
    def _pdeathsig_prefix() -> list[str]:
        # If this process dies without stop() (SIGKILL, a crash), the kernel kills unshare, and
        # unshare's --kill-child takes sshd with it.  PDEATHSIG follows the *thread* that forked,
        # so only ask for it from the main thread (a worker thread may end before the container).
        if threading.current_thread() is threading.main_thread() and shutil.which("setpriv"):
            return ["setpriv", "--pdeathsig", "KILL", "--"]
        return []

    def _remove_stale_link(self) -> None:
        # We hold the index lock, so an existing fsv<index>h belongs to a dead owner.
        if _link_exists(self.veth_host):
            _run(["ip", "link", "del", self.veth_host], check=False)
            self._wait_link_gone()

    def _wait_link_gone(self) -> None:
        deadline = time.monotonic() + _STOP_TIMEOUT
        while _link_exists(self.veth_host) and time.monotonic() < deadline:
            time.sleep(0.005)

    def _wait_for_ns_child(self) -> int:
        """Host PID of unshare's child (PID 1 inside), once it is in the new namespaces."""
        assert self._proc is not None
        own_net = os.stat("/proc/self/ns/net").st_ino
        deadline = time.monotonic() + _START_TIMEOUT
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"unshare exited early with {self._proc.returncode}")
            kids = _children(self._proc.pid, _process_table())
            if kids:
                with contextlib.suppress(FileNotFoundError):
                    if os.stat(f"/proc/{kids[0]}/ns/net").st_ino != own_net:
                        return kids[0]
            time.sleep(0.002)
        raise RuntimeError("timed out waiting for unshare's child")

    def _create_link(self) -> None:
        # The fallback route keeps traffic for the subnet on this machine while the veth is
        # down (link_down) or gone: without it, packets to 10.203.<index>.2 would follow the
        # default route out of eth0.  The connected route (metric 0) wins while the link is up.
        self._ip_batch(
            f"route replace {self._fallback_route}",
            f"link add {self.veth_host} type veth peer name {self.veth_remote} netns {self.ns_pid}",
        )
        # no IPv6 on the pair: no router solicitations or DAD noise in wire_bytes()
        with contextlib.suppress(OSError):
            Path(f"/proc/sys/net/ipv6/conf/{self.veth_host}/disable_ipv6").write_text("1\n")
        self._ip_batch(
            f"addr add {self.host_address}/24 dev {self.veth_host}",
            f"link set {self.veth_host} up",
        )

    @property
    def _fallback_route(self) -> str:
        return f"unreachable 10.203.{self.index}.0/24 metric 4000"

    @staticmethod
    def _ip_batch(*commands: str, check: bool = True) -> None:
        # one `ip` process for several commands: start() is mostly process spawns
        result = subprocess.run(
            ["ip", "-batch", "-"],
            input="\n".join(commands) + "\n",
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if check and result.returncode != 0:
            raise RuntimeError(f"ip -batch {commands!r} failed: {result.stderr.strip()}")

    def _wait_until_serving(self) -> None:
        # Wait for sshd's own "listening" line before the first connect: a SYN sent before the
        # address exists inside would wait for the next ARP retry (1 s).
        deadline = time.monotonic() + _START_TIMEOUT
        while "Server listening on" not in self.sshd_log.read_text(errors="replace"):
            if not self.running:
                raise RuntimeError("sshd exited during start-up")
            if time.monotonic() > deadline:
                raise RuntimeError("timed out waiting for sshd to listen")
            time.sleep(0.002)
        with socket.create_connection((self.address, 22), timeout=_START_TIMEOUT) as conn:
            banner = conn.recv(256)
        if not banner.startswith(b"SSH-2.0-"):
            raise RuntimeError(f"unexpected banner from {self.address}:22: {banner!r}")

    def _teardown(self, *, graceful: bool) -> None:
        if self._lock is None:
            # Never started, or stopped already: the veth name and route of this index may
            # belong to another live container, so touch nothing.
            return
        proc = self._proc
        if proc is not None:
            ns_pid = self.ns_pid or next(iter(_children(proc.pid, _process_table())), 0)
            if proc.poll() is None:
                if ns_pid and _alive(ns_pid):
                    # signal PID 1 inside, not unshare: unshare blocks SIGTERM while it waits
                    _signal(ns_pid, signal.SIGTERM if graceful else signal.SIGKILL)
                else:
                    proc.kill()
                try:
                    proc.wait(timeout=_STOP_TIMEOUT)
                except subprocess.TimeoutExpired:
                    if ns_pid:
                        _signal(ns_pid, signal.SIGKILL)
                    proc.kill()
                    proc.wait(timeout=_STOP_TIMEOUT)
            if ns_pid:
                _wait_dead([ns_pid], _STOP_TIMEOUT)
            self._proc = None
        self.ns_pid = 0
        self._whiteouts.clear()
        self._whiteout_mounts.clear()
        _RUNNING.discard(self)
        # the pair usually vanishes with the namespace, but netns cleanup is asynchronous
        if _link_exists(self.veth_host):
            _run(["ip", "link", "del", self.veth_host], check=False)
            self._wait_link_gone()
        _run(["ip", "route", "del", *self._fallback_route.split()], check=False)
        self._lock.close()
        self._lock = None

    # -- inside the container ---------------------------------------------------------------

    def _require_running(self) -> None:
        if not self.running:
            raise RuntimeError(f"{self.alias} is not running")

    def nsenter_argv(self) -> list[str]:
        """Argv prefix that runs a program inside the container ("docker exec"-style).

        ``nsenter -t <ns_pid> -m -u -n -p``; append e.g. ``["sh", "-c", "hostname"]``.  The
        program inherits the caller's environment and working directory; :meth:`run_inside`
        gives a clean one.
        """
        self._require_running()
        return ["nsenter", "-t", str(self.ns_pid), "-m", "-u", "-n", "-p"]

    def run_inside(
        self, cmd: str, *, input: str | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run ``sh -c cmd`` inside the namespaces, in ``/root``, with a clean environment.

        Output is captured as text; the exit status is not checked (look at ``returncode``).
        """
        return subprocess.run(
            [*self.nsenter_argv(), "--wdns=/root", "sh", "-c", cmd],
            input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=_INSIDE_ENV,
            timeout=timeout,
            check=False,
        )

    def _run_inside_checked(self, cmd: str) -> None:
        result = self.run_inside(cmd)
        if result.returncode != 0:
            raise RuntimeError(
                f"inside {self.alias}: {cmd!r} exited {result.returncode}: "
                f"{(result.stdout + result.stderr).strip()}"
            )

    @staticmethod
    def _check_path(path: str) -> str:
        if not path.startswith("/") or os.path.normpath(path) != path or path == "/":
            raise ValueError(f"need an absolute, normalised path other than /: {path!r}")
        if any(c in path for c in ":,\n"):
            raise ValueError(f"path unusable as a mount option: {path!r}")
        return path

    def hide(self, path: str) -> None:
        """Bind-mount an empty file (empty dir, if ``path`` is a dir) over ``path``, inside only.

        The cover is fresh per call, owned by root, mode 0644 for a file (not executable) and
        0755 for a dir; new and running sessions see it at once; :meth:`unhide` removes it.
        Bind mounts follow symlinks, so hiding ``/usr/bin/python3`` covers ``python3.11``.

        What this does and does not do to a command: after ``hide("/usr/bin/python3.11")``
        running ``python3`` fails (``Permission denied``, exit 126) and dash's
        ``command -v python3`` fails, but **bash's** ``command -v python3`` still prints
        ``/usr/bin/python3`` (bash reports a non-executable match) -- and root's login shell,
        which runs every ``ssh host 'cmd'``, is bash.  For a remote where ``command -v python3``
        fails in any shell *and* running it fails (exit 127), use :meth:`whiteout` on both
        ``/usr/bin/python3`` and ``/usr/bin/python3.11`` (the only python3 on the remote PATH:
        ``/usr/local/bin`` has none, ``/bin`` is ``/usr/bin``).
        """
        self._check_path(path)
        self._require_running()
        self._hide_count += 1
        cover = f"{_INSIDE}/hidden/{self._hide_count}"
        q_path, q_cover = shlex.quote(path), shlex.quote(cover)
        self._run_inside_checked(
            f"if [ -d {q_path} ]; then mkdir -m 755 {q_cover}; "
            f"elif [ -e {q_path} ]; then : > {q_cover} && chmod 644 {q_cover}; "
            f"else echo 'no such path' >&2; exit 2; fi && "
            f"mount --bind {q_cover} {q_path}"
        )

    def hide_python(self) -> None:
        """Make every python3 on the remote PATH vanish (``command -v`` fails in any shell),
        so that filesync uses its POSIX fallback there; :meth:`unhide` restores."""
        for directory in ("/usr/local/bin", "/usr/bin"):
            if not os.path.isdir(directory):
                continue
            for name in sorted(os.listdir(directory)):
                if re.fullmatch(r"python3(\.\d+)?", name):
                    self.whiteout(f"{directory}/{name}")
        probe = self.run_inside("command -v python3 || echo none")
        if probe.stdout.strip() != "none":
            raise RuntimeError(f"python3 still found on the remote: {probe.stdout.strip()}")

    def whiteout(self, path: str) -> None:
        """Make ``path`` vanish from its directory inside the container (as if deleted).

        Implemented as a read-only overlay over the parent directory whose top layer holds an
        overlayfs whiteout for the name; the host is untouched.  Afterwards ``ls``, ``stat``,
        ``command -v`` (bash and dash) and running it all fail as for a missing file.  The parent
        becomes read-only inside.  ``whiteout("/usr/bin/python3")`` plus
        ``whiteout("/usr/bin/python3.11")`` gives a remote without python3.  Sessions that
        started before keep whatever they had already opened.  :meth:`unhide` restores.
        """
        self._check_path(path)
        self._require_running()
        parent, name = os.path.split(path)
        names = self._whiteouts.setdefault(parent, set())
        names.add(name)
        self._remount_whiteouts(parent)

    def unhide(self, path: str) -> None:
        """Undo the latest :meth:`hide` or :meth:`whiteout` of ``path``."""
        self._check_path(path)
        self._require_running()
        parent, name = os.path.split(path)
        if name in self._whiteouts.get(parent, set()):
            self._whiteouts[parent].discard(name)
            self._remount_whiteouts(parent)
        else:
            self._run_inside_checked(f"umount -l {shlex.quote(path)}")

    def _remount_whiteouts(self, parent: str) -> None:
        names = self._whiteouts.get(parent, set())
        # One layer dir per parent, rebuilt on every change: overlayfs does not promise to
        # notice changes to a mounted layer, and stacking a new overlay per name would hit the
        # kernel's overlay stacking depth limit of 2.
        layer = f"{_INSIDE}/whiteouts/{parent.strip('/').replace('/', '_')}"
        q_parent, q_layer = shlex.quote(parent), shlex.quote(layer)
        script = []
        if parent in self._whiteout_mounts:
            script.append(f"umount -l {q_parent}")
            self._whiteout_mounts.discard(parent)
        script.append(f"rm -rf {q_layer} && mkdir -p {q_layer}")
        script += [f"mknod {shlex.quote(layer + '/' + n)} c 0 0" for n in sorted(names)]
        if names:
            options = f"ro,lowerdir={q_layer}:{q_parent}"
            script.append(f"mount -t overlay overlay -o {options} {q_parent}")
        else:
            self._whiteouts.pop(parent, None)
        self._run_inside_checked(" && ".join(script))
        if names:
            self._whiteout_mounts.add(parent)

    def session_pids(self) -> list[int]:
        """Host PIDs of the per-connection sshd processes (direct children of the listener)."""
        self._require_running()
        table = _process_table()
        return [pid for pid in _children(self.ns_pid, table) if table[pid][0] == "sshd"]

    def kill_sessions(self) -> int:
        """SIGKILL every per-connection sshd and its process tree; return how many connections.

        Every connection goes, whoever made it (on the shared session container, too).  The
        listening sshd stays, so new connections are accepted right away.  The kernel
        closes the killed connections' sockets, so clients see the connection drop (OpenSSH's
        ``ssh`` exits 255).  Returns after all killed processes are gone.

        A cut, never a command's end: every victim is stopped before any is killed, so no
        sshd is left running to tell its client that the command it serves died first
        (one killed in between would, on a loaded machine, and the client would then see
        the command end instead of the connection drop).
        """
        self._require_running()
        table = _process_table()
        sessions = [pid for pid in _children(self.ns_pid, table) if table[pid][0] == "sshd"]
        victims: set[int] = set(sessions)
        for pid in sessions:
            victims |= _descendants(pid, table)
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in victims:
                _signal(pid, sig)
        if not _wait_dead(victims, _STOP_TIMEOUT):
            raise RuntimeError(f"{self.alias}: session processes survived SIGKILL")
        return len(sessions)

    # -- the wire ---------------------------------------------------------------------------

    def wire_bytes(self) -> int:
        """rx_bytes + tx_bytes of the host-side veth: everything that crossed the "network"."""
        stats = Path("/sys/class/net", self.veth_host, "statistics")
        return int((stats / "rx_bytes").read_text()) + int((stats / "tx_bytes").read_text())

    def link_down(self) -> None:
        """Set the host-side veth down.

        New connections fail at once (a fallback ``unreachable`` route for the subnet keeps the
        packets from leaving by the default route); established ones stall (their packets are
        dropped) until the link comes back or their own timeouts fire -- use
        :meth:`kill_sessions` to cut them instantly.
        """
        _run(["ip", "link", "set", self.veth_host, "down"])

    def link_up(self) -> None:
        """Set the host-side veth up again (the kernel restores the route to the subnet)."""
        _run(["ip", "link", "set", self.veth_host, "up"])

    # -- host certificates ------------------------------------------------------------------

    def certify_host_key(self, ca_key: Path) -> Path:
        """Sign the host key with ``ca_key`` (principals: address and alias) and serve the cert.

        Adds ``HostCertificate`` to sshd_config and restarts a running sshd (the keys survive,
        so known_hosts stays valid).  Returns the certificate's host path.
        """
        pub = self.host_key.with_name(self.host_key.name + ".pub")
        _run(["ssh-keygen", "-q", "-s", str(ca_key), "-I", self.alias, "-h",
              "-n", f"{self.address},{self.alias}", str(pub)])
        cert = self.host_key.with_name(self.host_key.name + "-cert.pub")
        line = f"HostCertificate {_INSIDE}/{cert.name}\n"
        if line not in self.sshd_config.read_text():
            with self.sshd_config.open("a") as config:
                config.write(line)
        if self._proc is not None:
            self.stop()
            self.start()
        return cert
