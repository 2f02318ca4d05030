"""Random edits of a small tree, for the watched-listing property tests of both sides
(``tests/tree/test_watch.py``: the remote helper's inotify; ``tests/host/test_watched.py``:
the host's watchfiles)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from hypothesis import strategies as st
from synctree import write

from filesync.core.exclude import ExcludeRule
from filesync.tree.ignore import Matcher

MATCHER = Matcher(["node_modules"], ExcludeRule.build(["*.log"]).rules())


def canon(result: tuple[Any, ...]) -> tuple[Any, ...]:
    entries, skipped, excluded = result[:3]
    return sorted(map(tuple, entries)), sorted(map(tuple, skipped)), excluded


def seed(root: Path) -> None:
    for d in ("a", "a/b", "c"):
        for i in range(3):
            write(root / d / f"f{i}.txt", f"{d} {i}\n")
    write(root / "node_modules" / "x.js", "junk\n")
    write(root / "a" / "skip.log", "excluded by pattern\n")


# Each operation mutates the tree under a root; names are drawn from a small set so that
# operations meet (edit what was created, remove what was renamed, ...).
NAMES = st.sampled_from(["f0.txt", "f1.txt", "new.txt", "z.log", "sub"])
DIRS = st.sampled_from(["", "a", "a/b", "c", "node_modules", "d"])
OPS = st.tuples(st.sampled_from(["write", "append", "touch", "chmod", "rm", "mv", "mkdir",
                                 "rmtree", "mvdir", "symlink", "fifo", "link"]), DIRS, NAMES,
                DIRS, NAMES)


def apply_op(root: Path, op: tuple[str, str, str, str, str], n: int) -> None:
    kind, d1, n1, d2, n2 = op
    src, dst = root / d1 / n1, root / d2 / n2
    if kind in ("write", "append") and src.is_fifo():
        return  # opening a FIFO for writing would wait for a reader forever
    if kind == "link" and (d2 == "node_modules" or n2.endswith(".log")):
        # A link made from outside what is listed (another tree, an excluded name) raises
        # no event where the watch can see it: the next full walk notices it (a limit,
        # see docs/design.md). Links inside the listed tree are covered here.
        return
    try:
        if kind == "write":
            write(src, f"v{n}\n" * (n % 5 + 1))
        elif kind == "append":
            with open(src, "a") as f:
                f.write("more\n")
        elif kind == "touch":
            os.utime(src, ns=(n * 1_000_000_007, n * 1_000_000_007))
        elif kind == "chmod":
            src.chmod(0o600 if n % 2 else 0o644)
        elif kind == "rm":
            src.unlink()
        elif kind == "mv":
            os.rename(src, dst)
        elif kind == "mkdir":
            (src / "inner").mkdir(parents=True)
            write(src / "inner" / "g.txt", "in a new dir\n")
        elif kind == "rmtree":
            shutil.rmtree(root / d1)
        elif kind == "mvdir":
            os.rename(root / d1, root / d2 / f"moved{n}")
        elif kind == "symlink":
            os.symlink("f0.txt", src)
        elif kind == "fifo":
            os.mkfifo(src)
        elif kind == "link":
            os.link(src, dst)
    except OSError:
        pass  # the operation did not apply to this tree state: nothing changed


