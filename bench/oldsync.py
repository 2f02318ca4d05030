"""The sync-back filesync replaces, re-implemented as a benchmark baseline.

Faithful to what the agent framework's remote backends did at teardown (see
``/work/shared/notes/system-we-replace.md``), in the "old" form that tars the whole mapped
remote root:

1. take the sync lock (``flock``); retry the whole sync-back 3x with backoff; never raise;
2. ``ssh HOST 'tar cf - -C / <remote root>'`` -- every file under the root, excluded
   bookkeeping (``.curator_backups``, ``node_modules``, ...) included -- written to a temp
   file, refused above a 2 GiB cap;
3. extract it with Python's ``data`` filter into a staging dir;
4. for each staged file, ``_apply_staged_file``: skip it if its SHA-256 equals the "pushed
   hash" recorded at push time; else find its host path from the (host, remote) mapping, or
   *infer* it from the first mapping whose remote parent dir is a prefix of the remote path
   (the bug: a synced top-level file such as ``.usage.json`` makes the root itself a mapped
   prefix, so excluded junk gets host paths and, having no pushed hash, is copied); a host
   file that also changed since the push is a conflict that is logged, and the remote wins;
   writes are ``shutil.copy2`` one file at a time, with SIGINT deferred during the apply.

The pushed hashes lived in the agent's memory; here the bench hands them over in a JSON file
(``{"host_root", "remote_root", "pushed": {rel: sha256}}``), loaded at start.

Usage: ``python3 oldsync.py --ssh-config CFG --host ALIAS --state FILE.json``; prints one JSON
line with what it did.  Stdlib only.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

MAX_TAR_BYTES = 2 << 30
RETRIES = 3


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


class OldSyncBack:
    def __init__(self, ssh_config: str, host: str, state: dict[str, Any], lock: str) -> None:
        self.ssh_config = ssh_config
        self.host = host
        self.host_root = state["host_root"].rstrip("/")
        self.remote_root = state["remote_root"].rstrip("/")
        # what the push recorded: host path -> SHA-256 of the bytes uploaded
        self.pushed: dict[str, str] = {
            f"{self.host_root}/{rel}": digest for rel, digest in state["pushed"].items()
        }
        # the sync list: (host path, remote path) pairs, in the order the push built them
        self.mapping: list[tuple[str, str]] = [
            (f"{self.host_root}/{rel}", f"{self.remote_root}/{rel}")
            for rel in sorted(state["pushed"])
        ]
        self.remote_to_host = {r: h for h, r in self.mapping}
        self.lock = lock
        self.stats = {"staged": 0, "skipped_same": 0, "copied": 0, "conflicts": 0,
                      "unmapped": 0, "tar_bytes": 0, "inferred": 0, "attempts": 0}
        self._deferred_sigint = False

    # -- the sync-back ----------------------------------------------------------------------

    def run(self) -> bool:
        """Never raises: logs and returns False after the last failed attempt."""
        fd = os.open(self.lock, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            for attempt in range(RETRIES):
                self.stats["attempts"] = attempt + 1
                try:
                    self._sync_back()
                    return True
                except Exception as exc:  # the old code logged and retried everything
                    print(f"sync-back attempt {attempt + 1} failed: {exc}", file=sys.stderr)
                    time.sleep(2 ** attempt)
            return False
        finally:
            os.close(fd)

    def _sync_back(self) -> None:
        with tempfile.TemporaryDirectory(prefix="oldsync-") as tmp:
            tar_path = os.path.join(tmp, "sync-back.tar")
            rel_root = self.remote_root.lstrip("/")
            with open(tar_path, "wb") as out:
                proc = subprocess.run(
                    ["ssh", "-F", self.ssh_config, self.host,
                     f"tar cf - -C / {shlex.quote(rel_root)}"],
                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.PIPE, check=False,
                )
            if proc.returncode != 0:
                raise RuntimeError(f"remote tar exited {proc.returncode}: {proc.stderr[-300:]!r}")
            size = os.path.getsize(tar_path)
            self.stats["tar_bytes"] = size
            if size > MAX_TAR_BYTES:
                raise RuntimeError(f"sync-back archive too large ({size} bytes); refused")
            staging = os.path.join(tmp, "staging")
            os.mkdir(staging)
            with tarfile.open(tar_path) as tf:
                tf.extractall(staging, filter="data")
            previous = signal.signal(signal.SIGINT, self._defer)
            try:
                for dirpath, _dirs, files in os.walk(staging):
                    for name in files:
                        staged = os.path.join(dirpath, name)
                        remote_path = "/" + os.path.relpath(staged, staging)
                        self.stats["staged"] += 1
                        self._apply_staged_file(staged, remote_path)
            finally:
                signal.signal(signal.SIGINT, previous)
                if self._deferred_sigint:
                    raise KeyboardInterrupt

    def _defer(self, _sig: int, _frame: Any) -> None:
        self._deferred_sigint = True

    def _host_path_for(self, remote_path: str) -> str | None:
        host = self.remote_to_host.get(remote_path)
        if host is not None:
            return host
        # infer: the first mapping whose remote parent dir is a prefix of the remote path
        for host_p, remote_p in self.mapping:
            remote_parent = os.path.dirname(remote_p)
            if remote_path.startswith(remote_parent + "/"):
                self.stats["inferred"] += 1
                return os.path.join(os.path.dirname(host_p),
                                    os.path.relpath(remote_path, remote_parent))
        return None

    def _apply_staged_file(self, staged: str, remote_path: str) -> None:
        host = self._host_path_for(remote_path)
        if host is None:
            self.stats["unmapped"] += 1
            return
        digest = _sha256(staged)
        pushed = self.pushed.get(host)
        if pushed == digest:
            self.stats["skipped_same"] += 1
            return
        if pushed is not None and os.path.exists(host) and _sha256(host) != pushed:
            # host also changed since the push: logged, remote wins (last write wins)
            print(f"sync-back conflict: {host} changed on both sides; remote wins",
                  file=sys.stderr)
            self.stats["conflicts"] += 1
        os.makedirs(os.path.dirname(host), exist_ok=True)
        shutil.copy2(staged, host)
        self.stats["copied"] += 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ssh-config", required=True)
    ap.add_argument("--host", required=True)
    ap.add_argument("--state", required=True, type=Path, help="pushed-hash JSON")
    ap.add_argument("--lock", default=None)
    args = ap.parse_args(argv)
    state = json.loads(args.state.read_text())
    lock = args.lock or str(args.state.with_suffix(".lock"))
    job = OldSyncBack(args.ssh_config, args.host, state, lock)
    ok = False
    with contextlib.suppress(KeyboardInterrupt):
        ok = job.run()
    print(json.dumps({"ok": ok, **job.stats}))
    return 0  # the old code never failed the caller


if __name__ == "__main__":
    sys.exit(main())
