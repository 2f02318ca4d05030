"""git itself as the oracle of the exclusion rule: what it ignores in a scratch tree.

One bare repository serves every tree: ``git --git-dir=G --work-tree=TREE`` reads
``TREE/.gitignore`` and nothing else (no system, global or per-user exclude file).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

GITIGNORE = ".gitignore"


class GitOracle:
    def __init__(self, scratch: Path) -> None:
        git = shutil.which("git")
        assert git is not None, "git is needed as the oracle (scripts/dev installs it)"
        self.git = git
        self.gitdir = scratch / "oracle.git"
        home = scratch / "home"
        home.mkdir(parents=True, exist_ok=True)
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
            "XDG_CONFIG_HOME": str(home), "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull, "LC_ALL": "C",
        }  # fmt: skip
        self._git(scratch, "init", "-q", "--bare", str(self.gitdir))

    def _git(self, cwd: Path, *args: str, stdin: bytes = b"") -> bytes:
        argv = [self.git, "-c", f"core.excludesFile={os.devnull}", "-c", "core.ignoreCase=false",
                *args]
        done = subprocess.run(argv, cwd=cwd, env=self.env, input=stdin, capture_output=True,
                              check=False)
        assert done.returncode in (0, 1), done.stderr.decode(errors="replace")
        return done.stdout

    def _in(self, tree: Path, *args: str, stdin: bytes = b"") -> list[str]:
        out = self._git(tree, f"--git-dir={self.gitdir}", f"--work-tree={tree}", *args,
                        stdin=stdin)
        return [os.fsdecode(item) for item in out.split(b"\0") if item]

    def kept_files(self, tree: Path) -> set[str]:
        """The files git does not ignore under ``tree`` (its ``.gitignore`` left out)."""
        kept = self._in(tree, "ls-files", "--others", "--exclude-standard", "-z")
        return set(kept) - {GITIGNORE}

    def ignored(self, tree: Path, rels: Iterable[str]) -> set[str]:
        """Which of ``rels`` (existing paths under ``tree``) git ignores, parents counted."""
        data = b"".join(os.fsencode(rel) + b"\0" for rel in rels)
        return set(self._in(tree, "check-ignore", "--no-index", "-z", "--stdin", stdin=data))


def write_gitignore(tree: Path, lines: Iterable[str], newline: str = "\n") -> None:
    (tree / GITIGNORE).write_bytes(os.fsencode("".join(line + newline for line in lines)))


def make_tree(root: Path, paths: Iterable[tuple[str, ...]]) -> set[str]:
    """Create each path as a file (a path blocked by an existing file is left out); return
    the files made, relative and POSIX."""
    made: set[str] = set()
    for parts in paths:
        target = root.joinpath(*parts)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            if not target.exists():
                target.write_bytes(b"x")
                made.add("/".join(parts))
        except (FileExistsError, NotADirectoryError):
            continue
    return made
