"""The POSIX fallback's level-by-level listing, over the local transport.

What the contract suite cannot reach: many directories at one depth (the names are fed
to ``find`` in chunks of quoted shell words), a directory swapped for a symlink between
two levels, and the probe's refusal of a ``find`` without ``-maxdepth``.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from synctree import write

from filesync.core.exclude import ExcludeRule
from filesync.core.model import Listing
from filesync.endpoint import posix_parse, posix_scripts
from filesync.endpoint.posix import PosixEndpoint, Tools
from filesync.endpoint.posix_scripts import GNU_FIND, STAT_C
from filesync.transport.base import RemoteProcess
from filesync.transport.local import CommandConduit
from filesync.tree.wire import Reason

ODD = ["plain", "new\nline", "it's \"q\" $(x) `y` *?", "-dash", " lead ", "back\\slash\\",
       "ünï", "\udcff-not-utf8"]
FLAVOURS = [Tools(), Tools(STAT_C, tar_norec=False, xargs0=False, tar_no_unquote=True)]


class Counting(CommandConduit):
    """The local transport, counting commands; ``before`` runs ahead of the n-th."""

    def __init__(self) -> None:
        super().__init__([], "local")
        self.count = 0
        self.before: dict[int, Callable[[], None]] = {}

    async def start(self, command: str) -> RemoteProcess:
        self.count += 1
        if self.count in self.before:
            self.before[self.count]()
        return await super().start(command)


def test_level_input_round_trips_every_name_through_sh_in_bounded_lines() -> None:
    dirs = ["", *(f"wide/{i:04d}-{'x' * 40}" for i in range(900)), *(f"{n}/sub" for n in ODD)]
    data = posix_scripts.level_input(dirs)
    lines = data.split(b"\nb ")
    assert len(lines) > 1  # more than one find
    longest = max(len(word.encode("utf-8", "surrogateescape")) for word in dirs) + 8
    assert all(len(line) <= posix_scripts.LEVEL_CHUNK + longest for line in lines)
    echo = r"""b() { for a; do printf '%s\0' "$a"; done; }; e() { :; }; eval "$(cat)" """
    out = subprocess.run(["sh", "-c", echo], input=data, capture_output=True, check=True)
    assert out.stdout.split(b"\0")[:-1] == [
        (f"./{d}" if d else ".").encode("utf-8", "surrogateescape") for d in dirs]


def run(conduit: CommandConduit, tools: Tools, root: Path, rule: ExcludeRule
        ) -> Listing:
    async def go() -> Listing:
        session = await PosixEndpoint.start(conduit, tools=tools)
        try:
            return await session.list_tree(str(root), rule)
        finally:
            await session.close()

    return asyncio.run(go())


@pytest.mark.parametrize("tools", FLAVOURS, ids=["gnu-find", "stat-c-no-xargs"])
def test_wide_levels_of_odd_names_are_listed_whole_one_command_per_depth(
    tmp_path: Path, tools: Tools
) -> None:
    root = tmp_path / "root"
    names = [n for n in ODD if tools.flavour == GNU_FIND or "\n" not in n]
    expected = set()
    for i in range(700):  # 700 directories at depth 2: several chunks of names
        write(root / "wide" / f"{i:04d}-{'y' * 40}" / "f.txt", "x")
        expected.add(f"wide/{i:04d}-{'y' * 40}/f.txt")
    for name in names:
        os.makedirs(os.fsencode(str(root / name / name)))
        with open(os.fsencode(str(root / name / name / "f.txt")), "w") as fh:
            fh.write("x")
        expected.add(f"{name}/{name}/f.txt")
    conduit = Counting()
    listing = run(conduit, tools, root, ExcludeRule.build(["cache/"]))
    # Listed, then refused by the path-safety rule (a control character, not UTF-8).
    unsafe = {f"{n}/{n}/f.txt" for n in names if "\n" in n or "\udcff" in n}
    assert set(listing.entries) == expected - unsafe
    assert {(s.path, s.code) for s in listing.skipped} == {
        (rel, Reason.UNSAFE_PATH) for rel in unsafe}
    assert conduit.count == 1 + 3  # the probe, then one per depth: root, depth 1, depth 2


def test_a_directory_swapped_for_a_symlink_between_levels_is_raced_not_followed(
    tmp_path: Path,
) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    write(root / "a" / "b" / "kept.txt", "in")
    write(root / "top.txt", "in")
    write(outside / "b" / "secret.txt", "out")
    write(outside / "secret.txt", "out")

    def swap() -> None:  # after the root level listed "a" as a directory
        os.rename(root / "a", tmp_path / "a-moved")
        os.symlink(outside, root / "a")

    conduit = Counting()
    conduit.before[3] = swap  # 1: the probe, 2: the root level, 3: depth 1
    listing = run(conduit, Tools(), root, ExcludeRule.build())
    assert set(listing.entries) == {"top.txt"}
    assert [(s.path, s.code) for s in listing.skipped] == [("a", Reason.PATH_RACED)]


def test_a_find_without_maxdepth_is_refused_in_one_line() -> None:
    facts = {"tar": [""], "tarlist": ["1"], "find": ["1"], "stat": ["c"],
             "findnomaxdepth": ["1"]}
    problem = posix_parse.missing_tools_error(facts)
    assert problem is not None and "-maxdepth" in problem and "\n" not in problem


def test_a_level_whose_input_was_cut_short_is_an_error_not_a_shorter_tree(
    tmp_path: Path,
) -> None:
    write(tmp_path / "a" / "f.txt", "x")
    text = posix_scripts.script(Tools(), str(tmp_path), posix_scripts.LIST_OP)
    whole = posix_scripts.level_input(["", "a"])
    assert whole.endswith(b"\ne\n")

    def output(data: bytes) -> bytes:
        return subprocess.run(["sh", "-c", text], input=data, capture_output=True).stdout

    records = posix_parse.parse_records(output(whole).split(b"\n", 1)[1], GNU_FIND)
    assert {r.rel for r in records} == {"", "a", "a/f.txt"}
    with pytest.raises(posix_parse.TransportError, match="did not finish"):
        posix_parse.parse_records(output(whole[:-2]).split(b"\n", 1)[1], GNU_FIND)
