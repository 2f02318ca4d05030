"""``filesync.cli.main.run``, the ``filesync`` command's entry: the process ends without
the interpreter's teardown only when that loses nothing. Output is complete, the exit code
is ``main``'s, ``atexit`` handlers run, and a thread still running is waited for (then
the normal exit is taken)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from synctree import write


def _run(code: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True,
                          text=True, timeout=300, stdin=subprocess.DEVNULL)


RUN = "import sys; sys.argv[0] = 'filesync'; from filesync.cli.main import run; "


def test_output_and_exit_code_are_main_s(tmp_path: Path) -> None:
    write(tmp_path / "local" / "a.txt", "a\n")
    argv = ["push", str(tmp_path / "local"), str(tmp_path / "remote"), "--json",
            "--state-dir", str(tmp_path / "state")]
    done = _run(RUN + "run()", *argv)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["uploaded"] == 1  # the whole document, flushed
    assert (tmp_path / "remote" / "a.txt").read_text() == "a\n"
    # The state was complete: the next run has nothing to do.
    again = _run(RUN + "run()", *argv)
    assert json.loads(again.stdout)["uploaded"] == 0
    bad = _run(RUN + "run()", "push", "--no-such-option")
    assert bad.returncode == 2 and "no-such-option" in bad.stderr


def _push(tmp: Path) -> list[str]:
    """A push that main returns from (``--version`` and ``--help`` exit inside argparse)."""
    write(tmp / "local" / "a.txt", "a\n")
    return ["push", str(tmp / "local"), str(tmp / "remote"), "--json",
            "--state-dir", str(tmp / "state")]


def test_atexit_handlers_run(tmp_path: Path) -> None:
    code = ("import atexit; atexit.register(lambda: print('handler ran', flush=True)); "
            + RUN + "run()")
    done = _run(code, *_push(tmp_path))
    assert done.returncode == 0
    assert done.stdout.splitlines()[-1] == "handler ran"


def test_a_thread_still_running_is_waited_for(tmp_path: Path) -> None:
    # The thread prints once the main thread has ended (Python's own exit marks it so
    # before it waits for the other threads): a process ended early never prints it.
    code = ("import threading, time\n"
            "def late():\n"
            "    while threading.main_thread().is_alive():\n"
            "        time.sleep(0.01)\n"
            "    print('thread finished', flush=True)\n"
            "threading.Thread(target=late).start()\n"
            + RUN + "run()")
    done = _run(code, *_push(tmp_path))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert json.loads(lines[0])["uploaded"] == 1 and lines[1:] == ["thread finished"]


def test_a_profiler_still_writes_its_report(tmp_path: Path) -> None:
    out = tmp_path / "run.prof"
    done = subprocess.run([sys.executable, "-m", "cProfile", "-o", str(out), "-m", "filesync",
                           *_push(tmp_path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["uploaded"] == 1
    import pstats

    assert pstats.Stats(str(out)).total_calls > 0


def test_the_command_collects_young_cycles_and_defers_full_collections(tmp_path: Path) -> None:
    """The ``filesync`` process sets its own collector's pace: young cycles are collected,
    full collections wait (they would traverse every listing entry again and again), and
    ``main``, which a host program may call, leaves the host's collector alone."""
    probe = ("import atexit, gc; atexit.register(lambda: print(gc.isenabled(), "
             "*gc.get_threshold())); ")
    default = _run("import gc; print(*gc.get_threshold())").stdout.split()
    done = _run(RUN + probe + "run()", *_push(tmp_path))
    assert done.returncode == 0, done.stderr
    enabled, young, middle, full = done.stdout.split()[-4:]
    from filesync.cli.main import FULL_COLLECTION_THRESHOLD

    assert enabled == "True" and [young, middle] == default[:2]
    assert int(full) == FULL_COLLECTION_THRESHOLD != int(default[2])
    # main() alone (a host program's call) keeps the interpreter's default.
    hosted = _run("import gc, sys; from filesync.cli.main import main; "
                  "code = main(sys.argv[1:]); print(*gc.get_threshold()); sys.exit(code)",
                  *_push(tmp_path)[:-2], "--state-dir", str(tmp_path / "state2"))
    assert hosted.returncode == 0, hosted.stderr
    assert hosted.stdout.split()[-3:] == default
