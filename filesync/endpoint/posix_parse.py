"""Reading what the POSIX fallback's scripts print: listings, stat lines, tar complaints,
trailers and the probe's facts. Everything from the remote is bounded and validated:
a listing or an answer that did not arrive whole is an error, never a shorter tree."""

from __future__ import annotations

import contextlib
import posixpath
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from filesync.core.exclude import ExcludeRule
from filesync.core.model import FILE, Entry, Listing, Skipped
from filesync.endpoint.posix_scripts import GNU_FIND, STAT_C
from filesync.errors import TransportError
from filesync.transport.base import RemoteProcess
from filesync.tree.dirfd import is_temp_name
from filesync.tree.wire import Reason, describe, parse_reason

#: Largest listing, result or trailer text accepted from the remote.
MAX_TEXT = 256 << 20
#: find's complaint about one path: GNU quotes it ('./x' in the C locale), BSD does not.
FIND_ERR = re.compile(r"^find: (?:'(\..*?)'|(\.(?:/.*?)?)): ([^:]+)$")
_TAR_ERR = re.compile(r"^tar: (.*): ([^:]+)$")


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


def rel_of(path: str) -> str:
    """``./a/b`` -> ``a/b``; ``.`` -> ''."""
    if path == ".":
        return ""
    return path[2:] if path.startswith("./") else path


@dataclass(frozen=True, slots=True)
class Listed:
    size: int
    mtime_ns: int
    token: str  # "size mtime" exactly as the remote's st() prints it


@dataclass(slots=True)
class Record:
    rel: str
    kind: str  # f d l o, or X for a pruned directory
    nlink: int = 1
    ino: int = 0
    mode: int = 0
    size: int = 0
    mtime_ns: int = 0
    token: str = ""


def parse_records(data: bytes, flavour: str) -> list[Record]:
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
            out.append(Record(rel_of(text[2:]), "X"))
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
            out.append(Record(rel_of(path), kind, int(nlink), int(ino), mode_bits, int(size),
                               _mtime_ns(mtime, flavour), f"{size} {mtime}"))
        except ValueError as exc:
            raise TransportError(
                f"remote find printed an unexpected line: {text[:80]!r}") from exc
    return out


def build_listing(root: str, rule: ExcludeRule, records: list[Record],
                  stderr_text: str) -> tuple[Listing, dict[str, Listed], list[str]]:
    """The listing of ``records`` under ``rule`` (excluded directories and everything
    under them counted once), with find's complaints as unreadable directories; also
    the listed stat tokens and the temp files of filesync runs found."""
    matcher = rule.matcher()
    listing = Listing(root, True)
    listed: dict[str, Listed] = {}
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
                listing.skipped.append(Skipped.of(rel, Reason.HARD_LINK))
            else:
                listing.entries[rel] = Entry(rel, FILE, rec.size, rec.mtime_ns, rec.mode,
                                             rec.ino)
                listed[rel] = Listed(rec.size, rec.mtime_ns, rec.token)
        elif rec.kind == "l":
            listing.skipped.append(Skipped.of(rel, Reason.SYMLINK))
        else:
            listing.skipped.append(Skipped.of(rel, Reason.SPECIAL_FILE))
    for line in stderr_text.splitlines():
        m = FIND_ERR.match(line)
        if m is None:
            continue
        rel = rel_of(m.group(1) or m.group(2))
        if rel and (under_pruned(rel) or rel in pruned):
            continue
        listing.skipped.append(Skipped.of(rel or ".", Reason.UNREADABLE, m.group(3)))
    return listing, listed, stale


def stat_lines(text: str, flavour: str) -> dict[str, tuple[int, int, str]]:
    """``S size mtime path`` lines -> {rel: (size, mtime_ns, token)}."""
    out: dict[str, tuple[int, int, str]] = {}
    for line in text.splitlines():
        if not line.startswith("S "):
            continue
        parts = line[2:].split(" ", 2)
        if len(parts) != 3:
            continue
        with contextlib.suppress(ValueError):
            out[rel_of(parts[2])] = (int(parts[0]), _mtime_ns(parts[1], flavour),
                                   f"{parts[0]} {parts[1]}")
    return out


def tar_errors(lines: list[str]) -> dict[str, tuple[Reason, str]]:
    """``tar: ./path: Cannot open: Permission denied`` -> {rel: (os-error, 'Permission
    denied')}; the scripts' own refusals, ``tar: ./path: =<code>``, keep their code."""
    out: dict[str, tuple[Reason, str]] = {}
    for line in lines:
        m = _TAR_ERR.match(line)
        if m:
            path = m.group(1).split(": ", 1)[0]
            reason = m.group(2).strip()
            if reason.startswith("="):
                code = parse_reason(reason[1:])
                out.setdefault(rel_of(path), (code, describe(code)))
                continue
            if reason.startswith("Wrote only"):  # GNU tar's word for a short write
                reason = f"the remote disk is probably full ({reason})"
            out.setdefault(rel_of(path), (Reason.OS_ERROR, reason))
    return out


def result_reason(text: str) -> tuple[Reason, str]:
    """A script's ``<code>`` or ``os <detail>`` answer as (code, human text)."""
    if text.startswith("os "):
        return Reason.OS_ERROR, text[3:] or describe(Reason.OS_ERROR)
    code = parse_reason(text)
    return code, describe(code, text if code is Reason.OS_ERROR else "")


class Lines:
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


def trailer(region: bytes, nonce: bytes) -> tuple[int, list[str]] | None:
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


def missing_tools_error(facts: dict[str, list[str]]) -> str | None:
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
    if "findnomaxdepth" in facts:
        return (f"the remote has no python3 and its find has no -maxdepth (needed to list "
                f"level by level, never reading excluded directories); {hint} or GNU "
                f"findutils")
    if facts.get("missing"):
        names = " and ".join(facts["missing"])
        return f"the remote has no python3 and no {names}; {hint} or coreutils"
    return None


def statuses(lines: list[str]) -> dict[int, tuple[str, str]]:
    """``R <i> <state> [<reason>]`` lines -> {i: (state, reason)}."""
    status: dict[int, tuple[str, str]] = {}
    for line in lines:
        parts = line.split(" ", 3)
        if parts[0] == "R" and len(parts) >= 3 and parts[1].isdigit():
            status[int(parts[1])] = (parts[2], parts[3] if len(parts) > 3 else "")
    return status
