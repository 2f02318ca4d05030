"""``PairState`` on real SQLite: round trips, atomic transactions, the pair lock, the dirs."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from filesync.errors import LockBusy
from filesync.host.state import (
    Ancestor,
    ConflictRecord,
    PairState,
    StatePool,
    default_state_dir,
    pair_key,
)

PAIR = ("/home/u/skills", "user@host:22", "/srv/skills")


def anc(n: int) -> Ancestor:
    mode = 0o644 if n % 2 else 0o755
    return Ancestor(f"h{n:032x}", 100 + n, mode, 200 + n, 10**18 + n, 2 * 10**18)


def open_pair(state_dir: Path, *pair: str, timeout: float = 0.0) -> PairState:
    local, ident, remote = pair or PAIR
    return PairState.open(state_dir, local, ident, remote, lock_timeout=timeout)


def integrity(db: Path) -> str:
    conn = sqlite3.connect(db)
    try:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])
    finally:
        conn.close()


# -- round trips -----------------------------------------------------------------------


def test_ancestors_round_trip_across_reopen(tmp_path: Path) -> None:
    rows = {f"dir/file {n}.txt": anc(n) for n in range(20)}
    rows["ünïcode/名前"] = anc(99)
    state = open_pair(tmp_path)
    try:
        assert state.ancestors() == {}
        state.put_ancestors(rows.items())
        assert state.ancestors() == rows
    finally:
        state.close()
    state = open_pair(tmp_path)
    try:
        assert state.ancestors() == rows
        replaced = anc(1000)
        state.put_ancestors([("dir/file 3.txt", replaced)])
        state.forget(["dir/file 4.txt", "never-there"])
        expected = dict(rows)
        expected["dir/file 3.txt"] = replaced
        del expected["dir/file 4.txt"]
        assert state.ancestors() == expected
    finally:
        state.close()


def test_caches_and_conflicts_round_trip(tmp_path: Path) -> None:
    state = open_pair(tmp_path)
    try:
        state.replace_local_cache([("a", 1, 2, 3, "ha"), ("b", 4, 5, 6, "hb")])
        state.replace_local_cache([("c", 7, 8, 9, "hc")])  # replaces, does not merge
        assert state.local_cache() == {"c": (7, 8, 9, "hc")}
        state.put_remote_cache([("r", 1, 2, "hr")])
        state.put_remote_cache([("s", 3, 4, "hs"), ("r", 5, 6, "hr2")])  # merges
        assert state.remote_cache() == {"r": (5, 6, "hr2"), "s": (3, 4, "hs")}
        c1 = ConflictRecord("x", "hl", "hr", "/saved/x")
        c2 = ConflictRecord("y", None, "hr", None)
        state.set_conflicts([c1, c2], [])
        state.set_conflicts([], ["x"])
        assert state.conflicts() == {"y": c2}
    finally:
        state.close()


def test_transaction_rolls_back_on_exception(tmp_path: Path) -> None:
    state = open_pair(tmp_path)
    try:
        state.put_ancestors([("kept", anc(1))])
        with pytest.raises(RuntimeError, match="boom"), state.transaction() as conn:
            conn.execute("DELETE FROM ancestor")
            conn.execute(
                "INSERT INTO ancestor VALUES (?,?,?,?,?,?,?)", ("new", "h", 1, 0o644, 1, 1, 1)
            )
            raise RuntimeError("boom")
        assert state.ancestors() == {"kept": anc(1)}
        # the connection is usable again afterwards
        state.put_ancestors([("after", anc(2))])
        assert set(state.ancestors()) == {"kept", "after"}
    finally:
        state.close()
    # and nothing of the rolled-back transaction reached the file
    state = open_pair(tmp_path)
    try:
        assert set(state.ancestors()) == {"kept", "after"}
    finally:
        state.close()


def test_a_failing_row_lands_none_of_its_batch(tmp_path: Path) -> None:
    state = open_pair(tmp_path)
    try:
        bad = Ancestor(None, 1, 0o644, 1, 1, 1)  # type: ignore[arg-type]  # NOT NULL
        with pytest.raises(sqlite3.IntegrityError):
            state.put_ancestors([("a", anc(1)), ("b", anc(2)), ("c", bad)])
        assert state.ancestors() == {}
    finally:
        state.close()


def test_close_is_idempotent_and_closes(tmp_path: Path) -> None:
    state = open_pair(tmp_path)
    state.close()
    state.close()
    with pytest.raises(AssertionError):
        state.ancestors()


# -- the lock --------------------------------------------------------------------------


def test_an_idle_pooled_database_keeps_no_page_cache(tmp_path: Path) -> None:
    """A pooled state's connection outlives its pass (a watch keeps it between passes):
    given back to the pool, it first lets go of its page cache."""
    pool = StatePool()
    state = PairState.open(tmp_path, *PAIR, pool=pool)
    state.put_ancestors((f"f{i}", anc(i)) for i in range(2000))
    assert len(state.ancestors()) == 2000
    said: list[str] = []
    state.conn.set_trace_callback(said.append)
    state.close()
    assert said == ["PRAGMA shrink_memory"]
    assert len(pool) == 1
    pool.close()


def test_second_open_of_the_same_pair_is_refused(tmp_path: Path) -> None:
    first = open_pair(tmp_path)
    try:
        with pytest.raises(LockBusy) as info:
            open_pair(tmp_path)
        message = str(info.value)
        assert "--lock-timeout" in message
        assert str(os.getpid()) in message  # names the holder
    finally:
        first.close()
    # released on close: the next open succeeds at once
    open_pair(tmp_path).close()


def test_lock_is_held_against_another_process(tmp_path: Path) -> None:
    first = open_pair(tmp_path)
    try:
        code = (
            "import sys\n"
            "from pathlib import Path\n"
            "from filesync.errors import LockBusy\n"
            "from filesync.host.state import PairState\n"
            "try:\n"
            "    PairState.open(Path(sys.argv[1]), *sys.argv[2:5])\n"
            "except LockBusy as exc:\n"
            "    print(exc)\n"
            "    sys.exit(7)\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", code, str(tmp_path), *PAIR],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 7, done.stderr
        assert "--lock-timeout" in done.stdout
    finally:
        first.close()


def lock_fds(lock: Path) -> int:
    """How many descriptors of this process have the lock file open."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            count += os.readlink(f"/proc/self/fd/{fd}") == str(lock)
    return count


def test_lock_timeout_waits_for_the_holder(tmp_path: Path) -> None:
    held = threading.Event()
    closing = threading.Event()
    errors: list[BaseException] = []

    def holder() -> None:
        # SQLite connections belong to their thread: open and close in this one.
        try:
            first = open_pair(tmp_path)
            try:
                first.put_ancestors([("from-first", anc(1))])
                held.set()
                # Hold on until the waiter has the lock file open too (it is then in its
                # wait loop), so the wait really happens, however slow the machine is.
                deadline = time.monotonic() + 60
                while lock_fds(first.dir / "lock") < 2:
                    assert time.monotonic() < deadline, "the second open never waited"
                    threading.Event().wait(0.01)
            finally:
                closing.set()
                first.close()
        except BaseException as exc:  # reported below
            errors.append(exc)
            held.set()

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert held.wait(30)
        assert errors == []
        second = open_pair(tmp_path, timeout=60)
        try:
            assert closing.is_set()  # it only got in once the holder was closing
            assert second.ancestors() == {"from-first": anc(1)}
            assert (second.dir / "lock").read_text().strip() == str(os.getpid())
        finally:
            second.close()
    finally:
        thread.join()
    assert errors == []


def test_different_pairs_get_different_dirs_and_open_together(tmp_path: Path) -> None:
    pairs = [
        PAIR,
        ("/home/u/other", "user@host:22", "/srv/skills"),
        ("/home/u/skills", "user@otherhost:22", "/srv/skills"),
        ("/home/u/skills", "user@host:22", "/srv/other"),
    ]
    states = [open_pair(tmp_path, *p) for p in pairs]
    try:
        dirs = {s.dir for s in states}
        assert len(dirs) == len(pairs)
        for s, p in zip(states, pairs, strict=True):
            assert s.dir.parent == tmp_path / "pairs"
            assert s.dir.name == pair_key(*p)
            assert (s.dir.stat().st_mode & 0o077) == 0
        states[0].put_ancestors([("only-in-first", anc(1))])
        assert all(s.ancestors() == {} for s in states[1:])
    finally:
        for s in states:
            s.close()


def test_pairs_differing_only_in_where_a_newline_sits_do_not_share_state(
    tmp_path: Path,
) -> None:
    one = ("/home/u/a\nuser@host", "x", "/srv/r")
    two = ("/home/u/a", "user@host\nx", "/srv/r")
    first = open_pair(tmp_path, *one)
    try:
        first.put_ancestors([("only-in-one", anc(1))])
    finally:
        first.close()
    second = open_pair(tmp_path, *two)
    try:
        assert second.dir != first.dir
        assert second.ancestors() == {}
    finally:
        second.close()


def test_pair_key_is_stable() -> None:
    assert pair_key(*PAIR) == pair_key(*PAIR)
    assert len(pair_key(*PAIR)) == 16


# -- the state dir ---------------------------------------------------------------------


def test_state_dir_env_wins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FILESYNC_STATE_DIR", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert default_state_dir() == tmp_path / "explicit"


def test_state_dir_env_expands_tilde(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("FILESYNC_STATE_DIR", "~/fs-state")
    assert default_state_dir() == tmp_path / "fs-state"


def test_state_dir_uses_xdg_state_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("FILESYNC_STATE_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert default_state_dir() == tmp_path / "xdg" / "filesync"


@pytest.mark.parametrize("empty", ["FILESYNC_STATE_DIR", "XDG_STATE_HOME"])
def test_state_dir_falls_back_to_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, empty: str
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("FILESYNC_STATE_DIR", "")
    monkeypatch.setenv("XDG_STATE_HOME", "")
    monkeypatch.delenv(empty)
    assert default_state_dir() == tmp_path / ".local" / "state" / "filesync"


def test_open_creates_the_state_dir_tree(tmp_path: Path) -> None:
    state_dir = tmp_path / "not" / "yet"
    state = open_pair(state_dir)
    try:
        assert (state.dir / "state.db").is_file()
        assert (state.dir / "lock").is_file()
        assert (state.dir / "pair.json").is_file()
    finally:
        state.close()


# -- parallel writers ------------------------------------------------------------------

ROWS_PER_WRITER = 40


def write_many(state: PairState, tag: str) -> None:
    for n in range(ROWS_PER_WRITER):
        state.put_ancestors([(f"{tag}/{n}/{k}", anc(n * 10 + k)) for k in range(5)])
        state.replace_local_cache([(f"{tag}/{n}", n, n, n, "h")])
        state.forget([f"{tag}/{n}/0"])


def test_parallel_threads_on_different_pairs(tmp_path: Path) -> None:
    errors: list[BaseException] = []
    dirs: list[Path] = []

    def writer(i: int) -> None:
        try:
            state = open_pair(tmp_path, f"/local/{i}", "host", "/remote")
            dirs.append(state.dir)
            try:
                write_many(state, f"t{i}")
            finally:
                state.close()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(set(dirs)) == 6
    for i, d in enumerate(sorted(dirs)):
        assert integrity(d / "state.db") == "ok", i
    for i in range(6):
        state = open_pair(tmp_path, f"/local/{i}", "host", "/remote")
        try:
            assert len(state.ancestors()) == ROWS_PER_WRITER * 4
        finally:
            state.close()


WRITER = """
import sys
from pathlib import Path
from filesync.host.state import Ancestor, PairState
state_dir, local, tag, timeout = Path(sys.argv[1]), sys.argv[2], sys.argv[3], float(sys.argv[4])
state = PairState.open(state_dir, local, "host", "/remote", lock_timeout=timeout)
try:
    for n in range(40):
        state.put_ancestors(
            [(f"{tag}/{n}/{k}", Ancestor("h", n, 0o644, k, n, n)) for k in range(5)]
        )
        state.forget([f"{tag}/{n}/0"])
finally:
    state.close()
"""


def run_writers(tmp_path: Path, locals_and_tags: list[tuple[str, str]], timeout: float) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(tmp_path), local, tag, str(timeout)],
            stderr=subprocess.PIPE,
            text=True,
        )
        for local, tag in locals_and_tags
    ]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err


def test_parallel_processes_on_different_pairs(tmp_path: Path) -> None:
    run_writers(tmp_path, [(f"/local/{i}", f"p{i}") for i in range(5)], 0.0)
    for i in range(5):
        state = open_pair(tmp_path, f"/local/{i}", "host", "/remote")
        try:
            assert integrity(state.dir / "state.db") == "ok"
            assert len(state.ancestors()) == 40 * 4
            assert {p.split("/")[0] for p in state.ancestors()} == {f"p{i}"}
        finally:
            state.close()


def test_processes_on_the_same_pair_take_turns(tmp_path: Path) -> None:
    run_writers(tmp_path, [("/local/shared", f"q{i}") for i in range(4)], 120.0)
    state = open_pair(tmp_path, "/local/shared", "host", "/remote")
    try:
        assert integrity(state.dir / "state.db") == "ok"
        assert len(state.ancestors()) == 4 * 40 * 4
    finally:
        state.close()
