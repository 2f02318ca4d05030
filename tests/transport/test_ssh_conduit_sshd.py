"""The SSH conduit against a real OpenSSH sshd (namespaced container, needs root).

Uses the ``sshd`` fixture (a started ``tests/sshd.py`` container: ``.alias``,
``.ssh_config``, ``.client_key``, ``.known_hosts``, ``.home``, ``.address``), which
skips when namespaces are unavailable. HOME is an empty temp dir and there is no
ssh-agent, so the machine's own ~/.ssh never decides an outcome.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path
from typing import Any

import asyncssh
import pytest

from filesync.errors import ConnectionLost, TransportError
from filesync.transport.ssh.conduit import SshTarget, connect

pytestmark = pytest.mark.sshd


@pytest.fixture(autouse=True)
def user_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "userhome"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return home


def one_line(exc: pytest.ExceptionInfo[TransportError]) -> str:
    message = str(exc.value)
    assert "\n" not in message, message
    return message


def host_block(name: str, box: Any, *extra: str) -> str:
    lines = [
        f"Host {name}",
        f"    HostName {box.address}",
        "    User root",
        f"    IdentityFile {box.client_key}",
        "    IdentitiesOnly yes",
        f"    UserKnownHostsFile {box.known_hosts}",
        "    GlobalKnownHostsFile /dev/null",
        *(f"    {line}" for line in extra),
    ]
    return "\n".join(lines) + "\n"


async def test_runs_commands_with_aes_gcm(sshd: Any) -> None:
    conn = await connect(SshTarget(sshd.alias), ssh_config=sshd.ssh_config)
    try:
        assert conn.identity == f"ssh://root@{sshd.address}:22"
        assert conn.cipher == "aes128-gcm@openssh.com"
        done = await conn.run('echo "$HOME"; python3 -c "print(6*7)"; echo err >&2; exit 5')
        assert done.returncode == 5
        assert done.stdout == b"/root\n42\n"
        assert done.stderr == b"err\n"
    finally:
        await conn.close()


async def test_twenty_megabytes_through_cat_arrive_intact(sshd: Any) -> None:
    conn = await connect(SshTarget(sshd.alias), ssh_config=sshd.ssh_config)
    try:
        payload = os.urandom(20 << 20)
        proc = await conn.start("cat")

        async def feed() -> None:
            for offset in range(0, len(payload), 1 << 20):
                await proc.write(payload[offset : offset + (1 << 20)])
            await proc.write_eof()

        feeder = asyncio.create_task(feed())
        digest = hashlib.sha256(await proc.readexactly(len(payload))).hexdigest()
        await feeder
        assert await proc.wait() == 0
        assert digest == hashlib.sha256(payload).hexdigest()
        assert conn.bytes_sent == conn.bytes_received == len(payload)
    finally:
        await conn.close()


async def test_unknown_host_key_is_refused(sshd: Any, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with pytest.raises(TransportError) as err:
        await connect(SshTarget(sshd.alias), ssh_config=sshd.ssh_config, known_hosts=empty)
    message = one_line(err)
    assert f"ssh-keyscan -t ed25519 {sshd.address} >> {empty}" in message
    assert "--accept-new-host-key" in message


async def test_accept_new_host_key_stores_it(sshd: Any, tmp_path: Path) -> None:
    store = tmp_path / "known_hosts"
    conn = await connect(
        SshTarget(sshd.alias),
        ssh_config=sshd.ssh_config,
        known_hosts=store,
        accept_new_host_key=True,
    )
    await conn.close()
    stored = store.read_text()
    assert stored == sshd.known_hosts.read_text()  # "ADDR ssh-ed25519 KEY"
    conn = await connect(SshTarget(sshd.alias), ssh_config=sshd.ssh_config, known_hosts=store)
    try:
        assert (await conn.run("echo in")).stdout == b"in\n"
    finally:
        await conn.close()
    assert store.read_text() == stored  # verified by the stored entry, not appended twice


async def test_changed_host_key_is_refused(sshd: Any, tmp_path: Path) -> None:
    impostor = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
    known = tmp_path / "known_hosts"
    known.write_text(f"{sshd.address} {impostor}\n")
    with pytest.raises(TransportError) as err:
        await connect(
            SshTarget(sshd.alias),
            ssh_config=sshd.ssh_config,
            known_hosts=known,
            accept_new_host_key=True,
        )
    message = one_line(err)
    assert "CHANGED" in message
    assert f"ssh-keygen -R '{sshd.address}' -f {known}" in message


async def test_wrong_key_is_refused(sshd: Any, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong_key"
    asyncssh.generate_private_key("ssh-ed25519").write_private_key(wrong)
    config = tmp_path / "config"
    config.write_text(host_block("box", sshd).replace(str(sshd.client_key), str(wrong)))
    with pytest.raises(TransportError) as err:
        await connect(SshTarget("box"), ssh_config=config)
    message = one_line(err)
    assert "authentication as root on root@box" in message
    assert str(wrong) in message


async def test_closed_port_is_refused(sshd: Any, tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text(host_block("box", sshd, "Port 2222"))
    with pytest.raises(TransportError) as err:
        await connect(SshTarget("box"), ssh_config=config)
    assert f"{sshd.address}:2222) refused" in one_line(err)


async def test_killed_session_raises_connection_lost(sshd: Any) -> None:
    conn = await connect(SshTarget(sshd.alias), ssh_config=sshd.ssh_config)
    try:
        proc = await conn.start("cat")
        await proc.write(b"ping")
        assert await proc.readexactly(4) == b"ping"
        # The per-connection sshd ("sshd: root@notty"), not the listener.
        killed = sshd.run_inside("pkill -KILL -f '^sshd: root'")
        assert killed.returncode == 0, killed.stderr
        with pytest.raises(ConnectionLost) as err:
            await proc.readexactly(4)
        assert "lost" in str(err.value)
        assert "rerun" in str(err.value)
    finally:
        await conn.close()


async def test_proxyjump_hops_through_the_jump_host(sshd: Any, tmp_path: Path) -> None:
    # The jump host reaches the target at the target's own address, so the
    # session's SSH_CONNECTION shows the jump host as the client, not this host.
    config = tmp_path / "config"
    config.write_text(host_block("jump", sshd) + host_block("target", sshd, "ProxyJump jump"))
    lines: list[str] = []
    conn = await connect(SshTarget("target"), ssh_config=config, verbose=lines.append)
    try:
        client_ip = (await conn.run("echo $SSH_CONNECTION")).stdout.split()[0].decode()
        assert client_ip == sshd.address
        assert conn.identity == f"ssh://root@{sshd.address}:22"
        assert conn.cipher == "aes128-gcm@openssh.com"
        assert any("via jump" in line for line in lines)
    finally:
        await conn.close()
    # Without ProxyJump the client is the host end of the veth pair.
    config.write_text(host_block("target", sshd))
    direct = await connect(SshTarget("target"), ssh_config=config)
    try:
        assert (await direct.run("echo $SSH_CONNECTION")).stdout.split()[0].decode() != (
            sshd.address
        )
    finally:
        await direct.close()


async def test_proxyjump_unknown_jump_host_key_is_named(sshd: Any, tmp_path: Path) -> None:
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    config = tmp_path / "config"
    config.write_text(
        host_block("jump", sshd).replace(str(sshd.known_hosts), str(empty))
        + host_block("target", sshd, "ProxyJump jump")
    )
    with pytest.raises(TransportError) as err:
        await connect(SshTarget("target"), ssh_config=config)
    message = one_line(err)
    assert "host key of jump host root@jump" in message
    assert str(empty) in message


async def test_proxyjump_target_unreachable_from_the_jump_host(sshd: Any, tmp_path: Path) -> None:
    config = tmp_path / "config"
    # Nothing listens on the jump host's loopback, so its sshd reports "refused".
    target = host_block("target", sshd, "ProxyJump jump").replace(
        f"HostName {sshd.address}", "HostName 127.0.0.1"
    )
    config.write_text(host_block("jump", sshd) + target)
    with pytest.raises(TransportError) as err:
        await connect(SshTarget("target"), ssh_config=config)
    assert "jump host could not reach root@target (127.0.0.1)" in one_line(err)
