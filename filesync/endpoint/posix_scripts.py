"""The POSIX fallback's shell scripts: one per operation, and the probe that picks them.

Every script runs in ``sh`` on the remote with ``LC_ALL=C``. Reasons come back as
``filesync.tree.wire.Reason`` codes (``symlink-in-path``, ``os <strerror>`` for an OS
error), never as messages to be matched.

How uploads and deletions stay inside the root, whatever the remote does meanwhile
(a hostile process swapping a directory with a symlink in a loop, say):

1. The root is entered once (``cd -P``) and its physical path ``R`` is taken from the
   external ``pwd -P`` (``getcwd``: the path of the directory actually entered, made of
   real directories only; a shell's builtin ``pwd -P`` may recompute it from the names
   typed, which a swap can fool).
2. ``tar -x`` runs with the root as its working directory, and every member it gets is
   a single name (``.filesync.<pid>.<n>.tmp``) with no ``/``: nothing is resolved
   through any directory the remote could swap. tar creates files ``O_EXCL`` and
   replaces a name that exists (a symlink put there) instead of writing through it.
3. A target's parent is entered component by component with ``cd -P`` from ``R``
   (``enter``). Before a missing component is created, and once at the end, the working
   directory is checked with ``pwd -P`` to be exactly ``R/<parent>``. A swap that makes
   a ``cd`` follow a symlink lands the shell outside: it then runs nothing there but
   the read-only checks and ``pwd -P``, which fails, and goes back to ``R``; the file is
   reported ``path-raced`` (or ``symlink-in-path`` when the symlink is still there).
4. Once the working directory is verified, everything is relative to it: the target is
   ``./<name>`` (one component: a symlink swapped in there is replaced by ``rename``,
   never followed; ``mv -T`` never moves *into* a directory), and the temp file is
   ``../../.filesync.<pid>.<n>.tmp`` -- ``..`` is the real parent of the working
   directory, never a symlink, so that path names the temp file in ``R`` however the
   names between were swapped meanwhile.

The verified working directory is a held directory, like the helper's descriptors: if
the remote moves that directory (not a symlink: the directory itself) out of the root
while it is in use, what is written goes with it. A temp file and a target on
different mounts under the root make ``mv`` copy (GNU and busybox ``mv`` unlink the
target first and create it ``O_EXCL``): slower, not atomic, still never followed.

Deletions use the same ``enter`` (without creating anything), then ``rm -f ./<name>``,
and remove emptied parents from their verified parent with ``rmdir ./<name>``.
Listings and fetches (``find``, ``tar -c``) only read; ``tar -c`` reads by path, so a
swap can make it read a file outside the root, whose size and mtime the fetch then
checks against the listing (see ``filesync.endpoint.posix_tar.TarFetch``).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from filesync.errors import TransportError
from filesync.transport.base import Conduit

#: Flavours of listing/stat: GNU find's -printf, ``stat -c`` (GNU, busybox), ``stat -f`` (BSD).
GNU_FIND, STAT_C, STAT_F = "gnu-find", "stat-c", "stat-f"


@dataclass(frozen=True, slots=True)
class Tools:
    """What the remote offers, as detected by ``PosixEndpoint.start``."""

    flavour: str = GNU_FIND  # GNU_FIND, STAT_C or STAT_F
    tar_norec: bool = True  # tar takes --no-recursion
    xargs0: bool = True  # xargs -0 works
    tar_no_unquote: bool = False  # GNU tar: -T names are taken literally only with this
    tar_version: str = ""
    mv_t: bool = True  # mv -T: rename onto a name, never into the directory it names


PROBE = r"""
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
  find /dev/null -maxdepth 0 >/dev/null 2>&1 || echo findnomaxdepth=1
fi
if stat -c %s /dev/null >/dev/null 2>&1; then echo stat=c
elif stat -f %z /dev/null >/dev/null 2>&1; then echo stat=f; fi
printf 'x\0' | xargs -0 true >/dev/null 2>&1 && echo xargs0=1
for t in mv rm mkdir rmdir cat tr tail sort; do
  command -v "$t" >/dev/null 2>&1 || printf 'missing=%s\n' "$t"
done
[ "$(cd / && env pwd -P 2>/dev/null)" = / ] || echo missing=pwd
case $(mv -T /nonexistent.$$/a /nonexistent.$$/b 2>&1) in *"No such file"*) echo mvT=1;; esac
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

# chk PATH: sets $why to a refusal code if a parent of PATH is a symlink or not a
# directory ('' if every parent is a directory or absent). Builtins only; cached per dir.
# Advisory (it decides what is not worth sending): ``enter`` is what protects.
_CHK = r"""
lastd=/; lastwhy=
chk() {
  case $1 in ./*) ;; *) why=unsafe-path; return 0;; esac
  d=${1%/*}
  if [ "$d" = "$lastd" ]; then why=$lastwhy; return 0; fi
  why=; q=$d
  while [ "$q" != . ]; do
    if [ -L "$q" ]; then why=symlink-in-path
    elif [ -e "$q" ] && [ ! -d "$q" ]; then why=parent-not-a-directory; fi
    q=${q%/*}
  done
  lastd=$d; lastwhy=$why
}
"""

# enter DIR CREATE: make the working directory $R/DIR (DIR relative to the root, '.' for
# the root), creating missing components if CREATE is 1; see the module doc, point 3.
# On success $why is '' and $up is the way back to $R made of '..' only; on failure the
# shell is back in $R and $why holds the code.
_ENTER = r"""
here() { [ "$(env pwd -P 2>/dev/null)" = "$1" ]; }
enter() {
  why=; up=.
  cd -P "$R" 2>/dev/null || { why='os the remote root went away'; return 1; }
  [ "$1" != . ] || return 0
  rest=$1/; at=${R%/}
  while [ -n "$rest" ]; do
    c=${rest%%/*}; rest=${rest#*/}
    if [ -L "./$c" ]; then why=symlink-in-path; break; fi
    if [ ! -e "./$c" ]; then
      if [ "$2" != 1 ]; then why=gone; break; fi
      if ! here "${at:-/}"; then why=path-raced; break; fi
      e=$(mkdir "./$c" 2>&1) || [ -d "./$c" ] || { why="os ${e##*: }"; break; }
    elif [ ! -d "./$c" ]; then why=parent-not-a-directory; break; fi
    cd -P "./$c" 2>/dev/null || { why=path-raced; break; }
    at=$at/$c
    if [ "$up" = . ]; then up=..; else up=../$up; fi
  done
  if [ -z "$why" ] && ! here "$at"; then why=path-raced; fi
  [ -n "$why" ] || return 0
  up=.
  cd -P "$R" 2>/dev/null
  return 1
}
"""

# One level of a listing. Input: lines ``b 'DIR' 'DIR' ...`` (shell words, quoted by
# ``level_input``), then ``e``; the DIRs are relative to the root, all of one depth. Each is
# listed with its immediate children only (``-maxdepth 1``: no child directory is
# opened); which children are listed next is decided by the client's exclusion rule.
# The start points are printed too: one that is no longer a directory (a symlink
# swapped in since the previous level) is neither followed nor listed under (find
# follows no symlink without -H/-L), and the client sees it changed.
LIST_OP = r"""
if [ -d "$r" ]; then
  cd "$r" || exit 3
  echo D
  rc=0; fin=
  b() { find "$@" -maxdepth 1 __PRUNE__ __ANY__; c=$?; [ "$c" -le "$rc" ] || rc=$c; }
  e() { fin=1; }
  eval "$(cat)"
  # Input cut short (no final "e"): no end mark, so never a shorter tree.
  [ -n "$fin" ] || exit 3
  printf __END__ "$rc"
elif [ -e "$r" ] || [ -L "$r" ]; then cat >/dev/null; echo N
else cat >/dev/null; echo M
fi
"""

#: Bytes of quoted names per ``find`` of a listing level: far below any ARG_MAX.
LEVEL_CHUNK = 32 << 10


def level_input(dirs: Sequence[str]) -> bytes:
    """``LIST_OP``'s input for ``dirs`` (relative to the root, '' for the root itself):
    ``b`` lines of single-quoted words (any byte but NUL is literal in them), each line at
    most about ``LEVEL_CHUNK`` bytes, so that no ``find`` gets a command line too long;
    then ``e``, the end mark without which the script prints no end of listing."""
    lines: list[str] = []
    words: list[str] = []
    size = 0
    for rel in dirs:
        word = shlex.quote(f"./{rel}" if rel else ".")
        if words and size + len(word) > LEVEL_CHUNK:
            lines.append("b " + " ".join(words))
            words, size = [], 0
        words.append(word)
        size += len(word) + 1
    if words:
        lines.append("b " + " ".join(words))
    return "".join(f"{line}\n" for line in [*lines, "e"]).encode("utf-8", "surrogateescape")

# The fetch. Input: the nonce, "1" to have every path stat'ed before tar reads it
# (exact mtimes for paths the client has not listed) else "0", then one "./path" a line.
# Output: those "S" lines, "<nonce> pre", the tar stream, then the trailer.
FETCH_OP = r"""
IFS= read -r nonce
IFS= read -r pre
list=$(cat)
cd "$r" 2>/dev/null || list=
[ "$pre" != 1 ] || [ -z "$list" ] || printf '%s\n' "$list" | stm
printf '%s pre\n' "$nonce"
exec 3>&1
# tar's stdout is the stream (fd 3); its complaints, and those of the loop that keeps
# out what is no regular file (in tar's own format), are collected for the trailer.
err=$( { printf '%s\n' "$list" | while IFS= read -r p; do
    [ -n "$p" ] || continue
    chk "$p"
    if [ -n "$why" ]; then printf 'tar: %s: =%s\n' "$p" "$why" >&4
    elif [ ! -e "$p" ] && [ ! -L "$p" ]; then
      printf 'tar: %s: No such file or directory\n' "$p" >&4
    elif [ -L "$p" ] || [ ! -f "$p" ]; then
      printf 'tar: %s: =not-regular\n' "$p" >&4
    else printf '%s\n' "$p"; fi
  done | tar -cf - __NOREC__ -T - 2>&1 >&3 3>&- 4>&-; } 4>&1 )
rc=$?
exec 3>&-
printf '\n%s rc %s\n' "$nonce" "$rc"
printf '%s\n' "$err" | while IFS= read -r l; do [ -z "$l" ] || printf 'E %s\n' "$l"; done
[ -z "$list" ] || printf '%s\n' "$list" | stm
printf '%s end\n' "$nonce"
"""

# The upload. Input: "n", n lines "exp<TAB>./path" (answered with "V i code" verdicts
# and READY), then one tar stream whose members are all single names in the root:
# the manifest (.0: "i<TAB>exp<TAB>dir<TAB>name" lines, then END), the files (.i) and an
# empty end mark (.n+1). Without both the manifest and the end mark it did not arrive
# whole and nothing is committed.
SEND_OP = r"""
R=
clean() { [ -z "$R" ] || { cd -P "$R" 2>/dev/null && rm -f ./.filesync.$$.*.tmp; }; }
trap clean EXIT
trap 'exit 1' HUP INT TERM PIPE
IFS= read -r n || exit 3
if ! e=$(mkdir -p "$r" 2>&1) || ! e=$(cd "$r" 2>&1); then
  printf 'ROOTERR %s\n' "${e##*: }"; cat >/dev/null; exit 0
fi
cd -P "$r" || exit 3
R=$(env pwd -P) || exit 3
i=0
while [ "$i" -lt "$n" ] && IFS='	' read -r exp p; do
  i=$((i+1))
  chk "$p"
  [ -z "$why" ] || printf 'V %s %s\n' "$i" "$why"
done
printf 'READY %s\n' "$$"
mf=./.filesync.$$.0.tmp; em=./.filesync.$$.$((n+1)).tmp
err=$(tar -x -p -o -f - 2>&1)
cat >/dev/null
if [ ! -f "$mf" ] || [ -L "$mf" ] || [ "$(tail -n 1 "$mf")" != END ] || [ ! -f "$em" ]; then
  printf 'ABORT\n'
  printf '%s\n' "$err" | while IFS= read -r l; do [ -z "$l" ] || printf 'E %s\n' "$l"; done
  exit 0
fi
while IFS='	' read -r i exp d b; do
  [ "$i" != END ] || break
  printf './.filesync.%s.%s.tmp\n' "$$" "$i"
done < "$mf" | stm
cur=
while IFS='	' read -r i exp d b; do
  [ "$i" != END ] || break
  case $i in ''|*[!0-9]*) continue;; esac
  t=.filesync.$$.$i.tmp
  case $b in ''|.|..|*/*)
    cd -P "$R"; cur=; rm -f "./$t"; printf 'R %s error unsafe-path\n' "$i"; continue;; esac
  if [ "$d" != "$cur" ]; then
    cur=
    if enter "$d" 1; then cur=$d; fi
  fi
  if [ -z "$cur" ]; then rm -f "./$t"; printf 'R %s error %s\n' "$i" "$why"; continue; fi
  s=$up/$t
  if [ ! -f "$s" ] || [ -L "$s" ]; then printf 'R %s missing\n' "$i"; continue; fi
  # tar names every member it could not write whole (a full disk, an I/O error).
  case $err in *"/$t:"*|*" $t:"*) rm -f "$s"; printf 'R %s missing\n' "$i"; continue;; esac
  if [ "$exp" = - ]; then
    # An empty directory (never listed: directories are not tracked) makes way, as in
    # the helper (tree/dirfd.py make_way); one holding anything is left whole.
    if [ -d "./$b" ] && [ ! -L "./$b" ] && ! rmdir "./$b" 2>/dev/null; then
      rm -f "$s"; printf 'R %s error dir-in-the-way\n' "$i"; continue
    fi
    if [ -e "./$b" ] || [ -L "./$b" ]; then rm -f "$s"; printf 'R %s changed\n' "$i"; continue; fi
  elif [ -L "./$b" ] || [ ! -f "./$b" ] || [ "$(st "./$b")" != "$exp" ]; then
    rm -f "$s"; printf 'R %s changed\n' "$i"; continue
  fi
  if e=$(mv -f -T "$s" "./$b" 2>&1); then printf 'R %s ok\n' "$i"
  else rm -f "$s"; printf 'R %s error os %s\n' "$i" "${e##*: }"; fi
done < "$mf"
printf '%s\n' "$err" | while IFS= read -r l; do [ -z "$l" ] || printf 'E %s\n' "$l"; done
echo DONE
"""

# Temp files of filesync runs whose process is gone (cut connections): removed, each
# from its verified parent.
CLEAN_OP = r"""
cd -P "$r" || { cat >/dev/null; exit 0; }
R=$(env pwd -P) || exit 0
while IFS='	' read -r d b; do
  x=${b#.filesync.}; pid=${x%%.*}
  case $pid in ''|*[!0-9]*) continue;; esac
  kill -0 "$pid" 2>/dev/null && continue
  enter "$d" 0 && rm -f "./$b"
done
"""

# Deletion. Input: "exp<TAB>dir<TAB>name" lines. Emptied parents are removed afterwards,
# deepest first, each by name from its verified parent (rmdir fails on anything else).
DELETE_OP = r"""
if ! cd -P "$r" 2>/dev/null; then
  if [ -e "$r" ] || [ -L "$r" ]; then echo NOTDIR; else echo GONE; fi
  cat >/dev/null
  exit 0
fi
R=$(env pwd -P) || exit 3
exec 3>&1
i=0; cur=
# Answers go to fd 3; the parents of deleted files go down the pipe, deepest first, to
# be removed once if they were left empty.
while IFS='	' read -r exp d b; do
  i=$((i+1))
  case $b in ''|.|..|*/*) printf 'R %s error unsafe-path\n' "$i" >&3; continue;; esac
  if [ "$d" != "$cur" ]; then
    cur=
    if enter "$d" 0; then cur=$d
    elif [ "$why" = gone ]; then printf 'R %s ok\n' "$i" >&3; continue; fi
  fi
  if [ -z "$cur" ]; then printf 'R %s error %s\n' "$i" "$why" >&3; continue; fi
  if [ ! -e "./$b" ] && [ ! -L "./$b" ]; then printf 'R %s ok\n' "$i" >&3; continue; fi
  if [ -L "./$b" ] || [ ! -f "./$b" ] || [ "$(st "./$b")" != "$exp" ]; then
    printf 'R %s changed\n' "$i" >&3; continue
  fi
  if e=$(rm -f "./$b" 2>&1) && [ ! -e "./$b" ]; then
    printf 'R %s ok\n' "$i" >&3
    [ "$d" = . ] || printf '%s\n' "$d"
  else
    [ -n "$e" ] || e='not removed'
    printf 'R %s error os %s\n' "$i" "${e##*: }" >&3
  fi
done | sort -r -u | while IFS= read -r d; do
  enter "$d" 0 || continue
  while [ "$d" != . ]; do
    b=${d##*/}
    case $d in */*) d=${d%/*};; *) d=.;; esac
    cd -P .. && rmdir "./$b" 2>/dev/null || break
  done
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


def script(tools: Tools, root: str, body: str, names: Sequence[str] = ()) -> str:
    """``body`` (one of the ``*_OP`` scripts) for ``root``, with the helpers it uses and
    ``names`` (directory names to prune) filled in."""
    prune = _prune_expr(names)
    pruned, anything = _LIST[tools.flavour]
    body = (
        body.replace("__PRUNE__ __ANY__", f"{prune} {pruned} -prune -o {anything}" if prune
                     else anything)
        .replace("__END__", "'\\0END %s\\0'" if tools.flavour == GNU_FIND else "'\\nEND %s\\n'")
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
        _ENTER,
        body,
    ])


class PlainCommands:
    """The fallback's operations that are one plain command each, nothing streamed."""

    conduit: Conduit

    async def any_exists(self, paths: Sequence[str]) -> bool:
        quoted = " ".join(shlex.quote(p) for p in paths)
        done = await self.conduit.run(
            f'for p in {quoted}; do if [ -e "$p" ]; then echo found; fi; done; exit 0')
        if done.returncode != 0:
            raise TransportError("the remote shell failed to check paths (POSIX fallback): "
                                 f"{done.stderr.decode(errors='replace').strip()[-200:]}")
        return b"found" in done.stdout

    async def _make_root(self, root: str) -> None:
        done = await self.conduit.run(f"mkdir -p -- {shlex.quote(root)}")
        if done.returncode != 0:
            raise TransportError(f"could not create the remote root {root}: "
                                 f"{done.stderr.decode(errors='replace').strip()[-200:]}")
