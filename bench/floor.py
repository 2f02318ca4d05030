"""Floors: the least a CPython tool with a CPython helper over ssh can do.

``python3 -S floor.py start SSH_CONFIG HOST`` runs ``ssh HOST python3 -I -S -c pass`` and
waits for it: this interpreter's start, ssh's login and one session, and the remote
interpreter's start, the fixed cost any such tool pays before it does anything.

``python3 -S floor.py push SSH_CONFIG HOST REMOTE_DIR LOCAL_DIR`` walks ``LOCAL_DIR`` (scandir,
one stat per entry), reads every file whole, and streams ``path, bytes, mtime`` records
through one ``ssh HOST python3 -I -S -c RECEIVER``; the receiver writes each file to a
temp name, sets its mtime and renames it into place. No hashing, no fsync, no state, no
per-file results, no path-safety checks, no exclusions: everything filesync must do more
is left out. ``bench/run.py`` times both beside filesync and rsync, so the gap to rsync
that no CPython implementation of the protocol can close shows in the same run.
"""

from __future__ import annotations

import os
import shlex
import struct
import subprocess
import sys
from typing import IO

RECORD = struct.Struct(">IIQ")  # path length, data length, mtime_ns

RECEIVER = r"""
import os, struct, sys
root = os.path.expanduser(sys.argv[1])
os.makedirs(root, exist_ok=True)
read = sys.stdin.buffer.read
made = set()
while True:
    head = read(16)
    if len(head) < 16:
        break
    plen, dlen, mtime = struct.unpack(">IIQ", head)
    rel = read(plen).decode()
    data = read(dlen)
    parent, _, name = rel.rpartition("/")
    where = root + "/" + parent
    if parent not in made:
        os.makedirs(where, exist_ok=True)
        made.add(parent)
    tmp = where + "/.floor." + name
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.write(fd, data)
    os.utime(fd, ns=(mtime, mtime))
    os.close(fd)
    os.rename(tmp, where + "/" + name)
"""


def send(top: str, prefix: str, out: IO[bytes]) -> None:
    with os.scandir(top) as it:
        for entry in it:
            if entry.is_dir(follow_symlinks=False):
                send(entry.path, prefix + entry.name + "/", out)
                continue
            st = entry.stat(follow_symlinks=False)
            fd = os.open(entry.path, os.O_RDONLY)
            try:
                data = os.read(fd, st.st_size + 1)
            finally:
                os.close(fd)
            rel = (prefix + entry.name).encode()
            out.write(RECORD.pack(len(rel), len(data), st.st_mtime_ns) + rel + data)


def main() -> int:
    mode, cfg, host, *rest = sys.argv[1:]
    if mode == "start":
        return subprocess.call(["ssh", "-F", cfg, host, "python3 -I -S -c pass"])
    remote_dir, local_dir = rest
    command = f"python3 -I -S -c {shlex.quote(RECEIVER)} {shlex.quote(remote_dir)}"
    proc = subprocess.Popen(["ssh", "-F", cfg, host, command], stdin=subprocess.PIPE,
                            bufsize=1 << 20)
    assert proc.stdin is not None
    send(local_dir, "", proc.stdin)
    proc.stdin.close()
    return proc.wait()


if __name__ == "__main__":
    sys.exit(main())
