"""Deterministic (seeded) benchmark trees, edits and tree comparison.

Everything here is stdlib only and takes explicit seeds, so two runs of the bench build
byte-identical trees with identical mtimes.  Nothing is ever written inside the repo: the
bench builds the trees under a tmpfs it mounts itself.

The main tree is shaped like an agent framework's skills dir::

    .bundled_manifest, .usage.json                 top-level files (what triggered the old bug)
    skill-NNN/SKILL.md
    skill-NNN/{scripts,references,templates,assets}/...   text files, 0.5-8 KiB
    skill-NNN/assets/blob-N.bin                    20 x 1 MiB random binaries in all
    skill-NNN/node_modules/...                     5,000 small files (excluded)
    .curator_backups/backup-NN.tar                 24 x 1 MiB (excluded)
"""

from __future__ import annotations

import hashlib
import os
import random
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

#: mtimes of generated files: a fixed instant well in the past (2023-11-14), one second apart
#: per file, so runs are identical and no file looks "just modified" to any tool.
BASE_MTIME = 1_700_000_000
MiB = 1 << 20

#: The exclusions every tool gets: filesync's default pruned directory names.
EXCLUDED_DIRS: tuple[str, ...] = (
    ".git", ".github", ".hub", ".archive", ".curator_backups", ".locks",
    ".venv", "venv", "node_modules", "site-packages", "__pycache__",
    ".tox", ".nox", ".pytest_cache", ".mypy_cache", ".ruff_cache",
)  # fmt: skip

_WORDS = (
    "agent", "skill", "tool", "call", "file", "sync", "remote", "host", "state", "hash", "tree",
    "push", "pull", "the", "a", "of", "to", "and", "in", "is", "for", "with", "on", "by", "this",
    "that", "from", "be", "as", "are", "was", "it", "use", "run", "script", "reference",
    "template", "asset", "python", "shell", "command", "output", "input", "error", "retry",
    "timeout", "config", "path", "directory", "upload", "fetch", "conflict", "merge", "resolve",
    "version", "ancestor", "stream", "channel", "cipher", "window", "packet", "latency",
)


@dataclass(frozen=True)
class TreeSpec:
    """Shape of the main tree."""

    skills: int = 60  # x 5 dirs each = 300 dirs
    text_files: int = 3000
    text_min: int = 512
    text_max: int = 8192
    binaries: int = 20
    binary_size: int = MiB
    node_modules_files: int = 5000
    curator_mib: int = 24

    @classmethod
    def smoke(cls) -> TreeSpec:
        return cls(skills=4, text_files=60, binaries=2, binary_size=64 << 10,
                   node_modules_files=50, curator_mib=1)


@dataclass
class TreeInfo:
    """What a generated tree holds (kept = what every tool should transfer)."""

    kept_files: int = 0
    kept_bytes: int = 0
    excluded_files: int = 0
    excluded_bytes: int = 0
    dirs: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


class _Writer:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.counter = 0
        self.info = TreeInfo()
        self._dirs: set[Path] = set()

    def write(self, rel: str, data: bytes, *, excluded: bool = False, mode: int = 0o644) -> None:
        path = self.root / rel
        parent = path.parent
        if parent not in self._dirs:
            parent.mkdir(parents=True, exist_ok=True)
            self._dirs.add(parent)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fchmod(fd, mode)
            mtime = (BASE_MTIME + self.counter) * 1_000_000_000
            os.utime(fd, ns=(mtime, mtime))
        finally:
            os.close(fd)
        self.counter += 1
        if excluded:
            self.info.excluded_files += 1
            self.info.excluded_bytes += len(data)
        else:
            self.info.kept_files += 1
            self.info.kept_bytes += len(data)


def _corpus(rng: random.Random, size: int = 1 << 18) -> bytes:
    words: list[str] = []
    total = 0
    line = 0
    while total < size:
        w = rng.choice(_WORDS)
        words.append(w)
        total += len(w) + 1
        line += len(w) + 1
        if line > 72:
            words.append("\n")
            line = 0
    return " ".join(words).encode()[:size]


def _text(rng: random.Random, corpus: bytes, lo: int, hi: int) -> bytes:
    n = rng.randint(lo, hi)
    start = rng.randrange(0, len(corpus) - n)
    return corpus[start:start + n]


def make_main_tree(root: Path, spec: TreeSpec = TreeSpec(), seed: int = 1) -> TreeInfo:
    """Build the skills-like tree under ``root`` (which must not exist or be empty)."""
    rng = random.Random(seed)
    corpus = _corpus(rng)
    w = _Writer(root)
    subdirs = ("", "scripts", "references", "templates", "assets")
    w.write(".bundled_manifest", "\n".join(f"skill-{i:03d}" for i in range(spec.skills)).encode())
    w.write(".usage.json", b'{"calls": 0}\n')
    # text files spread round-robin over skills x subdirs
    n_text = spec.text_files - 2
    for i in range(n_text):
        skill = i % spec.skills
        sub = subdirs[(i // spec.skills) % len(subdirs)]
        base = f"skill-{skill:03d}/" + (f"{sub}/" if sub else "")
        if sub == "" and i < spec.skills:
            rel = base + "SKILL.md"
        else:
            ext = {"": ".md", "scripts": ".py", "references": ".md", "templates": ".txt",
                   "assets": ".json"}[sub]
            rel = f"{base}f{i:05d}{ext}"
        mode = 0o755 if sub == "scripts" else 0o644
        w.write(rel, _text(rng, corpus, spec.text_min, spec.text_max), mode=mode)
    for b in range(spec.binaries):
        skill = (b * 7) % spec.skills
        w.write(f"skill-{skill:03d}/assets/blob-{b:02d}.bin", rng.randbytes(spec.binary_size))
    # excluded: node_modules under a few skills, packages of ~50 files each
    per_pkg = 50
    for j in range(spec.node_modules_files):
        skill = (j // 1000) % spec.skills
        pkg = (j // per_pkg)
        rel = f"skill-{skill:03d}/node_modules/pkg-{pkg:03d}/lib/m{j:05d}.js"
        w.write(rel, _text(rng, corpus, 64, 600), excluded=True)
    for k in range(spec.curator_mib):
        w.write(f".curator_backups/backup-{k:02d}.tar", rng.randbytes(MiB), excluded=True)
    w.info.dirs = len({p for p in w._dirs})
    return w.info


def make_small_tree(root: Path, n_files: int, seed: int = 2, per_dir: int = 100) -> TreeInfo:
    """``n_files`` small text files (100-1500 bytes), ``per_dir`` to a directory."""
    rng = random.Random(seed)
    corpus = _corpus(rng)
    w = _Writer(root)
    for i in range(n_files):
        d = i // per_dir
        w.write(f"d{d // 100:03d}/d{d:05d}/f{i:06d}.txt", _text(rng, corpus, 100, 1500))
    w.info.dirs = len(w._dirs)
    return w.info


def make_big_file(root: Path, size: int, seed: int = 3) -> TreeInfo:
    """One file of ``size`` random bytes, written in 16 MiB pieces (seeded)."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    path = root / "big.bin"
    piece = rng.randbytes(16 * MiB)
    with path.open("wb") as f:
        left = size
        i = 0
        while left > 0:
            # vary each piece cheaply so no two 16 MiB blocks are equal
            chunk = piece if i == 0 else (i.to_bytes(8, "big") + piece[8:])
            f.write(chunk[:left])
            left -= len(chunk[:left])
            i += 1
    mtime = BASE_MTIME * 1_000_000_000
    os.utime(path, ns=(mtime, mtime))
    info = TreeInfo(kept_files=1, kept_bytes=size, dirs=1)
    return info


# -- selecting and editing --------------------------------------------------------------------


def kept_files(root: Path, excluded_dirs: Iterable[str] = EXCLUDED_DIRS) -> list[str]:
    """Sorted relative paths of regular files under ``root``, pruning excluded dir names."""
    names = frozenset(excluded_dirs)
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in names]
        rel_dir = os.path.relpath(dirpath, root)
        for name in filenames:
            p = os.path.join(dirpath, name)
            if stat.S_ISREG(os.lstat(p).st_mode):
                out.append(name if rel_dir == "." else f"{rel_dir}/{name}")
    return sorted(out)


def pick(paths: list[str], k: int, seed: int, suffixes: tuple[str, ...] = (".md", ".py", ".txt",
         ".json")) -> list[str]:
    """``k`` text files chosen deterministically from ``paths``."""
    text = [p for p in paths if p.endswith(suffixes) and "/" in p]
    return sorted(random.Random(seed).sample(text, k))


def edit(roots: Iterable[Path], rels: list[str], seed: int) -> int:
    """Rewrite ``rels`` under each root with the same new bytes; returns bytes per root.

    The new content is the old one with a seeded line appended and a seeded line prepended
    (size changes, mtime becomes now), i.e. what an editor would do.
    """
    rng = random.Random(seed)
    new: dict[str, bytes] = {}
    roots = list(roots)
    for rel in rels:
        old = (roots[0] / rel).read_bytes()
        tag = f"# edit {seed} {rng.getrandbits(64):016x}\n".encode()
        new[rel] = tag + old + tag
    for root in roots:
        for rel, data in new.items():
            (root / rel).write_bytes(data)
    return sum(len(d) for d in new.values())


# -- comparing --------------------------------------------------------------------------------


def digest_tree(root: Path, excluded_dirs: Iterable[str] = EXCLUDED_DIRS) -> dict[str, str]:
    """rel -> sha256 of every kept regular file (excluded dir names pruned)."""
    out = {}
    for rel in kept_files(root, excluded_dirs):
        h = hashlib.sha256()
        with open(root / rel, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        out[rel] = h.hexdigest()
    return out


def compare_trees(a: Path, b: Path, excluded_dirs: Iterable[str] = EXCLUDED_DIRS) -> list[str]:
    """Differences between the kept files of two trees (empty list: equal)."""
    da, db = digest_tree(a, excluded_dirs), digest_tree(b, excluded_dirs)
    problems = [f"only in {a}: {p}" for p in sorted(da.keys() - db.keys())]
    problems += [f"only in {b}: {p}" for p in sorted(db.keys() - da.keys())]
    problems += [f"differs: {p}" for p in sorted(da.keys() & db.keys()) if da[p] != db[p]]
    return problems
