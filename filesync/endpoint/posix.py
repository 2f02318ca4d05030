"""The POSIX fallback for remotes without python3: ``sh``, ``find`` and ``tar`` only.

``PosixEndpoint`` has the interface and the semantics of ``HelperEndpoint`` but runs
one short shell script per operation (one exec, no per-file round trip) instead of
the python3 helper. What it needs on the remote, detected once by ``start``:

- ``tar`` that reads a file list (``-T``; GNU tar, bsdtar and busybox do), ideally
  with ``--no-recursion``;
- ``find``: GNU find's ``-printf`` gives nanosecond mtimes; without it (BSD,
  busybox) every listed path goes through ``stat`` (GNU/busybox ``stat -c`` or BSD
  ``stat -f``) and mtimes have whole seconds;
- ``mv``, ``rm``, ``mkdir``, ``rmdir``, ``cat``, ``tr``, ``tail``, ``sort`` and, if present,
  ``xargs -0`` (else one ``stat`` per file where a batch would do).

A missing tool is one error line naming it and the fix (python3 is preferred).

Guarantees, per operation:

- ``list_tree``: the default excluded directory names are pruned on the remote
  (``find ... -prune``: nothing under them is listed or read); gitignore patterns
  are applied here, on the listing, before any content is asked for. Symlinks and
  special files are reported as skipped; hard-linked files too.
- ``fetch``: one ``tar -c`` stream, parsed here with ``tarfile`` in stream mode and
  never extracted: only regular-file members named exactly like a requested path
  are handed to the sink, each once. Links, devices, directories, ``..``, absolute
  and unexpected names are refused. A member whose size/mtime differs from the
  listing, or whose file changed while tar read it (checked after the stream), is
  reported failed, so the run retries it next time.
- ``send``: one tar stream built here is extracted by the remote ``tar -x`` into
  temp names beside the targets (``.filesync.<pid>.<n>.tmp``, which every listing
  skips), then each is renamed over its target by ``mv -f`` only if the target is
  still as listed (the check runs in ``sh`` right before the rename); mode and
  mtime come from the tar header. Missing parent directories are created with the
  default mode; existing ones are never chmodded. A file tar could not write whole
  (a full disk) fails alone; a stream that did not arrive whole commits nothing.
- ``delete``: ``rm -f`` only of files still as listed, then ``rmdir`` of the
  directories it left empty (never the root).
- Round trips: one command per operation; ``send`` reads the parent-directory verdicts
  before it streams (one exchange in the same command); a listing that finds temp files
  of gone runs removes them with one more command, as the helper's walk does.
- Paths with a symlinked parent directory are refused, as by the helper; unlike the
  helper (which opens every component with ``O_NOFOLLOW``), the check and the use
  are separate commands, so a concurrent swap on the remote in between is not caught.
"""

from __future__ import annotations

import asyncio
import contextlib
import posixpath
import re
import secrets
import shlex
import tarfile
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import IO, Any, cast

from filesync.core.exclude import DEFAULT_EXCLUDED_DIRS, ExcludeRule
from filesync.core.model import FILE, Entry, Listing, Skipped
from filesync.endpoint.contract import FetchHeader, FetchSink, Outcome, SendItem
from filesync.endpoint.helper import HelperEndpoint
from filesync.errors import ConnectionLost, FilesyncError, TransportError
from filesync.host.scan import filter_unsafe
from filesync.transport.base import Conduit, RemoteProcess
from filesync.tree.dirfd import is_temp_name
from filesync.tree.paths import unsafe_reason

__all__ = ["PosixEndpoint", "TarFetch", "Tools"]

#: Flavours of listing/stat: GNU find's -printf, ``stat -c`` (GNU, busybox), ``stat -f`` (BSD).
GNU_FIND, STAT_C, STAT_F = "gnu-find", "stat-c", "stat-f"
_CHUNK = 1 << 20
_SPOOL_MEMORY = 8 << 20
_RECORD = 10240
#: Largest listing, result or trailer text accepted from the remote.
MAX_TEXT = 256 << 20
_CHANGED = "changed on the remote during the run"
_TORN = "changed while being read"
#: find's complaint about one path: GNU quotes it ('./x' in the C locale), BSD does not.
_FIND_ERR = re.compile(r"^find: (?:'(\..*?)'|(\.(?:/.*?)?)): ([^:]+)$")
_TAR_ERR = re.compile(r"^tar: (.*): ([^:]+)$")


@dataclass(frozen=True, slots=True)
class Tools:
    """What the remote offers, as detected by ``PosixEndpoint.start``."""

    flavour: str = GNU_FIND  # GNU_FIND, STAT_C or STAT_F
    tar_norec: bool = True  # tar takes --no-recursion
    xargs0: bool = True  # xargs -0 works
    tar_no_unquote: bool = False  # GNU tar: -T names are taken literally only with this
    tar_version: str = ""


# --------------------------------------------------------------------------- shell code

_PROBE = r"""
LC_ALL=C; export LC_ALL
printf 'cwd=%s\n' "$(pwd -P 2>/dev/null || pwd)"
printf 'home=%s\n' "$HOME"
if command -v tar >/dev/null 2>&1; then
  printf 'tar=%s\n' "$(tar --version 2>/dev/null | head -n 1)"
  printf '/dev/null\n' | tar -cf - -T - >/dev/null 2>&1 && echo tarlist=1
  printf '/dev/null\n' | tar -cf - --no-recursion -T - >/dev/null 2>&1 && echo tarnorec=1
  printf '/dev/null\n' | tar -cf - --no-unquote -T - >/dev/null 2>&1 && echo tarnounquote=1
fi
if command -v find >/dev/null 2>&1; then
  echo find=1
  find /dev/null -prune -printf '' >/dev/null 2>&1 && echo findprintf=1
fi
if stat -c %s /dev/null >/dev/null 2>&1; then echo stat=c
elif stat -f %z /dev/null >/dev/null 2>&1; then echo stat=f; fi
printf 'x\0' | xargs -0 true >/dev/null 2>&1 && echo xargs0=1
for t in mv rm mkdir rmdir cat tr tail sort; do
  command -v "$t" >/dev/null 2>&1 || printf 'missing=%s\n' "$t"
done
echo end=1
"""

# st PATH: "size mtime" of PATH (not following a symlink); the listing's token format.
_ST = {
    GNU_FIND: "st() { find \"$1\" -prune -printf '%s %T@\\n' 2>/dev/null; }",
    STAT_C: "st() { stat -c '%s %Y' \"$1\" 2>/dev/null; }",
    STAT_F: "st() { stat -f '%z %m' \"$1\" 2>/dev/null; }",
}
# The same for many paths at once (they come as arguments), as "S size mtime path" lines.
_STM = {
    GNU_FIND: "find \"$@\" -prune -printf 'S %s %T@ %p\\n'",
    STAT_C: "stat -c 'S %s %Y %n' \"$@\"",
    STAT_F: "stat -f 'S %z %m %N' \"$@\"",
}
# One record per path: "X path" for a pruned directory, else "type nlink ino mode size mtime path".
_LIST = {
    GNU_FIND: ("-printf 'X %p\\0'", "-printf '%y %n %i %m %s %T@ %p\\0'"),
    STAT_C: ("-exec printf 'X %s\\n' {} +", "-exec stat -c '%f %h %i %s %Y %n' {} +"),
    STAT_F: ("-exec printf 'X %s\\n' {} +", "-exec stat -f '%p %l %i %z %m %N' {} +"),
}

# chk PATH: sets $why to a refusal reason if a parent of PATH is a symlink or not a
# directory ('' if every parent is a directory or absent). Builtins only; cached per dir.
_CHK = r"""
lastd=/; lastwhy=
chk() {
  case $1 in ./*) ;; *) why='unsafe path'; return 0;; esac
  d=${1%/*}
  if [ "$d" = "$lastd" ]; then why=$lastwhy; return 0; fi
  why=; q=$d
  while [ "$q" != . ]; do
    if [ -L "$q" ]; then why='symlink in path (not followed)'
    elif [ -e "$q" ] && [ ! -d "$q" ]; then why='a parent is not a directory'; fi
    q=${q%/*}
  done
  lastd=$d; lastwhy=$why
}
"""

_LIST_OP = r"""
if [ -d "$r" ]; then
  cd "$r" || exit 3
  echo D
  find . __PRUNE__ __ANY__
  printf __END__ "$?"
elif [ -e "$r" ] || [ -L "$r" ]; then echo N
else echo M
fi
"""

_FETCH_OP = r"""
IFS= read -r nonce
list=$(cat)
cd "$r" 2>/dev/null || list=
exec 3>&1
# tar's stdout is the stream (fd 3); its complaints, and those of the loop that keeps
# out what is no regular file (in tar's own format), are collected for the trailer.
err=$( { printf '%s\n' "$list" | while IFS= read -r p; do
    [ -n "$p" ] || continue
    chk "$p"
    if [ -n "$why" ]; then printf 'tar: %s: %s\n' "$p" "$why" >&4
    elif [ ! -e "$p" ] && [ ! -L "$p" ]; then
      printf 'tar: %s: No such file or directory\n' "$p" >&4
    elif [ -L "$p" ] || [ ! -f "$p" ]; then
      printf 'tar: %s: not a regular file on the remote\n' "$p" >&4
    else printf '%s\n' "$p"; fi
  done | tar -cf - __NOREC__ -T - 2>&1 >&3 3>&- 4>&-; } 4>&1 )
rc=$?
exec 3>&-
printf '\n%s rc %s\n' "$nonce" "$rc"
printf '%s\n' "$err" | while IFS= read -r l; do [ -z "$l" ] || printf 'E %s\n' "$l"; done
[ -z "$list" ] || printf '%s\n' "$list" | stm
printf '%s end\n' "$nonce"
"""

_SEND_OP = r"""
mf=; em=
trap 'rm -f ${mf:+"$mf"} ${em:+"$em"}' EXIT
IFS= read -r n || exit 3
if ! e=$(mkdir -p "$r" 2>&1) || ! e=$(cd "$r" 2>&1); then
  printf 'ROOTERR %s\n' "${e##*: }"; cat >/dev/null; exit 0
fi
cd "$r" || exit 3
i=0
while [ "$i" -lt "$n" ] && IFS='	' read -r exp p; do
  i=$((i+1))
  chk "$p"
  if [ -z "$why" ] && [ ! -d "${p%/*}" ]; then
    e=$(mkdir -p "${p%/*}" 2>&1) || why=${e##*: }
    lastd=/
  fi
  [ -z "$why" ] || printf 'V %s %s\n' "$i" "$why"
done
printf 'READY %s\n' "$$"
# The stream: the manifest (.0), the files under their temp names, an empty end mark
# (.n+1). Without both the manifest and the end mark it did not arrive whole.
mf=./.filesync.$$.0.tmp; em=./.filesync.$$.$((n+1)).tmp
err=$(tar -x -p -o -f - 2>&1); trc=$?
cat >/dev/null
if [ ! -f "$mf" ] || [ -L "$mf" ] || [ "$(tail -n 1 "$mf")" != END ] || [ ! -f "$em" ]; then
  printf 'ABORT\n'
  printf '%s\n' "$err" | while IFS= read -r l; do [ -z "$l" ] || printf 'E %s\n' "$l"; done
  find . __PRUNE_ONLY__ -type f -name ".filesync.$$.*.tmp" -exec rm -f {} + 2>/dev/null
  exit 0
fi
while IFS='	' read -r i exp p; do
  [ "$i" != END ] || break
  printf '%s/.filesync.%s.%s.tmp\n' "${p%/*}" "$$" "$i"
done < "$mf" | stm
lastd=/
while IFS='	' read -r i exp p; do
  [ "$i" != END ] || break
  t=${p%/*}/.filesync.$$.$i.tmp
  if [ ! -f "$t" ] || [ -L "$t" ]; then printf 'R %s missing\n' "$i"; continue; fi
  # tar names every member it could not write whole (a full disk, an I/O error).
  case $err in *"/.filesync.$$.$i.tmp:"*) rm -f "$t"; printf 'R %s missing\n' "$i"; continue;; esac
  chk "$p"
  if [ -n "$why" ]; then rm -f "$t"; printf 'R %s error %s\n' "$i" "$why"; continue; fi
  if [ "$exp" = - ]; then
    if [ -e "$p" ] || [ -L "$p" ]; then rm -f "$t"; printf 'R %s changed\n' "$i"; continue; fi
  elif [ -L "$p" ] || [ ! -f "$p" ] || [ "$(st "$p")" != "$exp" ]; then
    rm -f "$t"; printf 'R %s changed\n' "$i"; continue
  fi
  if e=$(mv -f "$t" "$p" 2>&1); then printf 'R %s ok\n' "$i"
  else rm -f "$t"; printf 'R %s error %s\n' "$i" "${e##*: }"; fi
done < "$mf"
printf '%s\n' "$err" | while IFS= read -r l; do [ -z "$l" ] || printf 'E %s\n' "$l"; done
echo DONE
"""

# Temp files of filesync runs whose process is gone (cut connections): removed.
_CLEAN_OP = r"""
cd "$r" || { cat >/dev/null; exit 0; }
while IFS= read -r p; do
  b=${p##*/}; x=${b#.filesync.}; pid=${x%%.*}
  case $pid in ''|*[!0-9]*) continue;; esac
  kill -0 "$pid" 2>/dev/null || rm -f "$p"
done
"""

_DELETE_OP = r"""
if ! cd "$r" 2>/dev/null; then
  if [ -e "$r" ] || [ -L "$r" ]; then echo NOTDIR; else echo GONE; fi
  cat >/dev/null
  exit 0
fi
exec 3>&1
i=0
# Answers go to fd 3; the parents of deleted files go down the pipe, deepest first, to
# be removed once if they were left empty (rmdir fails on anything else).
while IFS='	' read -r exp p; do
  i=$((i+1))
  chk "$p"
  if [ -n "$why" ]; then printf 'R %s error %s\n' "$i" "$why" >&3; continue; fi
  if [ ! -e "$p" ] && [ ! -L "$p" ]; then printf 'R %s ok\n' "$i" >&3; continue; fi
  if [ -L "$p" ] || [ ! -f "$p" ] || [ "$(st "$p")" != "$exp" ]; then
    printf 'R %s changed\n' "$i" >&3; continue
  fi
  if e=$(rm -f "$p" 2>&1) && [ ! -e "$p" ]; then
    printf 'R %s ok\n' "$i" >&3
    [ "${p%/*}" = . ] || printf '%s\n' "${p%/*}"
  else
    [ -n "$e" ] || e='not removed'
    printf 'R %s error %s\n' "$i" "${e##*: }" >&3
  fi
done | sort -r -u | while IFS= read -r d; do
  while [ "$d" != . ] && rmdir "$d" 2>/dev/null; do d=${d%/*}; done
done
echo DONE
"""


def _glob_escape(name: str) -> str:
    return re.sub(r"([\\*?\[])", r"\\\1", name)


def _prune_expr(names: Sequence[str]) -> str:
    """``\\( -name A -o -name B \\) -type d`` for the pruned directory names, or ''."""
    if not names:
        return ""
    alts = " -o ".join(f"-name {shlex.quote(_glob_escape(n))}" for n in names)
    return f"\\( {alts} \\) -type d"


def _stm(tools: Tools) -> str:
    if tools.xargs0:
        inner = "[ $# -gt 0 ] || exit 0; " + _STM[tools.flavour]
        return f"stm() {{ tr '\\n' '\\0' | xargs -0 sh -c {shlex.quote(inner)} sh 2>/dev/null; }}"
    return (
        "stm() { while IFS= read -r p; do s=$(st \"$p\") && [ -n \"$s\" ] && "
        "printf 'S %s %s\\n' \"$s\" \"$p\"; done; }"
    )


def _script(tools: Tools, root: str, body: str, names: Sequence[str] = ()) -> str:
    prune = _prune_expr(names)
    pruned, anything = _LIST[tools.flavour]
    body = (
        body.replace("__PRUNE__ __ANY__", f"{prune} {pruned} -prune -o {anything}" if prune
                     else anything)
        .replace("__END__", "'\\0END %s\\0'" if tools.flavour == GNU_FIND else "'\\nEND %s\\n'")
        .replace("__PRUNE_ONLY__", f"{prune} -prune -o" if prune else "")
        .replace("__NOREC__", " ".join(
            opt for opt, has in (("--no-recursion", tools.tar_norec),
                                 ("--no-unquote", tools.tar_no_unquote)) if has))
    )
    return "\n".join([
        "LC_ALL=C; export LC_ALL",
        f"r={shlex.quote(root)}",
        _ST[tools.flavour],
        _stm(tools),
        _CHK,
        body,
    ])


# --------------------------------------------------------------------------- parsing


def _mtime_ns(token: str, flavour: str) -> int:
    """The mtime field of a listing/stat line in nanoseconds (``ValueError`` if malformed)."""
    if flavour == GNU_FIND:
        try:
            return int(Decimal(token).scaleb(9))
        except InvalidOperation as exc:
            raise ValueError(token) from exc
    return int(token) * 1_000_000_000


def _mode(text: str, flavour: str) -> int:
    return int(text, 16 if flavour == STAT_C else 8)


_KIND_OF = {0o100000: "f", 0o040000: "d", 0o120000: "l"}


def _rel(path: str) -> str:
    """``./a/b`` -> ``a/b``; ``.`` -> ''."""
    if path == ".":
        return ""
    return path[2:] if path.startswith("./") else path


@dataclass(frozen=True, slots=True)
class _Listed:
    size: int
    mtime_ns: int
    token: str  # "size mtime" exactly as the remote's st() prints it


@dataclass(slots=True)
class _Record:
    rel: str
    kind: str  # f d l o, or X for a pruned directory
    nlink: int = 1
    ino: int = 0
    mode: int = 0
    size: int = 0
    mtime_ns: int = 0
    token: str = ""


def _parse_records(data: bytes, flavour: str) -> list[_Record]:
    """The listing's records; ``TransportError`` unless find ran to its end."""
    sep = b"\0" if flavour == GNU_FIND else b"\n"
    raws = [raw for raw in data.split(sep) if raw]
    end = raws.pop().decode("ascii", "replace") if raws else ""
    if not re.fullmatch(r"END [01]", end):
        # A listing cut short would make every file after the cut look deleted.
        raise TransportError(
            "the remote listing did not finish (connection lost or find failed"
            + (f": exit {end[4:]}" if end.startswith("END ") else "")
            + "); rerun to continue, nothing was changed"
        )
    out = []
    for raw in raws:
        text = raw.decode("utf-8", "surrogateescape")
        if text.startswith("X "):
            out.append(_Record(_rel(text[2:]), "X"))
            continue
        try:
            if flavour == GNU_FIND:
                fields = text.split(" ", 6)
                if len(fields) != 7:
                    raise ValueError(text)
                kind, nlink, ino, mode, size, mtime, path = fields
                mode_bits = int(mode, 8)
                kind = kind if kind in "fdl" else "o"
            else:
                parts = text.split(" ", 5)
                if len(parts) != 6:
                    raise ValueError(text)
                rawmode, nlink, ino, size, mtime, path = parts
                full = _mode(rawmode, flavour)
                kind = _KIND_OF.get(full & 0o170000, "o")
                mode_bits = full & 0o7777
            out.append(_Record(_rel(path), kind, int(nlink), int(ino), mode_bits, int(size),
                               _mtime_ns(mtime, flavour), f"{size} {mtime}"))
        except ValueError as exc:
            raise TransportError(
                f"remote find printed an unexpected line: {text[:80]!r}") from exc
    return out


def _stat_lines(text: str, flavour: str) -> dict[str, tuple[int, int, str]]:
    """``S size mtime path`` lines -> {rel: (size, mtime_ns, token)}."""
    out: dict[str, tuple[int, int, str]] = {}
    for line in text.splitlines():
        if not line.startswith("S "):
            continue
        parts = line[2:].split(" ", 2)
        if len(parts) != 3:
            continue
        with contextlib.suppress(ValueError):
            out[_rel(parts[2])] = (int(parts[0]), _mtime_ns(parts[1], flavour),
                                   f"{parts[0]} {parts[1]}")
    return out


def _tar_errors(lines: list[str]) -> dict[str, str]:
    """``tar: ./path: Cannot open: Permission denied`` -> {rel: 'Permission denied'}."""
    out: dict[str, str] = {}
    for line in lines:
        m = _TAR_ERR.match(line)
        if m:
            path = m.group(1).split(": ", 1)[0]
            reason = m.group(2).strip()
            if reason.startswith("Wrote only"):  # GNU tar's word for a short write
                reason = f"the remote disk is probably full ({reason})"
            out.setdefault(_rel(path), reason)
    return out


# --------------------------------------------------------------------------- process I/O


class _Lines:
    """Buffered reading of a remote process's stdout, bounded by ``MAX_TEXT``."""

    def __init__(self, proc: RemoteProcess) -> None:
        self.proc = proc
        self.buf = bytearray()
        self.eof = False

    async def _more(self) -> bool:
        if self.eof:
            return False
        chunk = await self.proc.read(1 << 16)
        if not chunk:
            self.eof = True
            return False
        self.buf += chunk
        if len(self.buf) > MAX_TEXT:
            raise TransportError("the remote sent more output than expected; rerun")
        return True

    async def line(self) -> str | None:
        """The next line without its newline; ``None`` at the end of output."""
        while True:
            at = self.buf.find(b"\n")
            if at >= 0:
                raw = bytes(self.buf[:at])
                del self.buf[: at + 1]
                return raw.decode("utf-8", "surrogateescape")
            if not await self._more():
                if self.buf:
                    raw = bytes(self.buf)
                    self.buf.clear()
                    return raw.decode("utf-8", "surrogateescape")
                return None

    async def rest(self) -> bytes:
        """Everything up to the end of output."""
        while await self._more():
            pass
        data = bytes(self.buf)
        self.buf.clear()
        return data


def _sink_call(fn: Callable[..., Any], *args: Any, path: str = "") -> Any:
    """Run a sink call; a host-side write failure (disk full) ends the run cleanly."""
    try:
        return fn(*args)
    except OSError as exc:
        raise FilesyncError(
            f"cannot stage {path!r} on the host: {exc.strerror or exc}; free space in the "
            "state dir (or pass --state-dir) and rerun, nothing was applied"
        ) from exc


class _Bridge:
    """A blocking ``read`` for ``tarfile`` (in a worker thread) over an async process."""

    def __init__(self, proc: RemoteProcess, loop: asyncio.AbstractEventLoop) -> None:
        self.proc = proc
        self.loop = loop
        self._reads = [b"", b""]

    def read(self, n: int = -1) -> bytes:
        want = max(n, 1 << 18)  # tarfile copes with more than it asked for
        data: bytes = asyncio.run_coroutine_threadsafe(self.proc.read(want), self.loop).result()
        self._reads = [self._reads[1], data]
        return data

    @property
    def tail(self) -> bytes:
        """The last two reads: tarfile stops reading at the end-of-archive block, so all
        it read past the archive (the start of what follows) is in there."""
        return self._reads[0] + self._reads[1]


# --------------------------------------------------------------------------- tar parsing


@dataclass(slots=True)
class TarFetch:
    """Reads a ``tar -c`` stream of requested files into a sink, refusing everything else.

    ``wanted`` maps each requested relative path to its listing (or ``None`` if it was
    not listed). Only regular-file members named exactly ``path`` or ``./path`` for a
    wanted, not yet delivered path are passed to the sink; their size and mtime must
    agree with the listing. Nothing is ever extracted to the filesystem.
    ``refused`` collects ``(member name, reason)`` for every member not delivered.
    """

    wanted: dict[str, _Listed | None]
    sink: FetchSink
    delivered: dict[str, tuple[int, float]] = field(default_factory=dict)
    refused: list[tuple[str, str]] = field(default_factory=list)
    reported: set[str] = field(default_factory=set)

    def run(self, fileobj: IO[bytes] | _Bridge) -> None:
        """Consume the stream up to its end-of-archive; ``TransportError`` if it breaks off."""
        try:
            with tarfile.open(fileobj=cast(IO[bytes], fileobj), mode="r|",
                              encoding="utf-8", errors="surrogateescape") as tar:
                for member in tar:
                    self._member(tar, member)
        except tarfile.TarError as exc:
            raise ConnectionLost(
                f"the remote tar stream broke off or is not a tar stream ({exc}); "
                "rerun to continue, nothing was half-applied"
            ) from exc

    def _refuse(self, rel: str | None, name: str, reason: str) -> None:
        self.refused.append((name, reason))
        if rel is not None:
            self.reported.add(rel)
            self.sink.failed(rel, reason)

    def _member(self, tar: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        name = member.name
        rel = name[2:] if name.startswith("./") else name
        if rel not in self.wanted or rel in self.reported or rel in self.delivered:
            self._refuse(None, name, "not a requested file")
            return
        if member.type not in (tarfile.REGTYPE, tarfile.AREGTYPE):
            self._refuse(rel, name, "not a regular file on the remote")
            return
        listed = self.wanted[rel]
        if listed is not None and (
            member.size != listed.size or int(member.mtime // 1) != listed.mtime_ns // 10**9
        ):
            self._refuse(rel, name, _CHANGED)
            return
        mtime_ns = listed.mtime_ns if listed is not None else int(member.mtime * 10**9)
        head = FetchHeader(rel, member.size, mtime_ns, member.mode & 0o7777)
        source = tar.extractfile(member)
        if source is None:  # not reachable for a regular file
            self._refuse(rel, name, "not a regular file on the remote")
            return
        write = _sink_call(self.sink.begin, head, path=rel)
        got = 0
        try:
            while chunk := source.read(_CHUNK):
                got += len(chunk)
                _sink_call(write, chunk, path=rel)
        except BaseException:
            with contextlib.suppress(Exception):
                self.sink.end(head, False, "connection lost")
            self.reported.add(rel)
            raise
        whole = got == member.size
        _sink_call(self.sink.end, head, whole, "" if whole else _TORN, path=rel)
        if whole:
            self.delivered[rel] = (member.size, member.mtime)
        else:
            self.reported.add(rel)

    def finish(self, post: dict[str, tuple[int, int, str]], errors: dict[str, str]) -> None:
        """Settle every wanted path after the stream: report the missing and the torn.

        ``post`` is the remote's stat of each path after tar read it; a delivered file
        whose stat moved (or vanished) since the listing is revoked as torn.
        """
        for rel, listed in self.wanted.items():
            if rel in self.reported:
                continue
            if rel not in self.delivered:
                self.sink.failed(rel, errors.get(rel, "vanished from the remote"))
                continue
            after = post.get(rel)
            size, mtime = self.delivered[rel]
            if after is None:
                torn = True
            elif listed is not None:
                torn = after[2] != listed.token
            else:
                torn = after[0] != size or after[1] // 10**9 != int(mtime // 1)
            if torn:
                self.sink.failed(rel, _TORN)


def _trailer(region: bytes, nonce: bytes) -> tuple[int, list[str]] | None:
    """The (tar exit code, lines) of the fetch trailer, or ``None`` if it is not whole."""
    start = region.rfind(b"\n" + nonce + b" rc ")
    if start < 0:
        return None
    lines = region[start + 1:].decode("utf-8", "surrogateescape").split("\n")
    try:
        code = int(lines[0].split(" ")[2])
    except (IndexError, ValueError):
        return None
    end = f"{nonce.decode()} end"
    if end not in lines:
        return None
    return code, lines[1: lines.index(end)]


# --------------------------------------------------------------------------- the session


def _missing_tools_error(facts: dict[str, list[str]]) -> str | None:
    """The one-line refusal for a remote that lacks what the fallback needs, or None."""
    hint = "install python3 (preferred)"
    if "tar" not in facts:
        return f"the remote has no python3 and no tar; {hint} or tar"
    if "tarlist" not in facts:
        return (f"the remote has no python3 and its tar cannot read a file list (-T); "
                f"{hint} or GNU tar")
    if "find" not in facts:
        return f"the remote has no python3 and no find; {hint} or find (findutils)"
    if "findprintf" not in facts and "stat" not in facts:
        return (f"the remote has no python3, its find has no -printf (not GNU find) and it "
                f"has no stat; {hint}, GNU findutils or stat")
    if facts.get("missing"):
        names = " and ".join(facts["missing"])
        return f"the remote has no python3 and no {names}; {hint} or coreutils"
    return None


class PosixEndpoint(HelperEndpoint):
    """``HelperEndpoint`` for a remote without python3: one shell script per operation."""

    def __init__(self, conduit: Conduit, proc: RemoteProcess, hello: dict[str, Any],
                 tools: Tools) -> None:
        super().__init__(conduit, proc, hello)
        self.tools = tools
        self._listed: dict[str, dict[str, _Listed]] = {}
        self._stale: dict[str, list[str]] = {}
        self._running: set[RemoteProcess] = set()

    @classmethod
    async def start(
        cls,
        conduit: Conduit,
        *,
        list_first: tuple[str, ExcludeRule] | None = None,
        watch: bool = False,
        tools: Tools | None = None,
    ) -> HelperEndpoint:
        """Probe the remote's tools in one command; ``TransportError`` naming what is missing.

        ``tools`` overrides what is detected (tests use it to force a flavour).
        ``list_first`` and ``watch`` are accepted for ``HelperEndpoint.start``'s sake and
        ignored: every operation here is its own command, started when it is asked for
        (every listing is a full ``find``).
        """
        proc = await conduit.start(_PROBE)
        await proc.write_eof()
        out = _Lines(proc)
        text = (await out.rest()).decode("utf-8", "surrogateescape")
        await proc.wait()
        facts: dict[str, list[str]] = {}
        for line in text.splitlines():
            key, sep, value = line.partition("=")
            if sep:
                facts.setdefault(key, []).append(value)
        if "end" not in facts or "cwd" not in facts:
            err = (await proc.read_stderr()).decode(errors="replace").strip().splitlines()
            tail = err[-1] if err else text.strip()[:200]
            raise TransportError(
                f"the remote shell did not answer the POSIX fallback's probe: {tail or 'no output'}"
            )
        problem = _missing_tools_error(facts)
        if problem is not None:
            raise TransportError(problem)
        if tools is None:
            flavour = (GNU_FIND if "findprintf" in facts
                       else STAT_C if facts["stat"][0] == "c" else STAT_F)
            tools = Tools(flavour, "tarnorec" in facts, "xargs0" in facts,
                          "tarnounquote" in facts, facts["tar"][0])
        hello = {"cwd": facts["cwd"][0], "home": facts.get("home", [""])[0], "posix": True,
                 "flavour": tools.flavour}
        return cls(conduit, proc, hello, tools)

    # -- plumbing ---------------------------------------------------------------------

    async def _start(self, script: str) -> tuple[RemoteProcess, asyncio.Task[bytes]]:
        proc = await self.conduit.start(script)
        self._running.add(proc)
        # stderr is drained all along: a chatty command must never block on a full pipe.
        return proc, asyncio.create_task(proc.read_stderr())

    def _abandon(self, proc: RemoteProcess, *tasks: asyncio.Future[Any]) -> None:
        """Stop a command that failed midway, and the tasks reading or feeding it."""
        for task in tasks:
            task.cancel()
        proc.kill()
        self._running.discard(proc)

    async def _finish(self, proc: RemoteProcess, err: asyncio.Task[bytes]) -> str:
        """Wait for the command's end; its stderr's last line."""
        try:
            await proc.wait()
            lines = (await err).decode("utf-8", "replace").strip().splitlines()
        finally:
            self._running.discard(proc)
        return lines[-1] if lines else ""

    def _broken(self, what: str, stderr: str) -> TransportError:
        detail = f": {stderr}" if stderr else ""
        return TransportError(
            f"the remote shell failed during {what} (POSIX fallback){detail}; rerun, "
            "or install python3 there"
        )

    def _token(self, root: str, rel: str, size: int, mtime_ns: int) -> str:
        """The listing's stat token for ``rel`` if it still describes (size, mtime_ns).

        A path not listed (or listed otherwise) gets the token GNU find's ``%T@`` prints
        for that size and mtime; where the remote prints whole seconds only, a token no
        stat prints, so the remote check says "changed" rather than guess.
        """
        listed = self._listed.get(root, {}).get(rel)
        if listed is not None and (listed.size, listed.mtime_ns) == (size, mtime_ns):
            return listed.token
        if self.tools.flavour == GNU_FIND and mtime_ns >= 0:
            return f"{size} {mtime_ns // 10**9}.{mtime_ns % 10**9:09d}0"
        return "?"

    # -- operations -------------------------------------------------------------------

    async def list_tree(self, root: str, rule: ExcludeRule) -> Listing:
        """List regular files under ``root``; see the module doc for what is pruned where."""
        script = _script(self.tools, root, _LIST_OP, rule.dir_names)
        proc, err = await self._start(script)
        await proc.write_eof()
        out = _Lines(proc)
        status = await out.line()
        data = await out.rest() if status == "D" else b""
        stderr_text = ""
        try:
            await proc.wait()
            stderr_text = (await err).decode("utf-8", "surrogateescape")
        finally:
            self._running.discard(proc)
        if status == "N":
            raise TransportError(f"remote root {root} is not a directory; give a directory path")
        if status == "M":
            return Listing(root, False)
        if status != "D":
            raise self._broken("the listing", stderr_text.strip()[-200:])
        listing = self._listing(root, rule, _parse_records(data, self.tools.flavour),
                                stderr_text)
        filter_unsafe(listing)  # an unsafe name is never an entry
        if self._stale.get(root):
            await self._clean(root, self._stale.pop(root))
        return listing

    async def _clean(self, root: str, stale: list[str]) -> None:
        """Remove temp files left by filesync runs that are gone, as the helper's walk does.

        Only ever run after a cut connection left some (one more command, then).
        """
        proc, err = await self._start(_script(self.tools, root, _CLEAN_OP))
        try:
            await proc.write("".join(f"./{rel}\n" for rel in stale).encode(
                "utf-8", "surrogateescape"))
            await proc.write_eof()
            await _Lines(proc).rest()
        except BaseException:
            self._abandon(proc, err)
            raise
        await self._finish(proc, err)

    def _listing(self, root: str, rule: ExcludeRule, records: list[_Record],
                 stderr_text: str) -> Listing:
        matcher = rule.matcher()
        listing = Listing(root, True)
        listed: dict[str, _Listed] = {}
        stale: list[str] = []
        pruned: set[str] = set()

        def under_pruned(rel: str) -> bool:
            at = rel.find("/")
            while at >= 0:
                if rel[:at] in pruned:
                    return True
                at = rel.find("/", at + 1)
            return False

        for rec in sorted(records, key=lambda r: r.rel.count("/")):
            rel = rec.rel
            if not rel or under_pruned(rel):
                continue
            if rec.kind == "X" or (rec.kind == "d" and matcher.matches(rel, True)):
                listing.excluded += 1
                pruned.add(rel)
            elif rec.kind == "d":
                continue
            elif matcher.matches(rel, False):
                listing.excluded += 1
            elif rec.kind == "f":
                if is_temp_name(posixpath.basename(rel)):
                    stale.append(rel)
                elif rec.nlink > 1:
                    listing.skipped.append(Skipped(rel, "hard link on the remote (not synced)"))
                else:
                    listing.entries[rel] = Entry(rel, FILE, rec.size, rec.mtime_ns, rec.mode,
                                                 rec.ino)
                    listed[rel] = _Listed(rec.size, rec.mtime_ns, rec.token)
            elif rec.kind == "l":
                listing.skipped.append(Skipped(rel, "symlink (not followed)"))
            else:
                listing.skipped.append(Skipped(rel, "special file (fifo, socket or device)"))
        for line in stderr_text.splitlines():
            m = _FIND_ERR.match(line)
            if m is None:
                continue
            rel = _rel(m.group(1) or m.group(2))
            if rel and (under_pruned(rel) or rel in pruned):
                continue
            listing.skipped.append(Skipped(rel or ".", f"unreadable directory: {m.group(3)}"))
        self._listed[root] = listed
        self._stale[root] = stale
        return listing

    async def fetch(self, root: str, paths: Sequence[str], sink: FetchSink) -> None:
        """Stream ``paths`` into ``sink`` through one remote ``tar -c``; see the module doc."""
        wanted: dict[str, _Listed | None] = {}
        for rel in dict.fromkeys(paths):
            if unsafe_reason(rel) is not None:
                sink.failed(rel, "unsafe path")
            else:
                wanted[rel] = self._listed.get(root, {}).get(rel)
        if not wanted:
            return
        nonce = secrets.token_hex(16).encode()
        script = _script(self.tools, root, _FETCH_OP)
        proc, err = await self._start(script)
        parser = TarFetch(wanted, sink)
        try:
            request = nonce + b"\n" + "".join(f"./{rel}\n" for rel in wanted).encode(
                "utf-8", "surrogateescape")
            await proc.write(request)
            await proc.write_eof()
            bridge = _Bridge(proc, asyncio.get_running_loop())
            await asyncio.to_thread(parser.run, bridge)
            rest = _Lines(proc)
            region = bridge.tail + await rest.rest()
        except BaseException:
            self._abandon(proc, err)
            raise
        stderr_line = await self._finish(proc, err)
        trailer = _trailer(region, nonce)
        if trailer is None:
            raise ConnectionLost(
                "the remote tar stream ended without its trailer (connection lost?); "
                "rerun to continue, nothing was half-applied"
                if not stderr_line else f"remote fetch failed: {stderr_line}; rerun"
            )
        _code, lines = trailer
        errors = _tar_errors([ln[2:] for ln in lines if ln.startswith("E ")])
        post = _stat_lines("\n".join(lines), self.tools.flavour)
        parser.finish(post, errors)

    async def send(self, root: str, items: Iterable[SendItem],
                   count: int | None = None) -> list[Outcome]:
        """Upload ``items`` in one tar stream; each is renamed into place only if unchanged.

        (``count`` is for ``HelperEndpoint.send``'s sake: every item is numbered here.)"""
        results: dict[int, Outcome] = {}
        numbered: list[tuple[int, SendItem, str]] = []
        total = 0
        for i, item in enumerate(items, 1):
            total = i
            if unsafe_reason(item.path) is not None:
                results[i] = Outcome(item.path, "error", reason="unsafe path")
                continue
            exp = "-" if item.expect is None else self._token(root, item.path, *item.expect)
            numbered.append((i, item, exp))
        if numbered:
            results.update(await self._upload(root, numbered))
        return [results[i] for i in range(1, total + 1)]

    async def _upload(
        self, root: str, numbered: list[tuple[int, SendItem, str]]
    ) -> dict[int, Outcome]:
        head = f"{len(numbered)}\n"
        head += "".join(f"{exp}\t./{item.path}\n" for _i, item, exp in numbered)
        # The names only prune the search for this run's own temp files after a cut stream.
        script = _script(self.tools, root, _SEND_OP, DEFAULT_EXCLUDED_DIRS)
        proc, err = await self._start(script)
        out = _Lines(proc)
        # Written while the verdicts are read: neither side may block on a full pipe.
        writer = asyncio.create_task(proc.write(head.encode("utf-8", "surrogateescape")))
        try:
            refused: dict[int, str] = {}
            pid = ""
            while (line := await out.line()) is not None:
                if line.startswith("V "):
                    _v, num, reason = line.split(" ", 2)
                    refused[int(num)] = reason
                elif line.startswith(("READY ", "ROOTERR ")):
                    pid = line
                    break
            await writer
            if not pid.startswith("READY "):
                await proc.write_eof()
                await out.rest()
                stderr_line = await self._finish(proc, err)
                if pid.startswith("ROOTERR "):
                    reason = pid[len("ROOTERR "):] or "cannot create the remote root"
                    return {i: Outcome(item.path, "error", reason=reason)
                            for i, item, _e in numbered}
                raise self._broken("an upload", stderr_line)
            remote_pid = pid.split(" ", 1)[1]
            if not remote_pid.isdigit():
                raise self._broken("an upload", f"unexpected answer {pid[:40]!r}")
            sent, local_errors = await self._stream(proc, remote_pid, numbered, refused)
            await proc.write_eof()
            lines = (await out.rest()).decode("utf-8", "surrogateescape").splitlines()
        except BaseException:
            self._abandon(proc, err, writer)
            raise
        stderr_line = await self._finish(proc, err)
        return self._send_results(numbered, refused, local_errors, sent, lines, remote_pid,
                                  stderr_line)

    async def _stream(self, proc: RemoteProcess, pid: str,
                      numbered: list[tuple[int, SendItem, str]], refused: dict[int, str]
                      ) -> tuple[dict[int, int], dict[int, str]]:
        """Write the tar stream: the manifest, each file under its temp name, the end mark.

        The manifest lists every file that is about to follow; a file whose local read
        fails is left out of the stream and comes back "missing" (its error is kept here).
        """
        sent: dict[int, int] = {}
        local_errors: dict[int, str] = {}
        total = 0

        async def put(data: bytes) -> None:
            nonlocal total
            total += len(data)
            await proc.write(data)

        todo = [(i, item, exp) for i, item, exp in numbered if i not in refused]
        manifest = "".join(f"{i}\t{exp}\t./{item.path}\n" for i, item, exp in todo) + "END\n"
        data = manifest.encode("utf-8", "surrogateescape")
        await put(_header(f"./.filesync.{pid}.0.tmp", len(data), 0o600, 0) + data
                  + b"\0" * (-len(data) % 512))
        for i, item, _exp in todo:
            with tempfile.SpooledTemporaryFile(max_size=_SPOOL_MEMORY) as spool:
                try:
                    for chunk in item.chunks():
                        spool.write(chunk)
                except OSError as exc:
                    local_errors[i] = f"local read failed: {exc.strerror or exc}"
                    continue
                size = spool.tell()
                spool.seek(0)
                parent = posixpath.dirname(item.path)
                name = posixpath.join(".", parent, f".filesync.{pid}.{i}.tmp")
                await put(_header(name, size, item.mode, item.mtime_ns))
                while chunk := spool.read(_CHUNK):
                    await put(chunk)
                await put(b"\0" * (-size % 512))
            sent[i] = size
        end = _header(f"./.filesync.{pid}.{len(numbered) + 1}.tmp", 0, 0o600, 0)
        end += b"\0" * 1024  # end-of-archive, then padding to whole tar records
        await put(end + b"\0" * (-(total + len(end)) % _RECORD))
        return sent, local_errors

    def _send_results(self, numbered: list[tuple[int, SendItem, str]], refused: dict[int, str],
                      local_errors: dict[int, str], sent: dict[int, int], lines: list[str],
                      pid: str, stderr_line: str) -> dict[int, Outcome]:
        status: dict[int, tuple[str, str]] = {}
        tar_lines: list[str] = []
        aborted = done = False
        for line in lines:
            if line.startswith("R "):
                parts = line.split(" ", 3)
                with contextlib.suppress(ValueError, IndexError):
                    status[int(parts[1])] = (parts[2], parts[3] if len(parts) > 3 else "")
            elif line.startswith("E "):
                tar_lines.append(line[2:])
            elif line == "ABORT":
                aborted = True
            elif line == "DONE":
                done = True
        if not aborted and not done:
            raise ConnectionLost(
                "the remote upload ended without its results (connection lost?); "
                "rerun to continue, nothing was half-applied"
                if not stderr_line else f"remote upload failed: {stderr_line}; rerun"
            )
        tar_errors = _tar_errors(tar_lines)
        stats = _stat_lines("\n".join(lines), self.tools.flavour)
        out: dict[int, Outcome] = {}
        for i, item, _exp in numbered:
            temp = posixpath.join(posixpath.dirname(item.path), f".filesync.{pid}.{i}.tmp")
            if i in refused:
                out[i] = Outcome(item.path, "error", reason=refused[i])
            elif i in local_errors:
                out[i] = Outcome(item.path, "error", reason=local_errors[i])
            elif aborted:
                causes = [ln for ln in tar_lines if "previous errors" not in ln]
                why = causes[0] if causes else "stream cut short"
                out[i] = Outcome(item.path, "error",
                                 reason=f"remote tar did not get the whole stream ({why})")
            else:
                state, reason = status.get(i, ("missing", ""))
                if state == "ok":
                    size, mtime_ns, _tok = stats.get(temp, (sent.get(i, 0), 0, ""))
                    out[i] = Outcome(item.path, "ok", size, mtime_ns)
                elif state == "changed":
                    out[i] = Outcome(item.path, "changed", reason=_CHANGED)
                elif state == "error":
                    out[i] = Outcome(item.path, "error", reason=reason or "rename failed")
                else:
                    out[i] = Outcome(item.path, "error",
                                     reason=tar_errors.get(temp, "not written on the remote"))
        return out

    async def delete(self, root: str, files: Sequence[Entry]) -> list[Outcome]:
        """Delete files that are still as listed; others come back ``changed``."""
        files = [e for e in files if e.kind == FILE]
        results: dict[int, Outcome] = {}
        asked: list[tuple[int, Entry]] = []
        for i, e in enumerate(files, 1):
            if unsafe_reason(e.path) is not None:
                results[i] = Outcome(e.path, "error", reason="unsafe path")
            else:
                asked.append((i, e))
        if asked:
            request = "".join(
                f"{self._token(root, e.path, e.size, e.mtime_ns)}\t./{e.path}\n" for _i, e in asked
            ).encode("utf-8", "surrogateescape")
            proc, err = await self._start(_script(self.tools, root, _DELETE_OP))

            async def feed() -> None:
                await proc.write(request)
                await proc.write_eof()

            # Written while the answers are read: neither side may block on a full pipe.
            writer = asyncio.create_task(feed())
            try:
                lines = (await _Lines(proc).rest()).decode("utf-8", "surrogateescape")
                await writer
            except BaseException:
                self._abandon(proc, err, writer)
                raise
            stderr_line = await self._finish(proc, err)
            results.update(self._delete_results(asked, lines.splitlines(), stderr_line))
        return [results[i] for i in range(1, len(files) + 1)]

    def _delete_results(self, asked: list[tuple[int, Entry]], lines: list[str],
                        stderr_line: str) -> dict[int, Outcome]:
        if "GONE" in lines:
            return {i: Outcome(e.path, "ok") for i, e in asked}
        if "NOTDIR" in lines:
            return {i: Outcome(e.path, "error", reason="the remote root is not a directory")
                    for i, e in asked}
        if "DONE" not in lines:
            raise ConnectionLost(
                "the remote delete ended without its results (connection lost?); rerun"
                if not stderr_line else f"remote delete failed: {stderr_line}; rerun"
            )
        status: dict[int, tuple[str, str]] = {}
        for line in lines:
            parts = line.split(" ", 3)
            if parts[0] == "R" and len(parts) >= 3 and parts[1].isdigit():
                status[int(parts[1])] = (parts[2], parts[3] if len(parts) > 3 else "")
        out: dict[int, Outcome] = {}
        for i, e in asked:
            state, reason = status.get(i, ("error", "no answer from the remote"))
            if state == "ok":
                out[i] = Outcome(e.path, "ok")
            elif state == "changed":
                out[i] = Outcome(e.path, "changed", reason=_CHANGED)
            else:
                out[i] = Outcome(e.path, "error", reason=reason or "not removed")
        return out

    async def close(self) -> None:
        """Stop any command still running (an operation was interrupted); never raises."""
        for proc in list(self._running):
            with contextlib.suppress(Exception):
                proc.kill()
        self._running.clear()


def _header(name: str, size: int, mode: int, mtime_ns: int) -> bytes:
    """A pax tar header for a regular file; the pax mtime keeps the nanoseconds."""
    info = tarfile.TarInfo(name)
    info.size = size
    info.mode = mode & 0o7777
    info.type = tarfile.REGTYPE
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = mtime_ns // 10**9
    if mtime_ns % 10**9 and mtime_ns > 0:
        info.pax_headers = {"mtime": f"{mtime_ns // 10**9}.{mtime_ns % 10**9:09d}"}
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
