"""The namespaced sshd container (tests/sshd.py) works with the real OpenSSH client."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from sshd import SshdContainer

pytestmark = pytest.mark.sshd

Factory = Callable[[int], SshdContainer]


def ssh(
    box: SshdContainer,
    command: str,
    *,
    config: Path | None = None,
    host: str | None = None,
    data: bytes | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """Run ``command`` on ``box`` with the OpenSSH client (bytes in and out)."""
    return subprocess.run(
        [
            "ssh",
            "-F",
            str(config or box.ssh_config),
            "-o",
            "ConnectTimeout=10",
            host or box.alias,
            command,
        ],
        input=data,
        stdin=None if data is not None else subprocess.DEVNULL,
        capture_output=True,
        timeout=60,
        check=False,
    )


def ssh_text(box: SshdContainer, command: str, *, config: Path | None = None) -> tuple[int, str]:
    """(exit status, stdout + stderr as text) of ``command`` run on ``box`` over ssh."""
    result = ssh(box, command, config=config)
    return result.returncode, (result.stdout + result.stderr).decode(errors="replace")


def test_echo_and_hostname_via_alias_and_address(sshd: SshdContainer) -> None:
    for host in (sshd.alias, sshd.address):
        result = ssh(sshd, "echo ok; hostname", host=host)
        assert result.returncode == 0, result.stderr
        assert result.stdout.decode().splitlines() == ["ok", "remote"]


def test_session_environment_is_clean(sshd: SshdContainer) -> None:
    code, out = ssh_text(sshd, 'echo "$HOME"; echo "$PATH"; command -v python3; ls -A ~')
    assert code == 0, out
    home, path, python, *home_entries = out.splitlines()
    assert home == "/root"
    assert "pyenv" not in path and "/usr/bin" in path.split(":")
    assert python == "/usr/bin/python3"  # the host's system python, not pyenv's
    # the real /root (pyenv init in .bashrc) is not there; other tests may have left files
    assert ".ssh" in home_entries
    assert not {".bashrc", ".profile", ".pyenv"} & set(home_entries)


def test_ssh_environment_file_is_honoured(sshd_factory: Factory) -> None:
    box = sshd_factory(1)
    (box.home / ".ssh" / "environment").write_text("FILESYNC_PROBE=from-environment\n")
    code, out = ssh_text(box, 'echo "$FILESYNC_PROBE"')
    assert (code, out.strip()) == (0, "from-environment")


def test_file_written_over_ssh_appears_in_home(sshd: SshdContainer) -> None:
    name = f"probe-{uuid.uuid4().hex}"
    try:
        code, out = ssh_text(sshd, f"mkdir -p ~/sub && printf 'hello %s' remote > ~/sub/{name}")
        assert code == 0, out
        assert (sshd.home / "sub" / name).read_text() == "hello remote"
    finally:
        (sshd.home / "sub" / name).unlink(missing_ok=True)


def test_strict_host_key_checking_refuses_a_wrong_key(sshd: SshdContainer, tmp_path: Path) -> None:
    impostor = tmp_path / "impostor"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(impostor)], check=True)
    key_type, key = impostor.with_suffix(".pub").read_text().split()[:2]
    assert f"{key_type} {key}" != sshd.host_key_pub
    wrong_known_hosts = tmp_path / "known_hosts"
    wrong_known_hosts.write_text(f"{sshd.address} {key_type} {key}\n")
    config = tmp_path / "ssh_config"
    original = sshd.ssh_config.read_text()
    assert str(sshd.known_hosts) in original
    config.write_text(original.replace(str(sshd.known_hosts), str(wrong_known_hosts)))

    code, out = ssh_text(sshd, "echo should-not-run", config=config)
    assert code == 255
    assert "Host key verification failed" in out
    assert "should-not-run" not in out
    # the same command with the real known_hosts goes through: only the key made the difference
    assert ssh_text(sshd, "echo should-run") == (0, "should-run\n")


def test_hide_makes_python3_fail_while_sh_works(sshd_factory: Factory) -> None:
    box = sshd_factory(2)
    assert ssh_text(box, "python3 -c 'print(6 * 7)'") == (0, "42\n")

    box.hide("/usr/bin/python3.11")
    code, out = ssh_text(box, "python3 -c 'print(6 * 7)'")
    assert code == 126 and "Permission denied" in out
    assert ssh_text(box, "sh -c 'echo sh-works'") == (0, "sh-works\n")
    # only inside: the host's python is untouched
    assert os.access("/usr/bin/python3.11", os.X_OK)

    box.unhide("/usr/bin/python3.11")
    assert ssh_text(box, "python3 -c 'print(6 * 7)'") == (0, "42\n")


def test_hide_covers_a_directory_with_an_empty_one(sshd_factory: Factory) -> None:
    box = sshd_factory(3)
    (box.home / "data").mkdir()
    (box.home / "data" / "secret").write_text("x")
    box.hide("/root/data")
    assert ssh_text(box, "ls -A /root/data") == (0, "")
    assert (box.home / "data" / "secret").exists()  # host side unchanged


def test_whiteout_removes_python3_from_the_remote(sshd_factory: Factory) -> None:
    box = sshd_factory(4)
    box.whiteout("/usr/bin/python3")
    box.whiteout("/usr/bin/python3.11")

    assert ssh_text(box, "command -v python3") == (1, "")
    code, out = ssh_text(box, "python3 -c 1")
    assert code == 127 and "command not found" in out
    assert box.run_inside("command -v python3").returncode != 0  # dash agrees with bash
    assert ssh_text(box, "sh -c 'echo sh-works'") == (0, "sh-works\n")
    assert os.access("/usr/bin/python3", os.X_OK)  # host untouched

    box.unhide("/usr/bin/python3")
    box.unhide("/usr/bin/python3.11")
    assert ssh_text(box, "command -v python3") == (0, "/usr/bin/python3\n")


def test_wire_bytes_grow_by_at_least_a_transferred_megabyte(sshd: SshdContainer) -> None:
    payload = os.urandom(1_000_000)  # random: nothing on the way can compress it
    name = f"blob-{uuid.uuid4().hex}"
    before = sshd.wire_bytes()
    try:
        result = ssh(sshd, f"cat > ~/{name}", data=payload)
        assert result.returncode == 0, result.stderr
        after = sshd.wire_bytes()
        assert (sshd.home / name).read_bytes() == payload
    finally:
        (sshd.home / name).unlink(missing_ok=True)
    assert after - before >= len(payload)


def test_kill_sessions_cuts_a_running_session(sshd: SshdContainer) -> None:
    with subprocess.Popen(
        # far longer than the wait below: exit 255 within it can only be the cut
        ["ssh", "-F", str(sshd.ssh_config), sshd.alias, "echo started; exec sleep 600"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as client:
        try:
            assert client.stdout is not None and client.stderr is not None
            assert client.stdout.readline() == "started\n"  # the session is really up
            assert sshd.kill_sessions() >= 1
            assert client.wait(timeout=120) == 255  # sleep 600 did not get to finish
            assert "closed by remote host" in client.stderr.read()
        finally:
            if client.poll() is None:
                client.kill()
    assert sshd.session_pids() == []
    # the listener survived: new connections work
    assert ssh_text(sshd, "echo still-serving") == (0, "still-serving\n")


def test_two_containers_run_at_once(sshd_factory: Factory) -> None:
    first, second = sshd_factory(5), sshd_factory(6)
    assert first.address != second.address and first.alias != second.alias
    command = 'echo "$SSH_CONNECTION" > ~/where; sleep 1; cat ~/where'
    clients = [
        subprocess.Popen(
            ["ssh", "-F", str(box.ssh_config), box.alias, command],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
        )
        for box in (first, second)
    ]
    outputs = [client.communicate(timeout=60)[0] for client in clients]
    assert [client.returncode for client in clients] == [0, 0]
    for box, out in zip((first, second), outputs, strict=True):
        # SSH_CONNECTION = client-ip client-port server-ip server-port
        assert out.split()[2:] == [box.address, "22"]
        assert (box.home / "where").read_text() == out
    assert first.home != second.home


def test_nsenter_argv_gives_a_shell_inside(sshd: SshdContainer) -> None:
    result = subprocess.run(
        [*sshd.nsenter_argv(), "sh", "-c", "hostname"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert (result.returncode, result.stdout) == (0, "remote\n")
    inside = sshd.run_inside("pwd; ip -o -4 addr show scope global")
    assert inside.returncode == 0, inside.stderr
    cwd, *addresses = inside.stdout.splitlines()
    assert cwd == "/root"
    assert len(addresses) == 1 and f"inet {sshd.address}/24" in addresses[0]


def test_link_down_refuses_new_connections_until_link_up(sshd_factory: Factory) -> None:
    box = sshd_factory(7)
    box.link_down()
    code, out = ssh_text(box, "echo unreachable")
    # refused locally by the fallback route: nothing went out via the default route
    assert code == 255 and "No route to host" in out
    box.link_up()
    assert ssh_text(box, "echo reachable") == (0, "reachable\n")


def test_stop_leaves_nothing_and_restart_keeps_the_keys(sshd_factory: Factory) -> None:
    box = sshd_factory(8)
    ns_pid, veth = box.ns_pid, Path("/sys/class/net", box.veth_host)
    assert veth.exists() and box.running
    box.stop()
    assert not veth.exists()
    assert not box.running and box.ns_pid == 0
    assert not Path(f"/proc/{ns_pid}").exists() or "Z" in Path(f"/proc/{ns_pid}/stat").read_text()
    assert (
        f"10.203.{box.index}.0/24"
        not in subprocess.run(["ip", "route"], capture_output=True, text=True, check=True).stdout
    )
    box.stop()  # idempotent

    box.start()  # same keys, so the same known_hosts still verifies the host
    assert ssh_text(box, "echo again") == (0, "again\n")


def test_an_index_is_exclusive_while_started(sshd: SshdContainer, tmp_path: Path) -> None:
    rival = SshdContainer(tmp_path / "rival", index=sshd.index)
    with pytest.raises(RuntimeError, match="in use"):
        rival.start()
    rival.stop()  # harmless on a container that never started
    assert ssh_text(sshd, "echo unharmed") == (0, "unharmed\n")


def test_failed_start_reports_the_log_and_cleans_up(sshd_factory: Factory, tmp_path: Path) -> None:
    del sshd_factory  # requested only for its skip-or-fail check
    box = SshdContainer(tmp_path / "broken", index=9)
    with box.sshd_config.open("a") as config:
        config.write("NoSuchOption yes\n")
    with pytest.raises(RuntimeError, match="Bad configuration option"):
        box.start()
    assert not box.running
    assert not Path("/sys/class/net", box.veth_host).exists()
    # the index lock was released: a fresh container on the index starts
    with SshdContainer(tmp_path / "fixed", index=9) as fixed:
        assert ssh_text(fixed, "echo fixed") == (0, "fixed\n")
