"""Decisions are taken on reason codes, never on their wording.

Every human text of ``filesync.tree.wire.Reason`` is reworded for the test; a pass over
a remote that refuses paths for safety must still refuse the same paths, report them as
skipped (not as failures, exit 0), and say so in the reworded words. Run against the
python helper and the POSIX fallback alike.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from synctree import Pair, write

from filesync.endpoint.helper import HelperEndpoint, NoPython
from filesync.transport.base import Conduit
from filesync.tree import wire
from filesync.tree.wire import Reason, describe


@pytest.fixture(params=["helper", "posix"])
def endpoint(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "posix":
        async def no_python(cls: type[HelperEndpoint], conduit: Conduit,
                            **_kwargs: object) -> HelperEndpoint:
            raise NoPython("forced by the test")

        monkeypatch.setattr(HelperEndpoint, "start", classmethod(no_python))
    return str(request.param)


@pytest.fixture
def reworded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every code's text replaced by one that shares no word with the original."""
    texts = {code: f"zz-{i}" for i, code in enumerate(Reason)}
    monkeypatch.setattr(wire, "_TEXT", texts)


def refusing_pair(tmp_path: Path) -> Pair:
    """A push whose remote has a symlinked directory, and a directory holding only
    excluded content where the host has a file (a file where a host directory goes is a
    type conflict now, which a push settles: tests/sync/test_type_conflicts.py)."""
    pair = Pair(tmp_path / "host", tmp_path / "remote", tmp_path / "state")
    write(pair.local / "ok.txt", "fine\n")
    write(pair.local / "link" / "x.txt", "would leave the root\n")
    write(pair.local / "plain", "a directory remotely\n")
    (tmp_path / "outside").mkdir()
    pair.remote.mkdir(parents=True)
    (pair.remote / "link").symlink_to(tmp_path / "outside", target_is_directory=True)
    write(pair.remote / "plain" / "node_modules" / "m.js", "excluded\n")
    return pair


@pytest.mark.parametrize("words", ["as shipped", "reworded"])
def test_safety_refusals_do_not_depend_on_their_wording(
    tmp_path: Path, endpoint: str, words: str, request: pytest.FixtureRequest
) -> None:
    if words == "reworded":
        request.getfixturevalue("reworded")
    pair = refusing_pair(tmp_path)
    report = pair.ok("push")  # exit 0: refusals are skips, not failures
    reasons = {s["path"]: s["reason"] for s in report["skipped"]}
    assert report["uploaded"] == 1 and (pair.remote / "ok.txt").read_text() == "fine\n"
    # Under a remote symlink: reported as a symlinked path, in the code's own words.
    assert reasons["link/x.txt"] == describe(Reason.SYMLINK_IN_PATH)
    # Onto a remote directory holding only excluded content: the upload is refused for
    # safety (not failed, and not "changed during the run"), by code; nothing is lost.
    assert reasons["plain"] == f"upload refused: {describe(Reason.DIR_IN_WAY)}"
    assert (pair.remote / "plain" / "node_modules" / "m.js").read_text() == "excluded\n"
    assert list((tmp_path / "outside").iterdir()) == []
    if words == "reworded":
        assert describe(Reason.DIR_IN_WAY).startswith("zz-")
