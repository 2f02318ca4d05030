"""``master.terminate``: ending a master over its control socket's own protocol.

Against small Unix-socket servers that answer as an OpenSSH master does (PROTOCOL.mux:
a hello, then the terminate request's reply or the socket closing as the master exits),
or otherwise. Whatever is not a master's answer is False, and the caller then runs
``ssh -O exit``. A real master is ended this way in ``test_openssh_master.py``.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from filesync.transport.ssh.master import (
    MUX_C_TERMINATE,
    MUX_MSG_HELLO,
    MUX_S_OK,
    MUX_VERSION,
    terminate,
)

MUX_S_PERMISSION_DENIED = 0x80000002


def packet(*words: int, tail: bytes = b"") -> bytes:
    body = struct.pack(f">{len(words)}I", *words) + tail
    return struct.pack(">I", len(body)) + body


def read_packet(conn: socket.socket) -> bytes:
    head = conn.recv(4, socket.MSG_WAITALL)
    (size,) = struct.unpack(">I", head)
    return conn.recv(size, socket.MSG_WAITALL)


Answer = Callable[[socket.socket], None]


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[[Answer], str]]:
    """A one-connection Unix-socket server running ``answer``; returns its path."""
    threads: list[threading.Thread] = []
    socks: list[socket.socket] = []
    seen: list[bytes] = []

    def start(answer: Answer) -> str:
        path = str(tmp_path / "sock")
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(path)
        server.listen(1)
        socks.append(server)

        def run() -> None:
            conn, _ = server.accept()
            with conn:
                seen.append(read_packet(conn))  # the client's hello
                answer(conn)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        threads.append(thread)
        return path

    yield start
    for thread in threads:
        thread.join(30)
    for server in socks:
        server.close()
    # every client hello was version 4's
    assert all(s == struct.pack(">II", MUX_MSG_HELLO, MUX_VERSION) for s in seen)


def master_ok(conn: socket.socket) -> None:
    conn.sendall(packet(MUX_MSG_HELLO, MUX_VERSION))
    request = read_packet(conn)
    assert struct.unpack(">II", request) == (MUX_C_TERMINATE, 1)
    conn.sendall(packet(MUX_S_OK, 1))


def master_gone_before_replying(conn: socket.socket) -> None:
    conn.sendall(packet(MUX_MSG_HELLO, MUX_VERSION))
    read_packet(conn)  # then it exits: the socket closes without an answer


def master_refuses(conn: socket.socket) -> None:
    conn.sendall(packet(MUX_MSG_HELLO, MUX_VERSION))
    read_packet(conn)
    reason = b"Permission denied"
    conn.sendall(packet(MUX_S_PERMISSION_DENIED, 1, tail=struct.pack(">I", len(reason))
                        + reason))


def other_version(conn: socket.socket) -> None:
    conn.sendall(packet(MUX_MSG_HELLO, MUX_VERSION + 1))


def not_a_master(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")


def silent_close(conn: socket.socket) -> None:
    pass  # closes without even a hello


@pytest.mark.parametrize(("answer", "ended"), [
    (master_ok, True),
    (master_gone_before_replying, True),
    (master_refuses, False),
    (other_version, False),
    (not_a_master, False),
    (silent_close, False),
])
def test_only_a_masters_answer_counts_as_ended(
    serve: Callable[[Answer], str], answer: Answer, ended: bool
) -> None:
    assert terminate(serve(answer), timeout=30) is ended


def test_no_socket_is_not_ended(tmp_path: Path) -> None:
    assert terminate(str(tmp_path / "missing")) is False
