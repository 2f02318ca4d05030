"""The SSH conduit against the in-process asyncssh server (fast, no root).

Every test runs with HOME pointing at an empty temp dir and no ssh-agent, so the
machine's own ~/.ssh never decides an outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import hashlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncssh
import pytest

from filesync.cli.demo_server import InProcessServer, start_server
from filesync.errors import ConnectionLost, TransportError
from filesync.transport.ssh.conduit import SshConduit, SshTarget, connect


@pytest.fixture(autouse=True)
def user_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "userhome"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return home


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[InProcessServer]:
    remote_home = tmp_path / "remote"
    remote_home.mkdir()
    srv = await start_server(remote_home)
    yield srv
    await srv.close()


@pytest.fixture
async def conduit(server: InProcessServer) -> AsyncIterator[SshConduit]:
    conn = await connect(SshTarget("demo"), ssh_config=server.ssh_config)
    yield conn
    await conn.close()


def one_line(exc: pytest.ExceptionInfo[TransportError]) -> str:
    message = str(exc.value)
    assert "\n" not in message, message
    return message


def write_config(path: Path, server: InProcessServer, *lines: str) -> Path:
    path.write_text("Host demo\n" + "".join(f"    {line}\n" for line in lines))
    return path


def new_key(path: Path) -> Path:
    key = asyncssh.generate_private_key("ssh-ed25519")
    key.write_private_key(path)
    key.write_public_key(path.with_suffix(".pub"))
    path.chmod(0o600)
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ---------------------------------------------------------------- running commands


async def test_command_output_exit_code_and_environment(
    conduit: SshConduit, server: InProcessServer
) -> None:
    done = await conduit.run('echo out; echo err >&2; pwd; echo "$HOME"; exit 3')
    assert done.returncode == 3
    assert done.stdout.decode().split() == ["out", str(server.home), str(server.home)]
    assert done.stderr == b"err\n"


async def test_stdin_reaches_the_command(conduit: SshConduit) -> None:
    done = await conduit.run("tr a-z A-Z", stdin=b"hello\x00\xff")
    assert done.returncode == 0
    assert done.stdout == b"HELLO\x00\xff"


async def test_twenty_megabytes_through_cat_arrive_intact(conduit: SshConduit) -> None:
    payload = os.urandom(20 << 20)
    proc = await conduit.start("cat")

    async def feed() -> None:
        for offset in range(0, len(payload), 1 << 20):
            await proc.write(payload[offset : offset + (1 << 20)])
        await proc.write_eof()

    feeder = asyncio.create_task(feed())
    received = hashlib.sha256()
    count = 0
    while count < len(payload):
        chunk = await proc.readexactly(min(3 << 20, len(payload) - count))
        received.update(chunk)
        count += len(chunk)
    await feeder
    assert await proc.read(1) == b""
    assert await proc.wait() == 0
    assert received.hexdigest() == hashlib.sha256(payload).hexdigest()
    assert conduit.bytes_sent == len(payload)
    assert conduit.bytes_received == len(payload)


async def test_unread_stderr_does_not_stall_stdout(conduit: SshConduit) -> None:
    # 12 MiB of stderr is more than the channel window: without a stderr drain
    # the server stops sending and stdout never arrives.
    proc = await conduit.start("head -c 12582912 /dev/zero >&2; echo done")
    await proc.write_eof()
    assert await proc.readexactly(5) == b"done\n"
    assert await proc.wait() == 0
    stderr = await proc.read_stderr()
    assert len(stderr) == 1 << 20  # the tail that is kept
    assert set(stderr) == {0}


async def test_kill_ends_the_remote_command(conduit: SshConduit, tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    proc = await conduit.start(f"echo $$ > {pidfile}; echo started; exec sleep 60")
    assert await proc.readexactly(8) == b"started\n"
    pid = int(pidfile.read_text())
    proc.kill()
    assert await proc.wait() == -signal.SIGKILL
    # The server delivers the signal asynchronously; wait (bounded) for it to land.
    for _ in range(500):
        if not Path(f"/proc/{pid}").exists() or "Z" in _state(pid):
            break
        await asyncio.sleep(0.01)
    assert not Path(f"/proc/{pid}").exists() or "Z" in _state(pid)


def _state(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    return "gone"


async def test_close_is_idempotent_and_final(server: InProcessServer) -> None:
    conn = await connect(SshTarget("demo"), ssh_config=server.ssh_config)
    await conn.close()
    await conn.close()
    with pytest.raises(ConnectionLost):
        await conn.start("true")


# ---------------------------------------------------------------- identity and ssh_config


async def test_alias_resolves_hostname_port_user_identityfile_knownhosts(
    server: InProcessServer, tmp_path: Path
) -> None:
    config = write_config(
        tmp_path / "config",
        server,
        f"HostName {server.host}",
        f"Port {server.port}",
        "User alice",
        f"IdentityFile {server.client_key}",
        f"UserKnownHostsFile {server.known_hosts}",
    )
    conn = await connect(SshTarget("demo"), ssh_config=config)
    try:
        assert conn.identity == f"ssh://alice@127.0.0.1:{server.port}"
        assert (await conn.run("echo $USER")).stdout == b"alice\n"
    finally:
        await conn.close()


async def test_target_user_and_port_override_the_config(
    server: InProcessServer, tmp_path: Path
) -> None:
    config = write_config(
        tmp_path / "config",
        server,
        f"HostName {server.host}",
        f"Port {free_port()}",  # wrong on purpose: the target's port wins
        "User alice",
        f"IdentityFile {server.client_key}",
        f"UserKnownHostsFile {server.known_hosts}",
    )
    conn = await connect(SshTarget("demo", user="bob", port=server.port), ssh_config=config)
    try:
        assert conn.identity == f"ssh://bob@127.0.0.1:{server.port}"
    finally:
        await conn.close()


async def test_default_config_key_and_known_hosts_in_home(
    server: InProcessServer, user_home: Path
) -> None:
    ssh_dir = user_home / ".ssh"
    ssh_dir.mkdir()
    (ssh_dir / "id_ed25519").write_bytes(server.client_key.read_bytes())
    (ssh_dir / "id_ed25519").chmod(0o600)
    (ssh_dir / "known_hosts").write_bytes(server.known_hosts.read_bytes())
    (ssh_dir / "config").write_text(
        f"Host demo\n    HostName {server.host}\n    Port {server.port}\n    User carol\n"
    )
    conn = await connect(SshTarget("demo"))  # no ssh_config: ~/.ssh/config is read
    try:
        assert conn.identity == f"ssh://carol@127.0.0.1:{server.port}"
    finally:
        await conn.close()


async def test_without_identityfile_the_login_fails(
    server: InProcessServer, tmp_path: Path
) -> None:
    config = write_config(
        tmp_path / "config",
        server,
        f"HostName {server.host}",
        f"Port {server.port}",
        f"UserKnownHostsFile {server.known_hosts}",
    )
    with pytest.raises(TransportError) as err:
        await connect(SshTarget("demo"), ssh_config=config)
    assert "authentication as" in one_line(err)


async def test_without_userknownhostsfile_the_host_is_unknown(
    server: InProcessServer, tmp_path: Path
) -> None:
    config = write_config(
        tmp_path / "config",
        server,
        f"HostName {server.host}",
        f"Port {server.port}",
        f"IdentityFile {server.client_key}",
    )
    with pytest.raises(TransportError) as err:
        await connect(SshTarget("demo"), ssh_config=config)
    assert "is unknown" in one_line(err)


async def test_missing_identity_files_in_config_are_skipped(
    server: InProcessServer, tmp_path: Path
) -> None:
    config = write_config(
        tmp_path / "config",
        server,
        f"HostName {server.host}",
        f"Port {server.port}",
        f"IdentityFile {tmp_path / 'no-such-key'}",
        f"IdentityFile {server.client_key}",
        f"UserKnownHostsFile {server.known_hosts}",
    )
    lines: list[str] = []
    conn = await connect(SshTarget("demo"), ssh_config=config, verbose=lines.append)
    try:
        assert (await conn.run("echo in")).stdout == b"in\n"
    finally:
        await conn.close()
    [offered] = [line for line in lines if "; keys: " in line]
    assert offered.endswith(f"; keys: {server.client_key}")  # the missing one is not offered


@pytest.fixture
def agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private ssh-agent; yields its socket (SSH_AUTH_SOCK is set)."""
    sock = tmp_path / "agent.sock"
    proc = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    try:
        for _ in range(500):
            if sock.exists():
                break
            proc.poll()
            assert proc.returncode is None, "ssh-agent exited"
            time.sleep(0.01)
        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
        yield sock
    finally:
        proc.terminate()
        proc.wait()


async def _ssh_add(key: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        "ssh-add", "-q", str(key), stderr=asyncio.subprocess.PIPE
    )
    _, err = await proc.communicate()
    assert proc.returncode == 0, err


async def test_agent_key_is_used(
    server: InProcessServer, tmp_path: Path, agent: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _ssh_add(server.client_key)
    config = write_config(
        tmp_path / "config",
        server,
        f"HostName {server.host}",
        f"Port {server.port}",
        f"UserKnownHostsFile {server.known_hosts}",
    )
    lines: list[str] = []
    conn = await connect(SshTarget("demo"), ssh_config=config, verbose=lines.append)
    try:
        assert (await conn.run("echo in")).stdout == b"in\n"
    finally:
        await conn.close()
    assert any(line.endswith("; keys: none") for line in lines), lines  # no key file at all
    # The agent is what logged in: without it, the same connect is refused.
    monkeypatch.delenv("SSH_AUTH_SOCK")
    with pytest.raises(TransportError) as err:
        await connect(SshTarget("demo"), ssh_config=config)
    assert "(tried: no keys found)" in one_line(err)


async def test_identitiesonly_keeps_other_agent_keys_out(
    server: InProcessServer, tmp_path: Path, agent: Path
) -> None:
    await _ssh_add(server.client_key)
    wrong = new_key(tmp_path / "wrong_key")
    base = [
        f"HostName {server.host}",
        f"Port {server.port}",
        f"UserKnownHostsFile {server.known_hosts}",
        f"IdentityFile {wrong}",
    ]
    # Without IdentitiesOnly the agent's (right) key is offered too...
    conn = await connect(SshTarget("demo"), ssh_config=write_config(tmp_path / "c1", server, *base))
    await conn.close()
    # ...with it, only the configured (wrong) key is.
    only = write_config(tmp_path / "c2", server, *base, "IdentitiesOnly yes")
    with pytest.raises(TransportError) as err:
        await connect(SshTarget("demo"), ssh_config=only)
    assert str(wrong) in one_line(err)


# ---------------------------------------------------------------- host keys


async def test_unknown_host_key_is_refused_with_instructions(
    server: InProcessServer, tmp_path: Path
) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with pytest.raises(TransportError) as err:
        await connect(SshTarget("demo"), ssh_config=server.ssh_config, known_hosts=empty)
    message = one_line(err)
    assert "unknown" in message
    assert f"ssh-keyscan -p {server.port} -t ed25519 127.0.0.1 >> {empty}" in message
    assert "--accept-new-host-key" in message
    assert empty.read_text() == ""


async def test_accept_new_host_key_stores_it_and_the_next_connect_verifies_it(
    server: InProcessServer, tmp_path: Path
) -> None:
    store = tmp_path / "sub" / "known_hosts"  # directory created on demand
    conn = await connect(
        SshTarget("demo"),
        ssh_config=server.ssh_config,
        known_hosts=store,
        accept_new_host_key=True,
    )
    await conn.close()
    stored = store.read_text()
    assert stored == server.known_hosts.read_text()  # "[127.0.0.1]:PORT ssh-ed25519 KEY"
    conn = await connect(SshTarget("demo"), ssh_config=server.ssh_config, known_hosts=store)
    await conn.close()
    assert store.read_text() == stored  # not appended twice


async def test_accept_new_appends_to_an_existing_file(
    server: InProcessServer, tmp_path: Path
) -> None:
    store = tmp_path / "known_hosts"
    other = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
    store.write_text(f"otherhost {other}")  # no trailing newline
    conn = await connect(
        SshTarget("demo"),
        ssh_config=server.ssh_config,
        known_hosts=store,
        accept_new_host_key=True,
    )
    await conn.close()
    assert store.read_text() == f"otherhost {other}\n" + server.known_hosts.read_text()


async def test_changed_host_key_is_refused_even_with_accept_new(
    server: InProcessServer, tmp_path: Path
) -> None:
    impostor = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{server.port} {impostor}\n")
    before = known.read_text()
    with pytest.raises(TransportError) as err:
        await connect(
            SshTarget("demo"),
            ssh_config=server.ssh_config,
            known_hosts=known,
            accept_new_host_key=True,
        )
    message = one_line(err)
    assert "CHANGED" in message
    assert f"ssh-keygen -R '[127.0.0.1]:{server.port}' -f {known}" in message
    assert known.read_text() == before


async def test_unparsable_known_hosts_lines_are_skipped(
    server: InProcessServer, tmp_path: Path
) -> None:
    known = tmp_path / "known_hosts"
    # Bad lines before and after the server's entry: only they are skipped, not the file.
    text = "garbage\n@bogus-marker x y\n" + server.known_hosts.read_text() + "trailing\n"
    known.write_text(text)
    conn = await connect(SshTarget("demo"), ssh_config=server.ssh_config, known_hosts=known)
    try:
        assert (await conn.run("echo in")).stdout == b"in\n"
    finally:
        await conn.close()
    assert known.read_text() == text  # verified by the entry, nothing added or rewritten


# ---------------------------------------------------------------- connection errors


async def test_wrong_key_gives_the_authentication_message(
    server: InProcessServer, tmp_path: Path
) -> None:
    wrong = new_key(tmp_path / "wrong_key")
    config = tmp_path / "empty_config"
    config.write_text("")
    with pytest.raises(TransportError) as err:
        await connect(
            SshTarget("127.0.0.1", user="dave", port=server.port),
            ssh_config=config,
            identity=wrong,
            known_hosts=server.known_hosts,
        )
    message = one_line(err)
    assert f"authentication as dave on dave@127.0.0.1:{server.port} failed" in message
    assert str(wrong) in message
    assert "-i KEY" in message


async def test_connection_refused(tmp_path: Path) -> None:
    config = tmp_path / "empty_config"
    config.write_text("")
    port = free_port()
    with pytest.raises(TransportError) as err:
        await connect(SshTarget("127.0.0.1", port=port), ssh_config=config)
    message = one_line(err)
    assert f"127.0.0.1:{port} refused" in message
    assert "sshd" in message


async def test_unresolvable_host_name(tmp_path: Path) -> None:
    config = tmp_path / "empty_config"
    config.write_text("")
    with pytest.raises(TransportError) as err:
        await connect(SshTarget("no-such-host.invalid"), ssh_config=config)
    assert "cannot resolve host name 'no-such-host.invalid'" in one_line(err)


async def test_silent_server_times_out(tmp_path: Path) -> None:
    # A listener that never speaks SSH: the connect timeout must end the attempt.
    listener = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    config = tmp_path / "empty_config"
    config.write_text("")
    try:
        with pytest.raises(TransportError) as err:
            await connect(SshTarget("127.0.0.1", port=port), ssh_config=config, connect_timeout=0.3)
    finally:
        listener.close()
    assert "timed out after 0.3s" in one_line(err)


async def test_missing_identity_file_argument(server: InProcessServer, tmp_path: Path) -> None:
    with pytest.raises(TransportError) as err:
        await connect(SshTarget("demo"), ssh_config=server.ssh_config, identity=tmp_path / "nokey")
    assert "-i" in one_line(err)


async def test_missing_ssh_config_argument(tmp_path: Path) -> None:
    with pytest.raises(TransportError) as err:
        await connect(SshTarget("demo"), ssh_config=tmp_path / "nope")
    assert "does not exist" in one_line(err)


# ---------------------------------------------------------------- losing the connection


async def test_dropped_connection_mid_read_raises_connection_lost(
    conduit: SshConduit, server: InProcessServer
) -> None:
    proc = await conduit.start("cat")
    await proc.write(b"ping")
    assert await proc.readexactly(4) == b"ping"
    server.drop_connections()
    with pytest.raises(ConnectionLost) as err:
        await proc.readexactly(4)
    message = str(err.value)
    assert "\n" not in message
    assert f"connection to {getpass.getuser()}@demo (127.0.0.1:{server.port}) lost" in message
    assert "rerun" in message
    with pytest.raises(ConnectionLost):
        await conduit.start("true")


async def test_server_shutdown_mid_read_raises_connection_lost(
    conduit: SshConduit, server: InProcessServer
) -> None:
    proc = await conduit.start("cat")
    reader = asyncio.create_task(proc.readexactly(10))
    await proc.write(b"12345")
    await server.close()
    with pytest.raises(ConnectionLost) as err:
        await reader
    assert "lost" in str(err.value)


async def test_dropped_connection_during_write_raises_connection_lost(
    conduit: SshConduit, server: InProcessServer
) -> None:
    proc = await conduit.start("sleep 60")  # never reads: the window fills up
    chunk = b"x" * (1 << 20)

    async def flood() -> None:
        while True:
            await proc.write(chunk)

    writer = asyncio.create_task(flood())
    while conduit.bytes_sent < 2 << 20:  # the first MiBs go out before the drop
        await asyncio.sleep(0.01)
    server.drop_connections()
    with pytest.raises(ConnectionLost) as err:
        await writer
    assert "lost" in str(err.value)


async def test_command_ending_early_is_not_reported_as_a_lost_connection(
    conduit: SshConduit,
) -> None:
    proc = await conduit.start("printf abc")
    with pytest.raises(ConnectionLost) as err:
        await proc.readexactly(10)
    assert "remote command" in str(err.value)
    assert "ended mid-stream" in str(err.value)
    assert await proc.wait() == 0


async def test_dev_null_as_ssh_config_means_no_config(tmp_path: Path) -> None:
    from filesync.cli.demo_server import start_server
    from filesync.transport.ssh.conduit import SshTarget, connect

    server = await start_server(tmp_path)
    try:
        conduit = await connect(
            SshTarget(server.host, port=server.port), ssh_config=Path("/dev/null"),
            identity=server.client_key, known_hosts=server.known_hosts,
        )
        try:
            done = await conduit.run("echo hello")
            assert done.stdout == b"hello\n"
        finally:
            await conduit.close()
    finally:
        await server.close()


def test_a_jump_port_of_non_ascii_digits_is_not_taken_for_a_port() -> None:
    from filesync.transport.ssh.config import parse_jump

    assert parse_jump("user@jump:2222") == ("user", "jump", 2222)
    assert parse_jump("jump:²") == (None, "jump:²", None)  # int('²') raises
    assert parse_jump("[::1]:٣") == (None, "::1", None)
