"""A hostile remote: the process that answers in place of the helper sends crafted frames.

The impostor (``EVIL`` below, written to a temp dir) is reached two ways a real attacker or
a broken remote could take: as the ``--via`` command (it gets ``sh -c BOOTSTRAP`` as its
arguments; any other command, the client's self-sync check, runs in the real ``sh``), and
as a fake ``python3`` first on the PATH of the local transport. It reads the helper source
the client sends, then speaks the framed protocol with one scenario's
lies: names that escape the root, files that were not asked for, sizes that do not add up,
garbage, oversized frames, silence after garbage.

For each: nothing is written outside the mapped roots; a stream that breaks the protocol
ends the run with one line (exit 1) before anything is applied; legitimate files of an
otherwise well-formed stream still apply and the odd ones are reported under ``skipped``;
the process never hangs (each test has a 60 s timeout; a broken session is killed, not
waited for) and never prints a traceback.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest
from synctree import write
from test_reliability_support import ancestors, assert_clean_failure, record, run_cli

import filesync.endpoint.helper
from filesync.tree.wire import PROTOCOL

EVIL = r'''
import json, os, re, struct, sys, time, zlib

H = struct.Struct(">cI")
scenario, abs_target = sys.argv[1], sys.argv[2]
bootstrap = re.search(r"read\((\d+)\)", sys.argv[-1])
if bootstrap is None:
    # Not the helper's start (killing a silent helper, say): the host's own shell
    # answers, as on any real remote; only the helper lies.
    os.execvp("sh", ["sh", "-c", sys.argv[-1]])
size = int(bootstrap.group(1))
inp, out = sys.stdin.buffer, sys.stdout.buffer
loader = zlib.decompress(inp.read(size))  # the real helper's loader, sent by the client
# ... and the sources blob after it, whose size the loader names
inp.read(int(re.search(rb"_BLOB_SIZE = (\d+)", loader).group(1)))


def send(kind, payload):
    out.write(H.pack(kind, len(payload)) + payload)
    out.flush()


def js(obj, kind=b"J"):
    data = json.dumps(obj).encode()
    send(kind, zlib.compress(data) if kind == b"Z" else data)


def recv():
    head = inp.read(5)
    if len(head) < 5:
        sys.exit(0)
    kind, length = H.unpack(head)
    payload = inp.read(length)
    return kind, (json.loads(payload) if kind in b"JHE" else payload)


def hang():
    while True:  # stdout stays open: only a kill ends this
        time.sleep(60)


def content(path):
    return ("content of %s\n" % path).encode("utf-8", "surrogateescape")


def row(path, nlink=1, kind="f", length=None):
    n = len(content(path)) if length is None else length
    return [path, kind, n, 1_600_000_000_000_000_000, 0o644, 1, nlink]


ODD_NAMES = ["../escape.txt", abs_target, "sub/../../up.txt", "a//b.txt", "./dot.txt",
             "sub/.", "nl\nname.txt", "bad\udcffname.txt", "nul\x00.txt", "", "tab\tname.txt"]
LEGIT = ["ok.txt", "sub/ok2.txt", "-dash.txt", "sp ace.txt", "uni\u00e9.txt"]
entries = {
    "names": [row(p) for p in LEGIT + ODD_NAMES]
    + [row("link", kind="l"), row("hard.txt", nlink=2), row("big.bin", length=5000)],
    "parent-file": [row("d"), row("d/x.txt"), row("e/x.txt"), row("ok.txt")],
    "bad-entry": [["ok.txt", "f", "big", 1, 2, 3, 1]],
}.get(scenario, [row("ok.txt")])

if scenario == "no-hello":
    out.write(b"Welcome to the evil box!\n")
    out.flush()
    inp.read()
    sys.exit(0)
if scenario == "no-hello-hang":
    out.write(b"Welcome, and I will never leave.\n")
    out.flush()
    hang()
if scenario == "bad-hello":
    js({"hello": "one", "cwd": 7})
    hang()
js({"hello": @PROTOCOL@, "cwd": "/evil", "pid": os.getpid()})  # the client's own

while True:
    kind, req = recv()
    op = req.get("op")
    if op == "bye":
        js({"bye": True})
        sys.exit(0)
    if op == "list":
        if scenario == "garbage":
            out.write(os.urandom(5000))
            out.flush()
            sys.exit(0)
        if scenario == "garbage-hang":
            out.write(os.urandom(5000))
            out.flush()
            hang()
        if scenario == "bad-zlib":
            send(b"Z", b"this is not zlib")
            hang()
        if scenario == "huge-frame":
            out.write(H.pack(b"Z", 0xFFFFFFF0))
            out.flush()
            hang()
        if scenario == "not-object":
            js([1, 2, 3])
            hang()
        if scenario == "wrong-kind":
            send(b"D", b"{}")
            hang()
        if scenario == "error-reply":
            js({"error": "multi\nline\r\nerror " + "x" * 5000})
            hang()
        js({"root": req["root"], "exists": True, "is_dir": True,
            "entries": [] if scenario == "results-mismatch" else entries,
            "skipped": [], "excluded": 0}, b"Z")
    elif op == "fetch":
        if scenario == "data-first":
            send(b"D", b"sneaky")
            hang()
        for path in req["paths"]:
            data = content(path)
            if scenario in ("inject", "inject-abs", "dup"):
                fake = {"inject": "../injected.txt", "inject-abs": abs_target,
                        "dup": path}[scenario]
                js({"path": fake, "size": 5, "mtime_ns": 1, "mode": 0o644}, b"H")
                send(b"D", b"evil!")
                js({"ok": True}, b"E")
                if scenario != "dup":
                    hang()
            announced = {"torn-long": len(data) - 5, "torn-short": len(data) + 50}.get(
                scenario, len(data))
            js({"path": path, "size": announced, "mtime_ns": 1_600_000_000_000_000_000,
                "mode": 0o644}, b"H")
            send(b"D", data)
            js({"ok": True}, b"E")
        js({"done": True})
    elif op == "send":
        for _ in range(req["count"]):
            while recv()[0] not in b"EW":  # a file ends with E, or is one W frame
                pass
        js({"results": [["../../x", "ok", 1, 1]]}, b"Z")
        hang()
    elif op == "delete":
        js({"results": [[f[0], "ok"] for f in req["files"]]}, b"Z")
    elif op == "exists":  # the client's self-sync check: answered truthfully
        js({"found": any(os.path.exists(p) for p in req["paths"])})
'''


@pytest.fixture
def evil(tmp_path: Path) -> Path:
    script = tmp_path / "evil" / "evil.py"
    write(script, EVIL.replace("@PROTOCOL@", str(PROTOCOL)))
    return script


class Box:
    def __init__(self, tmp_path: Path, evil: Path) -> None:
        self.tmp = tmp_path
        self.evil = evil
        self.local = tmp_path / "local"
        self.state = tmp_path / "state"
        self.abs_target = tmp_path / "outside" / "abs-evil.txt"
        self.local.mkdir()

    def run(self, command: str, scenario: str, *extra: str) -> tuple[int, dict[str, object], str]:
        via = f"{sys.executable} {self.evil} {scenario} {self.abs_target}"
        return run_cli([command, str(self.local), "/remote/root", "--via", via, "--json",
                        "--state-dir", str(self.state), *extra])

    def outside(self) -> dict[str, bytes]:
        """Every file the run could have written outside the host root and the state dir."""
        found = {}
        for dirpath, _dirs, names in os.walk(self.tmp):
            for name in names:
                p = Path(dirpath) / name
                if self.local in p.parents or self.state in p.parents or p == self.evil:
                    continue
                found[str(p)] = p.read_bytes() if stat.S_ISREG(p.lstat().st_mode) else b""
        return found


@pytest.fixture
def box(tmp_path: Path, evil: Path, monkeypatch: pytest.MonkeyPatch) -> Box:
    write(tmp_path / "outside" / "secret.txt", "do not touch\n")
    # A remote that talks instead of starting the helper, or does not answer the goodbye,
    # is killed after this long (5 s, 10 s by default); the outcomes asserted do not depend
    # on it, only the test's duration does.
    monkeypatch.setattr(filesync.endpoint.helper, "START_TIMEOUT", 0.5)
    monkeypatch.setattr(filesync.endpoint.helper, "CLOSE_TIMEOUT", 0.5)
    return Box(tmp_path, evil)


def host_files(box: Box) -> dict[str, bytes]:
    out = {}
    for dirpath, _dirs, names in os.walk(box.local):
        for name in names:
            p = Path(dirpath) / name
            out[p.relative_to(box.local).as_posix()] = p.read_bytes()
    return out


@pytest.mark.timeout(60)
def test_escaping_and_odd_names_are_skipped_and_the_legit_files_apply(box: Box) -> None:
    before = box.outside()
    code, report, err = box.run("pull", "names", "--max-file-size", "1K")
    assert code == 0, err
    assert "Traceback" not in err
    legit = ["ok.txt", "sub/ok2.txt", "-dash.txt", "sp ace.txt", "uni\u00e9.txt"]
    assert host_files(box) == {p: f"content of {p}\n".encode() for p in legit}
    assert box.outside() == before and not box.abs_target.exists()
    skipped = {s["path"]: s["reason"] for s in report["skipped"]}  # type: ignore[union-attr]
    odd = ["../escape.txt", str(box.abs_target), "sub/../../up.txt", "a//b.txt", "./dot.txt",
           "sub/.", "nl\nname.txt", "bad\udcffname.txt", "nul\x00.txt", "", "tab\tname.txt",
           "link", "hard.txt", "big.bin"]
    assert sorted(skipped) == sorted(odd)
    assert all(reason for reason in skipped.values())
    assert "unsafe path" in skipped["../escape.txt"]
    assert "not valid UTF-8" in skipped["bad\udcffname.txt"]
    assert "hard link" in skipped["hard.txt"]
    assert "max-file-size" in skipped["big.bin"]
    record("hostile-input", inputs=len(odd), escaped=0)


@pytest.mark.timeout(60)
def test_fake_python3_first_on_path_gets_the_same_treatment(
    box: Box, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The local transport runs ``python3`` from PATH: an impostor there is contained too."""
    fake = tmp_path / "fakebin" / "python3"
    write(fake, f'#!/bin/sh\nexec {sys.executable} {box.evil} names {box.abs_target} "$@"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    before = box.outside()
    code, report, err = run_cli(["pull", str(box.local), str(tmp_path / "remote"), "--json",
                                 "--state-dir", str(box.state)])
    assert code == 0, err
    assert sorted(host_files(box)) == ["-dash.txt", "big.bin", "ok.txt", "sp ace.txt",
                                       "sub/ok2.txt", "uni\u00e9.txt"]
    assert box.outside() == before
    assert len(report["skipped"]) == 13
    record("hostile-input", inputs=13, escaped=0)


@pytest.mark.timeout(60)
def test_parent_that_is_a_file_or_a_host_symlink_is_refused(box: Box, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (box.local / "e").symlink_to(outside)
    before = box.outside()
    code, report, err = box.run("pull", "parent-file")
    assert code == 0, err
    assert host_files(box) == {"d": b"content of d\n", "ok.txt": b"content of ok.txt\n"}
    assert box.outside() == before and sorted(os.listdir(outside)) == ["secret.txt"]
    reasons = {s["path"]: s["reason"] for s in report["skipped"]}  # type: ignore[union-attr]
    assert "a parent is not a directory" in reasons["d/x.txt"]
    assert "symlink in path" in reasons["e/x.txt"]
    record("hostile-input", inputs=2, escaped=0)


STREAM_BREAKERS = [
    "inject", "inject-abs", "dup", "garbage", "garbage-hang", "bad-zlib", "huge-frame",
    "not-object", "wrong-kind", "bad-entry", "data-first", "no-hello", "no-hello-hang",
    "bad-hello", "error-reply",
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("scenario", STREAM_BREAKERS)
def test_a_stream_that_breaks_the_protocol_fails_cleanly_and_applies_nothing(
    box: Box, scenario: str
) -> None:
    write(box.local / "host.txt", "the host's own file\n")
    before_outside, before_host = box.outside(), host_files(box)
    code, report, err = box.run("pull", scenario)
    assert_clean_failure(code, err)
    assert report["exit_code"] == 1
    assert host_files(box) == before_host  # staged first: nothing was applied
    assert box.outside() == before_outside
    assert ancestors(box.state) == {}
    record("hostile-input", inputs=1, escaped=0)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("scenario", ["torn-long", "torn-short"])
def test_a_file_whose_bytes_do_not_match_its_size_is_never_applied(
    box: Box, scenario: str
) -> None:
    code, report, err = box.run("pull", scenario)
    assert code == 0, err
    assert host_files(box) == {}
    [skipped] = report["skipped"]  # type: ignore[misc]
    assert skipped["path"] == "ok.txt" and "changed while being read" in skipped["reason"]
    record("hostile-input", inputs=1, escaped=0)


@pytest.mark.timeout(60)
def test_push_results_for_paths_never_sent_fail_cleanly(box: Box) -> None:
    write(box.local / "up.txt", "upload me\n")
    code, _, err = box.run("push", "results-mismatch")
    assert_clean_failure(code, err)
    assert "garbage" in err
    assert ancestors(box.state) == {}
    record("hostile-input", inputs=1, escaped=0)
