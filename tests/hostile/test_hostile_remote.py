"""Odd and hostile trees on a real remote (the namespaced sshd) and on the host.

The remote root holds symlinks to a file and to a dir outside it, a relative symlink that
climbs out, names with a newline, a terminal escape and invalid UTF-8, a FIFO, a character
device, a unix socket, hard links (inside the root and to a file outside it) and a file
over ``--max-file-size``. A pull must apply the legitimate files, report every odd one
under ``skipped`` with a reason, write nothing outside the roots, follow nothing, never
block on the FIFO, and never print a traceback. A push into such a remote must not write
through its symlinks or hard links. The host side gets the same treatment (a symlinked dir,
a FIFO where a file should land, a hard link to a file outside the root).
"""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path
from typing import Any

import pytest
from synctree import Pair, write
from test_reliability_support import assert_clean_failure, files_under, record, run_cli

ODD = {
    "link-file": "symlink (not followed)",
    "link-dir": "symlink (not followed)",
    "climb": "symlink (not followed)",
    "nl\nname.txt": "control character in name",
    "esc\x1b]0;pwned\x07.txt": "control character in name",
    "bad\udcffname.txt": "name is not valid UTF-8",
    "fifo": "special file",
    "chardev": "special file",
    "sock": "special file",
    "hard-a.txt": "hard link",
    "hard-b.txt": "hard link",
    "hard-out.txt": "hard link",
    "big.bin": "larger than --max-file-size",
}
LEGIT = {"ok.txt": b"legit\n", "sub/ok2.txt": b"legit 2\n", "-dash.txt": b"dash\n",
         "uni\u00e9.txt": b"unicode\n", "sp ace.txt": b"space\n"}


def odd_tree(root: Path, outside: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for rel, data in LEGIT.items():
        write(root / rel, data)
    write(outside / "secret.txt", "outside secret\n")
    (root / "link-file").symlink_to(outside / "secret.txt")
    (root / "link-dir").symlink_to("/")
    (root / "climb").symlink_to("../" * 12 + "etc")
    for name in ("nl\nname.txt", "esc\x1b]0;pwned\x07.txt"):
        write(root / name, "odd name\n")
    with open(os.fsencode(str(root)) + b"/bad\xffname.txt", "wb") as f:
        f.write(b"undecodable name\n")
    os.mkfifo(root / "fifo")
    os.mknod(root / "chardev", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    monkeypatch.chdir(root)  # a unix socket path must be short: bind it relative
    sock = socket.socket(socket.AF_UNIX)
    sock.bind("sock")
    sock.close()
    write(root / "hard-a.txt", "two names, one inode\n")
    os.link(root / "hard-a.txt", root / "hard-b.txt")
    os.link(outside / "secret.txt", root / "hard-out.txt")
    write(root / "big.bin", os.urandom(5000))


def no_links_or_specials(root: Path) -> None:
    for dirpath, dirs, names in os.walk(root):
        for name in dirs + names:
            mode = (Path(dirpath) / name).lstat().st_mode
            assert stat.S_ISREG(mode) or stat.S_ISDIR(mode), (dirpath, name)


@pytest.fixture
def own_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ssh runs with the test's own HOME and no agent: only the container's config counts."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)


@pytest.mark.sshd
@pytest.mark.timeout(60)
def test_pull_from_an_odd_remote_applies_the_legit_files_and_reports_the_rest(
    sshd: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, own_home: None
) -> None:
    rel = f"hostile/{tmp_path.name}"
    remote, outside = Path(sshd.home) / rel / "root", Path(sshd.home) / rel / "outside"
    odd_tree(remote, outside, monkeypatch)
    local, state = tmp_path / "local", tmp_path / "state"
    argv = ["pull", str(local), f"{sshd.alias}:{rel}/root", "--state-dir", str(state),
            "-F", str(sshd.ssh_config), "--max-file-size", "1K"]
    code, report, err = run_cli([*argv, "--json"])
    assert code == 0, err
    assert "Traceback" not in err
    assert files_under(local) == LEGIT
    no_links_or_specials(local)
    reasons = {s["path"]: s["reason"] for s in report["skipped"]}
    assert sorted(reasons) == sorted(ODD)
    for path, why in ODD.items():
        assert why in reasons[path], (path, reasons[path])
    assert files_under(outside) == {"secret.txt": b"outside secret\n"}
    # Human output: every odd name on one line, control characters escaped.
    code, _, err = run_cli([*argv, "-v"])
    assert code == 0 and "Traceback" not in err
    record("hostile-input", inputs=len(ODD), escaped=0)


@pytest.mark.sshd
@pytest.mark.timeout(60)
def test_push_into_an_odd_remote_writes_nothing_through_links(
    sshd: Any, tmp_path: Path, own_home: None
) -> None:
    rel = f"hostile/{tmp_path.name}"
    remote, outside = Path(sshd.home) / rel / "root", Path(sshd.home) / rel / "outside"
    write(outside / "secret.txt", "outside secret\n")
    remote.mkdir(parents=True)
    (remote / "sub").symlink_to("../outside")
    os.link(outside / "secret.txt", remote / "h.txt")
    os.mkfifo(remote / "fifo")
    local, state = tmp_path / "local", tmp_path / "state"
    write(local / "sub" / "x.txt", "would land outside\n")
    write(local / "h.txt", "would overwrite the outside secret\n")
    write(local / "fifo", "would block on the fifo\n")
    write(local / "fine.txt", "fine\n")
    code, report, err = run_cli(["push", str(local), f"{sshd.alias}:{rel}/root", "--json",
                                 "--state-dir", str(state), "-F", str(sshd.ssh_config)])
    assert code == 0, err
    assert files_under(outside) == {"secret.txt": b"outside secret\n"}
    assert (remote / "fine.txt").read_bytes() == b"fine\n"
    assert (remote / "sub").is_symlink() and stat.S_ISFIFO((remote / "fifo").lstat().st_mode)
    reasons = {s["path"]: s["reason"] for s in report["skipped"]}
    assert "symlink in path" in reasons["sub/x.txt"]
    assert {"h.txt", "fifo"} <= reasons.keys()
    assert report["uploaded"] == 1
    record("hostile-input", inputs=3, escaped=0)


@pytest.mark.timeout(60)
def test_pull_larger_than_max_pull_bytes_is_refused_whole(tmp_path: Path) -> None:
    pair = Pair(tmp_path / "local", tmp_path / "remote", tmp_path / "state")
    for i in range(3):
        write(pair.remote / f"f{i}.bin", os.urandom(3000))
    code, report = pair.run("pull", "--max-pull-bytes", "4K")
    assert_clean_failure(code, pair.stderr, expect_code=3)
    assert "--max-pull-bytes" in pair.stderr
    assert report["exit_code"] == 3
    assert files_under(pair.local) == {}
    assert pair.ok("pull", "--max-pull-bytes", "16K")["downloaded"] == 3
    record("hostile-input", inputs=1, escaped=0)


@pytest.mark.timeout(60)
def test_odd_host_entries_are_never_followed_or_blocked_on(tmp_path: Path) -> None:
    pair = Pair(tmp_path / "local", tmp_path / "remote", tmp_path / "state")
    outside = tmp_path / "outside"
    write(outside / "secret.txt", "outside secret\n")
    write(pair.remote / "h.txt", "v1\n")
    pair.ok("pull")
    # The host now has: a symlinked dir where the remote has a dir, a FIFO where the
    # remote has a new file, and its synced file hard-linked to a file outside the root.
    (pair.local / "linked").symlink_to(outside)
    os.mkfifo(pair.local / "pipe.txt")
    (pair.local / "h.txt").unlink()
    os.link(outside / "secret.txt", pair.local / "h.txt")
    write(pair.remote / "linked" / "x.txt", "would land outside\n")
    write(pair.remote / "pipe.txt", "a file where the host has a fifo\n")
    write(pair.remote / "h.txt", "v2 from the remote\n")
    report = pair.ok("pull")
    assert files_under(outside) == {"secret.txt": b"outside secret\n"}
    assert stat.S_ISFIFO((pair.local / "pipe.txt").lstat().st_mode)
    reasons = {s["path"]: s["reason"] for s in report["skipped"]}
    assert "symlink in path" in reasons["linked/x.txt"]
    assert "special file" in reasons["pipe.txt"]  # left alone, never opened
    conflicts = {c["path"]: Path(c["saved_to"]).read_bytes() for c in report["conflicts"]}
    # h.txt was edited on the host (its content is now the outside file's): host wins a
    # pull, the remote version is saved, and the outside file is never written.
    assert conflicts["h.txt"] == b"v2 from the remote\n"
    assert (pair.local / "h.txt").read_bytes() == b"outside secret\n"
    record("hostile-input", inputs=3, escaped=0)


SHADOWS = ("json", "struct", "zlib", "stat")


def _shadow_stdlib(home: Path, marker: Path) -> list[Path]:
    """Modules named like the helper's standard library imports in the directory the helper
    starts in (the remote's home): each would leave ``marker`` and kill the helper."""
    made = []
    for name in SHADOWS:
        path = home / f"{name}.py"
        path.write_text(f"open({str(marker)!r}, 'a').write({name!r})\n"
                        "raise SystemExit('a shadowing module was imported')\n")
        made.append(path)
    return made


@pytest.mark.timeout(60)
def test_modules_in_the_local_start_directory_never_shadow_the_helper_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home, marker = tmp_path / "home", tmp_path / "imported"
    home.mkdir()
    _shadow_stdlib(home, marker)
    monkeypatch.chdir(home)  # the local transport's helper starts here
    monkeypatch.setenv("PYTHONPATH", str(home))  # and ignores this too
    write(tmp_path / "local" / "a.txt", "a\n")
    code, report, err = run_cli(["push", str(tmp_path / "local"), str(tmp_path / "remote"),
                                 "--json", "--state-dir", str(tmp_path / "state")])
    assert code == 0, err
    assert report["uploaded"] == 1 and (tmp_path / "remote" / "a.txt").read_text() == "a\n"
    assert not marker.exists()


@pytest.mark.sshd
@pytest.mark.timeout(60)
def test_modules_in_the_remote_home_never_shadow_the_helper_s(
    sshd: Any, tmp_path: Path, own_home: None
) -> None:
    marker = Path(sshd.home) / f"imported-{tmp_path.name}"
    made = _shadow_stdlib(Path(sshd.home), marker)
    try:
        rel = f"hostile/{tmp_path.name}/root"
        write(tmp_path / "local" / "a.txt", "a\n")
        code, report, err = run_cli(["push", str(tmp_path / "local"), f"{sshd.alias}:{rel}",
                                     "--json", "--state-dir", str(tmp_path / "state"),
                                     "-F", str(sshd.ssh_config)])
        assert code == 0, err
        assert report["uploaded"] == 1
        assert (Path(sshd.home) / rel / "a.txt").read_text() == "a\n"
        assert not marker.exists()
    finally:
        for path in made:
            path.unlink()
