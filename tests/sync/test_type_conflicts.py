"""A file meeting a directory (issue 23), over the local transport and a real sshd.

Every case: both directions (a host file against a remote directory, a host directory
against a remote file) x ``sync``/``push``/``pull`` x what the directory holds (files,
nothing, excluded content only). Neither side is synced at that name yet (an anchor file
is), so both sides are "new" there, as in mutagen's reconcile rows.

- **files**: a type conflict on the name. ``sync`` and ``pull`` keep both sides, save the
  remote side (the whole subtree, when it is the directory), report it once and keep it
  open (``status`` lists it; ``resolve --keep local|remote`` settles it either way);
  ``push`` saves the remote side, then makes the remote the host's. A second run changes
  nothing and saves nothing.
- **empty**: directories are not tracked, so an empty one is no version to keep; a file
  that moves there replaces it (as rsync replaces an empty directory in a file's way).
- **excluded content only**: filesync never reads, sends, writes or deletes what it
  excludes, so the directory stays whole and the file is held back, reported as skipped
  with the ``dir-in-the-way`` reason (never "changed on the remote during the run"),
  every run, with nothing saved; moving the directory aside lets it through.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sshd import SshdContainer
from synctree import Pair, snapshot, write

from filesync.endpoint.helper import HelperEndpoint, NoPython
from filesync.transport.base import Conduit
from filesync.tree.wire import Reason, describe

HOST_FILE, HOST_DIR = "host-file", "host-dir"
FILES, EMPTY, EXCLUDED = "files", "empty", "excluded"

HOST_BYTES = b"the host's file\n"
REMOTE_BYTES = b"the remote's file\n"
#: a directory's files (relative to it) in the "files" case
DIR_FILES = {"a.txt": b"dir file a\n", "sub/b.bin": bytes(range(256)) * 8}


@dataclass
class SshPair(Pair):
    """A pair whose remote is reached through a real sshd (``remote`` is its host path)."""

    spec: str = ""
    config: str = ""

    def run(self, command: str, *extra: str, remote: str | None = None) -> tuple[int, Any]:
        return super().run(command, "-F", self.config, *extra, remote=remote or self.spec)


MakePair = Callable[[Path], Pair]


@pytest.fixture(params=["local", "posix", "sshd"])
def make_pair(request: pytest.FixtureRequest,
              monkeypatch: pytest.MonkeyPatch) -> Iterator[MakePair]:
    """Pairs over the local transport (with the python helper, or the POSIX fallback as
    for a remote without python3), or over the session's real sshd."""
    if request.param == "posix":
        async def no_python(cls: type[HelperEndpoint], conduit: Conduit,
                            **_kwargs: object) -> HelperEndpoint:
            raise NoPython("forced by the test")

        monkeypatch.setattr(HelperEndpoint, "start", classmethod(no_python))
    if request.param != "sshd":
        yield lambda tmp: Pair(tmp / "local", tmp / "remote", tmp / "state")
        return
    sshd: SshdContainer = request.getfixturevalue("sshd")

    def make(tmp: Path) -> Pair:
        rel = f"types-{tmp.name}/tree"
        return SshPair(tmp / "local", sshd.home / rel, tmp / "state",
                       spec=f"{sshd.alias}:{rel}", config=str(sshd.ssh_config))

    yield make


def fill_dir(root: Path, contents: str) -> None:
    if contents == FILES:
        for rel, data in DIR_FILES.items():
            write(root / rel, data)
    elif contents == EMPTY:
        root.mkdir(parents=True)
    else:
        write(root / "node_modules" / "dep" / "index.js", "excluded\n")


def setup(tmp: Path, make_pair: MakePair, shape: str, contents: str) -> Pair:
    pair = make_pair(tmp)
    write(pair.local / "anchor.txt", "synced\n")
    pair.ok("sync")
    file_side, dir_side = (pair.local, pair.remote) if shape == HOST_FILE \
        else (pair.remote, pair.local)
    write(file_side / "p", HOST_BYTES if shape == HOST_FILE else REMOTE_BYTES)
    fill_dir(dir_side / "p", contents)
    return pair


def saved_runs(pair: Pair) -> list[Path]:
    return sorted(pair.state.glob("pairs/*/conflicts/*"))


def remote_side(shape: str) -> dict[str, bytes]:
    """What the saved copy of the remote side holds, relative to the saved path."""
    return {"": REMOTE_BYTES} if shape == HOST_DIR else dict(DIR_FILES)


def copy_holds(saved: Path) -> dict[str, bytes]:
    if saved.is_file():
        return {"": saved.read_bytes()}
    return snapshot(saved)


SHAPES = [HOST_FILE, HOST_DIR]


# ---------------------------------------------------------------- the directory holds files


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("command", ["sync", "pull"])
@pytest.mark.parametrize("keep", ["local", "remote"])
def test_kept_open_saved_once_and_resolved(
    tmp_path: Path, make_pair: MakePair, shape: str, command: str, keep: str
) -> None:
    pair = setup(tmp_path, make_pair, shape, FILES)
    host, remote = snapshot(pair.local), snapshot(pair.remote)
    report = pair.ok(command)
    [conflict] = report["conflicts"]
    assert conflict["path"] == "p" and report["skipped"] == [] and report["files"] == [
        {"path": "p", "action": "conflict", "bytes": sum(map(len, remote_side(shape).values()))}]
    saved = Path(conflict["saved_to"])
    assert copy_holds(saved) == remote_side(shape)  # nothing lost: the remote side, whole
    assert (snapshot(pair.local), snapshot(pair.remote)) == (host, remote)  # both kept
    status = pair.ok("status")
    assert status["open_conflicts"] == ["p"]
    assert status["plan"] == [{"path": "p", "action": "conflict"}]
    # Again: the same conflict, nothing changed and nothing saved again.
    runs = saved_runs(pair)
    again = pair.ok(command)
    assert again["conflicts"] == [conflict] and again["files"][0]["bytes"] == 0
    assert (again["uploaded"], again["downloaded"], again["deleted_local"],
            again["deleted_remote"]) == (0, 0, 0, 0)
    assert saved_runs(pair) == runs
    assert (snapshot(pair.local), snapshot(pair.remote)) == (host, remote)

    pair.ok("resolve", "p", "--keep", keep)
    winner = host if keep == "local" else remote
    assert snapshot(pair.local) == snapshot(pair.remote) == winner
    status = pair.ok("status")
    assert (status["open_conflicts"], status["plan"]) == ([], [])
    if keep == "remote":  # the host's side is kept in undo/ by the resolve
        undone = snapshot(next(pair.state.glob("pairs/*/undo")))
        assert {k.split("/files/", 1)[1]: v for k, v in undone.items() if "/files/" in k} == {
            k: v for k, v in host.items() if k.startswith("p")}
    else:  # the remote side it replaced is the copy saved by the first run
        assert copy_holds(saved) == remote_side(shape)
    assert pair.ok("sync")["files"] == []


@pytest.mark.parametrize("shape", SHAPES)
def test_push_saves_the_remote_side_then_replaces_it(
    tmp_path: Path, make_pair: MakePair, shape: str
) -> None:
    pair = setup(tmp_path, make_pair, shape, FILES)
    host = snapshot(pair.local)
    report = pair.ok("push")
    [conflict] = report["conflicts"]
    assert conflict["path"] == "p" and report["skipped"] == []
    assert copy_holds(Path(conflict["saved_to"])) == remote_side(shape)
    assert snapshot(pair.remote) == host
    # Settled by the push itself, as a file conflict is: nothing left open or to do.
    status = pair.ok("status")
    assert (status["open_conflicts"], status["plan"]) == ([], [])
    runs = saved_runs(pair)
    again = pair.ok("push")
    assert (again["files"], again["conflicts"], again["skipped"]) == ([], [], [])
    assert saved_runs(pair) == runs and snapshot(pair.remote) == host


# ---------------------------------------------------------------- the directory is empty


#: (shape, command) -> which side's file ends at "p" (None: both sides stay as they are)
EMPTY_OUTCOME = {
    (HOST_FILE, "sync"): "host", (HOST_FILE, "push"): "host", (HOST_FILE, "pull"): None,
    (HOST_DIR, "sync"): "remote", (HOST_DIR, "pull"): "remote", (HOST_DIR, "push"): None,
}


@pytest.mark.parametrize(("shape", "command"), list(EMPTY_OUTCOME))
def test_an_empty_directory_makes_way_for_the_file(
    tmp_path: Path, make_pair: MakePair, shape: str, command: str
) -> None:
    pair = setup(tmp_path, make_pair, shape, EMPTY)
    report = pair.ok(command)
    assert (report["conflicts"], report["skipped"]) == ([], [])
    winner = EMPTY_OUTCOME[shape, command]
    if winner is None:  # the file does not move this way: nothing changes
        assert report["files"] == []
        dir_side = pair.remote if shape == HOST_FILE else pair.local
        assert (dir_side / "p").is_dir() and not any((dir_side / "p").iterdir())
    else:
        data = HOST_BYTES if winner == "host" else REMOTE_BYTES
        assert (pair.local / "p").read_bytes() == (pair.remote / "p").read_bytes() == data
    again = pair.ok(command)
    assert (again["files"], again["conflicts"], again["skipped"]) == ([], [], [])
    assert saved_runs(pair) == []


# ---------------------------------------------------- the directory holds excluded content


#: (shape, command) -> whether the file is held back by the directory (else: no move)
EXCLUDED_BLOCKS = {
    (HOST_FILE, "sync"): "upload", (HOST_FILE, "push"): "upload", (HOST_FILE, "pull"): None,
    (HOST_DIR, "sync"): "host write", (HOST_DIR, "pull"): "host write", (HOST_DIR, "push"): None,
}


@pytest.mark.parametrize(("shape", "command"), list(EXCLUDED_BLOCKS))
def test_a_directory_of_excluded_content_is_never_replaced(
    tmp_path: Path, make_pair: MakePair, shape: str, command: str
) -> None:
    pair = setup(tmp_path, make_pair, shape, EXCLUDED)
    dir_side = pair.remote if shape == HOST_FILE else pair.local
    blocked = EXCLUDED_BLOCKS[shape, command]
    for _ in range(2):  # every run says the same, and saves nothing
        report = pair.ok(command)
        assert (report["files"], report["conflicts"]) == ([], [])
        expect = [] if blocked is None else [
            {"path": "p", "reason": f"{blocked} refused: {describe(Reason.DIR_IN_WAY)}"}]
        assert report["skipped"] == expect
        assert (dir_side / "p" / "node_modules" / "dep" / "index.js").read_text() == "excluded\n"
        file_side = pair.local if shape == HOST_FILE else pair.remote
        assert (file_side / "p").read_bytes() == (
            HOST_BYTES if shape == HOST_FILE else REMOTE_BYTES)
    assert saved_runs(pair) == []
    assert "changed on the remote" not in str(report)
    if blocked is not None:  # moved aside, the directory lets the file through
        (dir_side / "p").rename(dir_side / "p.aside")
        report = pair.ok(command)
        assert (report["skipped"], report["conflicts"]) == ([], [])
        assert (pair.local / "p").read_bytes() == (pair.remote / "p").read_bytes()


# ------------------------------------------------------------------- the issue's reports


def test_the_issues_sync_reproduction(tmp_path: Path, make_pair: MakePair) -> None:
    """Host file ``p``, remote ``p/file``: a conflict, open, resolvable (was: skipped as
    "changed on the remote during the run", forever)."""
    pair = setup(tmp_path, make_pair, HOST_FILE, EMPTY)
    write(pair.remote / "p" / "file", "x")
    report = pair.ok("sync")
    assert [c["path"] for c in report["conflicts"]] == ["p"] and report["skipped"] == []
    assert pair.ok("status")["open_conflicts"] == ["p"]
    pair.ok("resolve", "p", "--keep", "local")
    assert (pair.remote / "p").read_bytes() == HOST_BYTES


def test_a_pushed_file_turned_directory_remotely_is_replaced_by_push(
    tmp_path: Path, make_pair: MakePair
) -> None:
    """Synced as a file, replaced on the remote by a directory: every push used to skip
    it; now the push saves the directory and the remote becomes the host's."""
    pair = make_pair(tmp_path)
    write(pair.local / "p", HOST_BYTES)
    pair.ok("sync")
    (pair.remote / "p").unlink()
    write(pair.remote / "p" / "file", "remote dir file\n")
    report = pair.ok("push")
    [conflict] = report["conflicts"]
    assert copy_holds(Path(conflict["saved_to"])) == {"file": b"remote dir file\n"}
    assert (pair.remote / "p").read_bytes() == HOST_BYTES
    assert pair.ok("push")["files"] == []


@pytest.mark.parametrize("command", ["sync", "pull"])
def test_a_synced_file_turned_directory_on_one_side_still_propagates(
    tmp_path: Path, make_pair: MakePair, command: str
) -> None:
    """Only one side changed the name's type: no conflict, the change moves (the swap
    rule of tests/sync/test_dir_file_swap.py, with the ancestor of a file)."""
    pair = make_pair(tmp_path)
    write(pair.local / "p", HOST_BYTES)
    pair.ok("sync")
    (pair.remote / "p").unlink()
    write(pair.remote / "p" / "file", "remote dir file\n")
    report = pair.ok(command)
    assert (report["conflicts"], report["skipped"]) == ([], [])
    assert snapshot(pair.local) == snapshot(pair.remote)
    assert (pair.local / "p" / "file").read_text() == "remote dir file\n"
