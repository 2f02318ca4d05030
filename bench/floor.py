"""Floors: the least a CPython tool with a CPython helper over ssh can do.

``python3 -S floor.py start SSH_CONFIG HOST`` runs ``ssh HOST python3 -I -S -c pass`` and
waits for it: this interpreter's start, ssh's login and one session, and the remote
interpreter's start, the fixed cost any such tool pays before it does anything.

``python3 -S floor.py push SSH_CONFIG HOST REMOTE_DIR LOCAL_DIR`` walks ``LOCAL_DIR`` (scandir,
one stat per entry), reads every file whole, and streams ``path, bytes, mtime`` records
through one ``ssh HOST python3 -I -S -c RECEIVER``; the receiver writes each file to a
temp name, sets its mtime and renames it into place. No hashing, no fsync, no state, no
per-file results, no path-safety checks, no exclusions: everything filesync must do more
is left out.

``python3 -S floor.py pull SSH_CONFIG HOST REMOTE_DIR LOCAL_DIR STATE EXCLUDED...`` is the
least a stateful CPython pull does: one ``ssh HOST python3 -I -S -c LISTER``, whose
interpreter walks ``REMOTE_DIR`` (scandir, one stat per file, directories named in
``EXCLUDED`` pruned) and sends one ``path, size, mtime`` line per file. This side compares
them with the listing it kept in ``STATE`` (JSON) from its last run, sends back the paths
that differ, and the lister answers with their bytes on the same session; each is written
to a temp name, given its mtime and renamed into place, files gone from the listing are
unlinked, and the new listing replaces ``STATE``. No hashing, no fsync, no host walk (so
no check that a host file changed before it is overwritten), no journal, no undo copies,
no path-safety checks: again everything filesync must do more is left out.

``python3 -S floor.py sync SSH_CONFIG HOST REMOTE_DIR LOCAL_DIR STATE EXCLUDED...`` is the
least a stateful CPython two-way sync does: the ``pull`` floor's walk on both sides (the
host's while ssh logs in) and its listing of the last run in ``STATE``; a path that changed
on one side only since that listing is copied to the other (or deleted there, when it was
deleted), both ways on the one session, and the new listing replaces ``STATE``. A path that
changed on both sides is left as it is. No hashing, no fsync, no check that a file changed
again before it is overwritten, no journal, no undo copies, no path-safety checks.

``bench/run.py`` times them beside filesync, rsync and unison, so the gap to rsync that no CPython
implementation of the protocol can close shows in the same run.
"""

from __future__ import annotations

import os
import shlex
import struct
import subprocess
import sys
from typing import IO, Any

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


WALK = r"""
import os, sys


def walk(root, pruned):
    rows = {}
    stack = [(root, "")]
    while stack:
        top, prefix = stack.pop()
        try:
            it = os.scandir(top)
        except FileNotFoundError:  # a root not made yet
            continue
        with it:
            for entry in it:
                if entry.is_dir(follow_symlinks=False):
                    if entry.name not in pruned:
                        stack.append((entry.path, prefix + entry.name + "/"))
                elif entry.is_file(follow_symlinks=False):
                    st = entry.stat(follow_symlinks=False)
                    rows[prefix + entry.name] = [st.st_size, st.st_mtime_ns]
    return rows


def send_listing(rows, out):
    text = "".join("%s\t%d\t%d\n" % (rel, size, mtime) for rel, (size, mtime) in rows.items())
    out.write((text + "\n").encode("utf-8", "surrogateescape"))
    out.flush()
"""
_WALKS: dict[str, Any] = {}


def walk(root: str, pruned: set[str]) -> dict[str, list[int]]:
    """``WALK``'s walk, the one every floor lists a tree with on either side: ``path:
    [size, mtime_ns]`` of every file, directories named in ``pruned`` not entered.
    (Compiled on first use: the ``start`` floor never lists.)"""
    if not _WALKS:
        exec(WALK, _WALKS)
    rows: dict[str, list[int]] = _WALKS["walk"](root, pruned)
    return rows

LISTER = WALK + r"""
root = os.path.expanduser(sys.argv[1])
out = sys.stdout.buffer
send_listing(walk(root, set(sys.argv[2:])), out)
for line in sys.stdin.buffer:
    rel = line.rstrip(b"\n")
    if not rel:
        break
    with open(os.path.join(os.fsencode(root), rel), "rb") as f:
        data = f.read()
    out.write(b"%d\n" % len(data) + data)
out.flush()
"""


SYNCER = WALK + r"""
root = os.path.expanduser(sys.argv[1])
out = sys.stdout.buffer
send_listing(walk(root, set(sys.argv[2:])), out)
inp = sys.stdin.buffer
base = os.fsencode(root)
while True:
    line = inp.readline().rstrip(b"\n")
    if not line:
        break
    op, _, rest = line.partition(b" ")
    if op == b"G":
        with open(os.path.join(base, rest), "rb") as f:
            data = f.read()
        out.write(b"%d\n" % len(data) + data)
    elif op == b"D":
        try:
            os.unlink(os.path.join(base, rest))
        except FileNotFoundError:
            pass
    else:
        size, mtime, rel = rest.split(b" ", 2)
        data = inp.read(int(size))
        target = os.path.join(base, rel)
        parent = os.path.dirname(target)
        os.makedirs(parent, exist_ok=True)
        tmp = os.path.join(parent, b".floor." + os.path.basename(target))
        with open(tmp, "wb") as f:
            f.write(data)
        os.utime(tmp, ns=(int(mtime), int(mtime)))
        os.rename(tmp, target)
out.flush()
"""


def _start(cfg: str, host: str, script: str, remote_dir: str,
           excluded: list[str]) -> subprocess.Popen[bytes]:
    """``script`` on ``host`` through one ssh session, its pipes this process's."""
    command = " ".join(["python3 -I -S -c", shlex.quote(script), shlex.quote(remote_dir),
                        *map(shlex.quote, excluded)])
    return subprocess.Popen(["ssh", "-F", cfg, host, command], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)


def _known(state: str) -> dict[str, list[int]]:
    """The listing the last run kept (none before the first)."""
    import json

    try:
        with open(state) as f:
            known: dict[str, list[int]] = json.load(f)
    except FileNotFoundError:
        known = {}
    return known


def _keep(state: str, listing: dict[str, list[int]]) -> None:
    import json

    with open(state + ".tmp", "w") as f:
        json.dump(listing, f)
    os.replace(state + ".tmp", state)


def _listing(stream: IO[bytes]) -> dict[str, list[int]]:
    """The remote's ``send_listing``, read back."""
    rows: dict[str, list[int]] = {}
    for line in stream:
        if line == b"\n":
            break
        rel, size, mtime = os.fsdecode(line.rstrip(b"\n")).split("\t")
        rows[rel] = [int(size), int(mtime)]
    return rows


def put_file(local_dir: str, rel: str, data: bytes, mtime_ns: int) -> None:
    """Write ``data`` to a temp name beside ``rel``, give it ``mtime_ns``, rename it."""
    target = os.path.join(local_dir, rel)
    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, ".floor." + os.path.basename(target))
    with open(tmp, "wb") as f:
        f.write(data)
    os.utime(tmp, ns=(mtime_ns, mtime_ns))
    os.replace(tmp, target)


def sync(cfg: str, host: str, remote_dir: str, local_dir: str, state: str,
         excluded: list[str]) -> int:
    """The two-way floor (module doc): both sides listed, each side's changes copied over."""
    import contextlib

    proc = _start(cfg, host, SYNCER, remote_dir, excluded)
    assert proc.stdin is not None and proc.stdout is not None
    known = _known(state)
    here = walk(local_dir, set(excluded))
    there = _listing(proc.stdout)
    now: dict[str, list[int]] = {}
    out: list[bytes] = []
    wanted: list[str] = []
    for rel in here.keys() | there.keys():
        h, r, k = here.get(rel), there.get(rel), known.get(rel)
        if h == r:
            if h is not None:
                now[rel] = h
        elif r == k and h is not None:  # changed here only: copy it there
            with open(os.path.join(local_dir, rel), "rb") as f:
                data = f.read()
            out.append(b"P %d %d %s\n" % (len(data), h[1], os.fsencode(rel)) + data)
            now[rel] = h
        elif r == k:  # deleted here only
            out.append(b"D %s\n" % os.fsencode(rel))
        elif h == k and r is not None:  # changed there only: fetch it
            wanted.append(rel)
            now[rel] = r
        elif h == k:  # deleted there only
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(local_dir, rel))
        elif k is not None:  # changed on both sides: left as it is
            now[rel] = k
    # the fetches last: the helper answers them only once it has read every copy sent
    out += [b"G %s\n" % os.fsencode(rel) for rel in wanted]
    proc.stdin.write(b"".join(out) + b"\n")
    proc.stdin.close()
    for rel in wanted:
        data = proc.stdout.read(int(proc.stdout.readline()))
        put_file(local_dir, rel, data, there[rel][1])
    code = proc.wait()
    _keep(state, now)
    return code


def pull(cfg: str, host: str, remote_dir: str, local_dir: str, state: str,
         excluded: list[str]) -> int:
    """The pull floor (module doc): list, compare with ``state``, fetch what differs."""
    # Imported here: the ``start`` floor loads only what every mode needs.
    import contextlib

    proc = _start(cfg, host, LISTER, remote_dir, excluded)
    assert proc.stdin is not None and proc.stdout is not None
    known = _known(state)
    listing = _listing(proc.stdout)
    wanted = [rel for rel, row in listing.items() if known.get(rel) != row]
    proc.stdin.write(b"".join(os.fsencode(rel) + b"\n" for rel in wanted) + b"\n")
    proc.stdin.flush()
    for rel in wanted:
        data = proc.stdout.read(int(proc.stdout.readline()))
        put_file(local_dir, rel, data, listing[rel][1])
    for rel in known.keys() - listing.keys():
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(local_dir, rel))
    proc.stdin.close()
    code = proc.wait()
    _keep(state, listing)
    return code


def main() -> int:
    mode, cfg, host, *rest = sys.argv[1:]
    if mode == "start":
        return subprocess.call(["ssh", "-F", cfg, host, "python3 -I -S -c pass"])
    if mode in ("pull", "sync"):
        remote_dir, local_dir, state, *excluded = rest
        return (pull if mode == "pull" else sync)(cfg, host, remote_dir, local_dir, state,
                                                  excluded)
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
