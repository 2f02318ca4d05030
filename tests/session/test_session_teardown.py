"""Teardown anywhere: a ``Session`` pulls and closes from an ``atexit`` hook, from a
finalizer run while the interpreter tears modules down, and after the thread that opened
it has exited; each in a child interpreter over the real OpenSSH sshd (and the atexit one
over the local transport too), whose files are checked after it exited."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from sshd import SshdContainer
from synctree import write

#: The child: push, edit the remote, then hand the pull to the teardown ``MODE`` names.
CHILD = textwrap.dedent('''
    import atexit, json, sys, threading, time, weakref
    from pathlib import Path
    from filesync import FilesyncError, Mapping, Session

    mode, remote, config, local, edit, out = sys.argv[1:]
    mapping = Mapping(local, "teardown-test/skills")
    outcome = {}

    def record(**fields):
        outcome.update(fields)
        Path(out).write_text(json.dumps(outcome))  # no builtins while finalizing

    def open_session():
        return Session(remote, ssh_config=config or None, state_dir=Path(local).parent / "state")

    def pull(session, finalizing_expected):
        started = time.monotonic()
        try:
            report = session.pull(mapping)
        except FilesyncError as exc:
            record(error=f"{type(exc).__name__}: {exc}")
            return
        record(downloaded=report.downloaded, seconds=time.monotonic() - started,
               finalizing=sys.is_finalizing(), finalizing_expected=finalizing_expected)

    if mode == "dead-thread":
        box = []
        opener = threading.Thread(target=lambda: box.append(open_session()) or box[0].push(mapping))
        opener.start()
        opener.join()
        session = box[0]
    else:
        session = open_session()
        session.push(mapping)
    Path(edit).write_text("written on the remote\\n")

    if mode == "atexit":
        def teardown():
            pull(session, False)
            session.close()
            record(closed=True)
        atexit.register(teardown)
    elif mode == "gc":
        class Environment:  # a framework's environment: its __del__ syncs back
            def __init__(self, session):
                self.session = session
                self.conduit = weakref.ref(session._impl._conduit)
            def __del__(self):
                pull(self.session, True)
                conduit = self.conduit()
                del self.session  # the last reference: only the Session's own __del__ closes it
                record(closed=conduit is None or not conduit.alive)
        environment = Environment(session)
        del session
    elif mode == "dead-thread":
        pull(session, False)
        atexit.register(lambda: (session.close(), record(closed=True)))
''')


def run_child(tmp_path: Path, mode: str, remote: str, config: str, edit: Path
              ) -> tuple[dict[str, Any], Path]:
    local = tmp_path / "home" / "skills"
    write(local / "a.md", "a\n")
    out = tmp_path / "outcome.json"
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    done = subprocess.run(
        [sys.executable, str(script), mode, remote, config, str(local), str(edit), str(out)],
        capture_output=True, text=True, timeout=240, check=False)
    # Nothing escaped: no traceback, no "Exception ignored in", a clean exit.
    assert (done.returncode, done.stderr) == (0, ""), done.stdout
    return json.loads(out.read_text()), local


@pytest.fixture
def remote_dir(box: SshdContainer) -> Any:
    where = box.home / "teardown-test"
    yield where / "skills"
    subprocess.run(["rm", "-rf", str(where)], check=True)


@pytest.mark.sshd
@pytest.mark.parametrize("mode", ["atexit", "gc", "dead-thread"])
def test_a_pull_at_teardown_over_sshd_brings_the_remote_edit_home(
        tmp_path: Path, box: SshdContainer, remote_dir: Path, mode: str) -> None:
    started = time.monotonic()
    outcome, local = run_child(tmp_path, mode, box.alias, str(box.ssh_config),
                               remote_dir / "b.md")
    print(f"{mode}: pull {outcome.get('seconds')} s, child {time.monotonic() - started:.2f} s")
    assert outcome.get("error") is None
    assert outcome["downloaded"] == 1
    # The gc pull really ran while the interpreter tore modules down.
    assert outcome["finalizing"] == outcome["finalizing_expected"]
    assert outcome["closed"] is True
    assert (local / "b.md").read_text() == "written on the remote\n"


def test_a_pull_in_an_atexit_hook_over_the_local_transport(tmp_path: Path) -> None:
    box = tmp_path / "box"
    outcome, local = run_child(tmp_path, "atexit", str(box), "",
                               box / "teardown-test" / "skills" / "b.md")
    assert outcome.get("error") is None and outcome["downloaded"] == 1
    assert (local / "b.md").read_text() == "written on the remote\n"


def test_an_unexpected_exception_leaves_a_call_as_one_line_filesync_error(
        tmp_path: Path) -> None:
    from filesync import FilesyncError, InternalError, Mapping, Session
    from filesync.transport.base import Conduit

    async def broken() -> Conduit:
        raise RuntimeError("cannot schedule new futures\nafter shutdown")

    write(tmp_path / "skills" / "a.md", "a\n")
    with Session("base", conduit=broken, state_dir=tmp_path / "state") as s, \
            pytest.raises(FilesyncError) as err:
        s.push(Mapping(tmp_path / "skills", "skills"))
    assert isinstance(err.value, InternalError)
    assert "\n" not in str(err.value) and "RuntimeError: cannot schedule" in str(err.value)
    assert isinstance(err.value.__cause__, RuntimeError)
