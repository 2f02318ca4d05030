"""The per-file report (docs/json.md): ``--json``'s one shape, its ``files``, ``-v`` lines
and ``--version``, all through the command as a user runs it (``python -m filesync.cli``
in a subprocess) over the local transport, and once through a real sshd."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sshd import SshdContainer
from synctree import write

from filesync.version import __version__


def cli(*argv: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    proc = subprocess.run([sys.executable, "-m", "filesync.cli", *argv], capture_output=True,
                          text=True, timeout=300, env=env)
    return proc.returncode, proc.stdout, proc.stderr


class Pair:
    """LOCAL, a local-transport REMOTE and a state dir; every run is a new process."""

    def __init__(self, tmp: Path, name: str = "p") -> None:
        self.local, self.remote = tmp / name / "local", tmp / name / "remote"
        self.state = tmp / name / "state"
        self.local.mkdir(parents=True)
        self.remote.mkdir(parents=True)

    def json(self, command: str, *extra: str, code: int = 0) -> dict[str, Any]:
        rc, out, err = cli(command, str(self.local), str(self.remote), "--json",
                           "--state-dir", str(self.state), "--no-default-excludes", *extra)
        assert rc == code, (rc, out, err)
        doc: dict[str, Any] = json.loads(out)  # the whole of stdout is one object
        return doc

    def lines(self, command: str, *extra: str) -> list[str]:
        rc, out, err = cli(command, str(self.local), str(self.remote),
                           "--state-dir", str(self.state), "--no-default-excludes", *extra)
        assert rc == 0, (rc, out, err)
        return out.splitlines()


def files(doc: dict[str, Any]) -> list[tuple[str, str, int]]:
    return [(f["path"], f["action"], f["bytes"]) for f in doc["files"]]


def pushed(tmp: Path) -> Pair:
    """A pair after a first push of a.txt (4 bytes), b/c.txt (6) and gone.txt (1)."""
    p = Pair(tmp)
    write(p.local / "a.txt", "aaaa")
    write(p.local / "b" / "c.txt", "hello\n")
    write(p.local / "gone.txt", "x")
    doc = p.json("push")
    assert files(doc) == [("a.txt", "upload", 4), ("b/c.txt", "upload", 6),
                          ("gone.txt", "upload", 1)]
    return p


#: Every top-level key of a run that finished (docs/json.md); a plan adds PLAN_KEYS and a
#: failure ERROR_KEYS.
TOP_KEYS = frozenset({
    "schema", "files", "uploaded", "downloaded", "deleted_local", "deleted_remote",
    "conflicts", "excluded", "skipped", "bytes_sent", "bytes_received", "seconds", "pruned",
    "pairs", "remotes"})
PAIR_KEYS = TOP_KEYS - {"schema", "pairs", "remotes"} | {"label", "local", "remote"}
PLAN_KEYS = {"plan", "open_conflicts"}
ERROR_KEYS = {"error", "exit_code"}


# --------------------------------------------------------------------------- files


def test_push_lists_each_upload_remote_delete_and_push_conflict(tmp_path: Path) -> None:
    p = pushed(tmp_path)
    write(p.remote / "a.txt", "remote!")  # only the remote changed: saved, then overwritten
    (p.local / "gone.txt").unlink()
    blob = os.urandom(1000)
    write(p.local / "new.bin", blob)
    doc = p.json("push")
    assert doc["schema"] == 1
    assert files(doc) == [("a.txt", "upload", 4), ("gone.txt", "delete-remote", 0),
                          ("new.bin", "upload", 1000)]
    [conflict] = doc["conflicts"]
    assert conflict["path"] == "a.txt" and Path(conflict["saved_to"]).read_text() == "remote!"
    assert (doc["uploaded"], doc["deleted_remote"]) == (2, 1)
    assert doc["bytes_sent"] >= 1004  # the wire carried at least the files' bytes
    assert (p.remote / "new.bin").read_bytes() == blob


def test_pull_lists_downloads_local_deletes_and_kept_conflicts(tmp_path: Path) -> None:
    p = pushed(tmp_path)
    write(p.remote / "b" / "c.txt", "pulled!!")
    (p.remote / "gone.txt").unlink()
    write(p.local / "a.txt", "host edit")
    write(p.remote / "a.txt", "remote edit 2")
    doc = p.json("pull")
    assert files(doc) == [("a.txt", "conflict", 13), ("b/c.txt", "download", 8),
                          ("gone.txt", "delete-local", 0)]
    assert doc["bytes_received"] >= 8 + 13
    assert (p.local / "a.txt").read_text() == "host edit"
    assert Path(doc["conflicts"][0]["saved_to"]).read_text() == "remote edit 2"
    # The same conflict again: the copy already saved is kept, no byte is copied.
    again = p.json("pull")
    assert files(again) == [("a.txt", "conflict", 0)]
    assert again["conflicts"] == doc["conflicts"]


def test_sync_lists_both_directions_and_nothing_for_agreeing_sides(tmp_path: Path) -> None:
    p = pushed(tmp_path)
    write(p.local / "h.txt", "from host")
    write(p.remote / "r" / "r.txt", "from remote!")
    (p.local / "b" / "c.txt").unlink()
    (p.remote / "gone.txt").unlink()
    write(p.local / "same.txt", "both")  # new on both sides, same bytes: only recorded
    write(p.remote / "same.txt", "both")
    write(p.local / "a.txt", "L")
    write(p.remote / "a.txt", "RR")
    doc = p.json("sync")
    assert files(doc) == [("a.txt", "conflict", 2), ("b/c.txt", "delete-remote", 0),
                          ("gone.txt", "delete-local", 0), ("h.txt", "upload", 9),
                          ("r/r.txt", "download", 12)]
    counts = [doc[k] for k in ("uploaded", "downloaded", "deleted_remote", "deleted_local")]
    assert counts == [1, 1, 1, 1] and len(doc["conflicts"]) == 1
    # Settling the conflict is one download; the other files are in sync by now.
    settled = p.json("resolve", "a.txt", "--keep", "remote")
    assert files(settled) == [("a.txt", "download", 2)] and settled["conflicts"] == []
    assert (p.local / "a.txt").read_text() == "RR"


def test_a_dry_run_lists_no_file_and_carries_the_plan(tmp_path: Path) -> None:
    p = pushed(tmp_path)
    write(p.local / "a.txt", "changed")
    for command, extra in (("push", ("--dry-run",)), ("status", ())):
        doc = p.json(command, *extra)
        assert set(doc) == TOP_KEYS | PLAN_KEYS
        assert doc["files"] == [] and doc["uploaded"] == 0
        assert doc["plan"] == [{"path": "a.txt", "action": "upload"}]
        assert doc["pairs"][0]["plan"] == doc["plan"]
    assert (p.remote / "a.txt").read_text() == "aaaa"


def test_retention_pruning_is_in_the_json(tmp_path: Path) -> None:
    p = pushed(tmp_path)
    pruned: list[dict[str, Any]] = []
    for i in range(22):  # each push conflict saves a run under conflicts/; 20 are kept
        write(p.remote / "a.txt", f"remote {i:02d}")
        doc = p.json("push")
        pruned += doc["pruned"]
        assert doc["pairs"][0]["pruned"] == doc["pruned"]
    assert len(pruned) == 2
    assert all(not Path(d["path"]).exists() and d["bytes"] == 9 for d in pruned)
    assert {Path(d["path"]).parent.name for d in pruned} == {"conflicts"}


# --------------------------------------------------------------------------- one shape


def _config(tmp: Path, locals_: list[Path], remote_home: Path) -> Path:
    maps = "".join(f'[[mapping]]\nlocal = "{loc}"\nremote = "m{i}"\n'
                   for i, loc in enumerate(locals_))
    cfg: Path = write(tmp / "filesync.toml", f'remotes = ["file://{remote_home}"]\n{maps}')
    return cfg


def _shape(doc: dict[str, Any]) -> tuple[frozenset[str], set[frozenset[str]]]:
    return frozenset(doc), {frozenset(p) for p in doc["pairs"]}


def test_one_pair_a_config_and_a_fan_out_print_the_same_shape(tmp_path: Path) -> None:
    single = Pair(tmp_path, "single")
    write(single.local / "x.txt", "12345")
    one = single.json("push")
    trees = [tmp_path / "t0", tmp_path / "t1"]
    write(trees[0] / "x.txt", "12345")
    write(trees[1] / "y.txt", "123")
    cfg = _config(tmp_path, trees, tmp_path / "home")
    state = str(tmp_path / "cstate")
    rc, out, err = cli("push", "--config", str(cfg), "--state-dir", state, "--json")
    assert rc == 0, err
    config = json.loads(out)
    fan = Pair(tmp_path, "fan")
    write(fan.local / "x.txt", "12345")
    rc, out, err = cli("push", str(fan.local), str(tmp_path / "r0"), str(tmp_path / "r1"),
                       "--json", "--state-dir", str(fan.state))
    assert rc == 0, err
    fanout = json.loads(out)

    assert _shape(one) == _shape(config) == _shape(fanout) == (TOP_KEYS, {PAIR_KEYS})
    assert [len(d["pairs"]) for d in (one, config, fanout)] == [1, 2, 2]
    for doc in (one, config, fanout):
        pairs = doc["pairs"]
        assert doc["files"] == [f for p in pairs for f in p["files"]]
        for key in ("uploaded", "bytes_sent", "bytes_received", "excluded"):
            assert doc[key] == sum(p[key] for p in pairs)
        assert [r["remote"] for r in doc["remotes"]] == [p["label"] for p in pairs]
    assert one["pairs"][0]["local"] == str(single.local.resolve())
    assert [p["remote"] for p in fanout["pairs"]] == [str(tmp_path / "r0"), str(tmp_path / "r1")]
    assert files(config) == [("x.txt", "upload", 5), ("y.txt", "upload", 3)]
    assert [p["remote"] for p in config["pairs"]] == [str(tmp_path / "home" / "m0"),
                                                      str(tmp_path / "home" / "m1")]


def test_failures_keep_the_shape_and_add_error_and_exit_code(tmp_path: Path) -> None:
    p = Pair(tmp_path)
    write(p.local / "x.txt", "x")
    bad = write(tmp_path / "a-file", "not a directory")
    rc, out, _ = cli("push", str(p.local), str(p.remote), str(bad), "--json",
                     "--state-dir", str(p.state))
    fan = json.loads(out)
    assert rc == fan["exit_code"] == 1
    assert set(fan) == TOP_KEYS | ERROR_KEYS and f"{bad}: " in fan["error"]
    ok, failed = fan["pairs"]
    assert set(ok) == PAIR_KEYS and set(failed) == PAIR_KEYS | ERROR_KEYS
    assert files(fan) == files(ok) == [("x.txt", "upload", 1)] and failed["files"] == []
    # One pair failing, and a run failing before any pass: the same keys.
    single = json.loads(cli("push", str(p.local), str(bad), "--json",
                            "--state-dir", str(p.state))[1])
    assert set(single) == TOP_KEYS | ERROR_KEYS and "not a directory" in single["error"]
    cfg = write(tmp_path / "broken.toml", "remotes = [")
    rc, out, _ = cli("push", "--config", str(cfg), "--json")
    early = json.loads(out)
    assert rc == early["exit_code"] == 2 and "not valid TOML" in early["error"]
    assert set(early) == TOP_KEYS | ERROR_KEYS and early["pairs"] == [] and early["files"] == []


def _keys(value: Any) -> set[str]:
    """Every key of every object in ``value``, at any depth."""
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in _keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in _keys(v)}
    return set()


def test_every_key_printed_is_documented(tmp_path: Path) -> None:
    """docs/json.md names each key a run can print (one in backticks, or in a {...} list)."""
    p = pushed(tmp_path)
    write(p.remote / "a.txt", "remote!")
    (p.local / "gone.txt").unlink()
    bad = write(tmp_path / "a-file", "x")
    seen: set[str] = set()
    for extra in ((), ("--dry-run",)):
        rc, out, _ = cli("push", str(p.local), str(p.remote), str(bad), "--json",
                         "--state-dir", str(p.state), "--no-default-excludes", *extra)
        assert rc == 1  # the second remote is a file: the error keys are printed too
        seen |= _keys(json.loads(out))
    assert {"files", "action", "saved_to", "plan", "error", "label"} <= seen  # all reached
    text = (Path(__file__).resolve().parents[2] / "docs" / "json.md").read_text()
    documented = set(re.findall(r"`(\w+)`", text)) | {
        k.strip() for group in re.findall(r"\{([\w, ]+)\}", text) for k in group.split(",")}
    assert seen - documented == set()


# --------------------------------------------------------------------------- -v


def test_verbose_itemizes_every_changed_file_on_stdout(tmp_path: Path) -> None:
    p = pushed(tmp_path)
    write(p.remote / "a.txt", "remote!")
    (p.local / "gone.txt").unlink()
    write(p.local / "new.bin", "n")
    out = p.lines("push", "-v")
    saved = next(Path(line.split(" -> ")[1]) for line in out if line.startswith("!conflict"))
    assert saved.read_text() == "remote!"
    assert out[:4] == [">f a.txt", ">*deleting gone.txt", ">f new.bin",
                       f"!conflict a.txt -> {saved}"]
    assert out[4].startswith("push: 2 uploaded") and len(out) == 5

    write(p.remote / "b" / "c.txt", "pulled")
    (p.remote / "new.bin").unlink()
    write(p.local / "a.txt", "host")
    write(p.remote / "a.txt", "remote")
    out = p.lines("pull", "-v")
    assert out[:2] == ["<f b/c.txt", "<*deleting new.bin"]
    assert out[2].startswith("!conflict a.txt -> ") and out[3].startswith("pull: ")


def test_a_fan_out_itemizes_each_pair_under_its_label(tmp_path: Path) -> None:
    p = Pair(tmp_path)
    write(p.local / "x.txt", "x")
    r0, r1 = str(tmp_path / "r0"), str(tmp_path / "r1")
    rc, out, err = cli("push", str(p.local), r0, r1, "-v", "--state-dir", str(p.state))
    assert rc == 0, err
    lines = out.splitlines()
    assert [line for line in lines if ">f" in line] == [f"[{r0}] >f x.txt", f"[{r1}] >f x.txt"]
    assert all(line.startswith((f"[{r0}] ", f"[{r1}] ")) for line in lines)


def test_quiet_and_json_print_no_item_lines(tmp_path: Path) -> None:
    p = pushed(tmp_path)
    write(p.local / "a.txt", "new")
    assert p.lines("push", "-v", "-q") == []
    write(p.local / "a.txt", "newer")
    rc, out, err = cli("push", str(p.local), str(p.remote), "--json", "-v",
                       "--state-dir", str(p.state), "--no-default-excludes")
    assert rc == 0 and files(json.loads(out)) == [("a.txt", "upload", 5)]
    assert ">f" not in out + err


# --------------------------------------------------------------------------- --version


@pytest.mark.parametrize("module", ["filesync", "filesync.cli"])
def test_version_prints_the_distribution_version(module: str) -> None:
    proc = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True,
                          text=True, timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"filesync {__version__}\n", "")


def test_version_is_read_from_filesync_version(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    # ``filesync.cli.main`` as an attribute of the package is the function, not the module
    cli_main = importlib.import_module("filesync.cli.main")
    monkeypatch.setattr(cli_main, "__version__", "9.8.7")
    with pytest.raises(SystemExit) as stop:
        cli_main.build_parser().parse_args(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out == "filesync 9.8.7\n"


# --------------------------------------------------------------------------- sshd


@pytest.mark.sshd
def test_files_through_a_real_sshd(sshd: SshdContainer, tmp_path: Path) -> None:
    home = tmp_path / "userhome"  # the machine's own ~/.ssh never decides the outcome
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"} | {"HOME": str(home)}
    local, rel = tmp_path / "local", f"json-{tmp_path.name}/tree"
    write(local / "a.txt", "over ssh")
    write(local / "d" / "b.bin", os.urandom(3000))

    def run(command: str) -> dict[str, Any]:
        rc, out, err = cli(command, str(local), f"{sshd.alias}:{rel}", "--json", "-F",
                           str(sshd.ssh_config), "--state-dir", str(tmp_path / "state"),
                           env=env)
        assert rc == 0, err
        doc: dict[str, Any] = json.loads(out)
        return doc

    doc = run("push")
    assert files(doc) == [("a.txt", "upload", 8), ("d/b.bin", "upload", 3000)]
    assert doc["pairs"][0]["label"] == f"{sshd.alias}:{rel}"
    write(sshd.home / rel / "a.txt", "edited remotely")
    (sshd.home / rel / "d" / "b.bin").unlink()
    assert files(run("pull")) == [("a.txt", "download", 15), ("d/b.bin", "delete-local", 0)]
