"""One public tier: ``filesync`` exports the Session tier and no engine internals, and
the reports' enums compare equal to their JSON strings."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from synctree import write

import filesync
from filesync import Change, ChangeAction, Mapping, Session

#: The Session tier, exactly (docs/library.md, "The public API, by name").
TIER = {
    "Session", "AsyncSession", "Mapping", "TWO_WAY", "UPLOAD_ONLY", "nested_excludes",
    "SessionReport", "Report", "Change", "ChangeAction", "Watch", "WatchLoop",
    "FilesyncError", "UsageError", "BadMapping", "PatternError", "SafetyRefusal", "SelfSync",
    "TransportError", "ConnectionLost", "RemoteSilent", "LockBusy", "TransferFailed",
    "SessionClosed", "SessionTimeout", "ShutdownError", "InternalError",
    "Conduit", "RemoteProcess", "open_ssh",
    "default_state_dir", "DEFAULT_EXCLUDED_DIRS", "profile_snippet", "__version__",
}  # fmt: skip

INTERNALS = ("run_pass", "Options", "WarmState", "connect_ssh", "SshTarget", "ExcludeRule",
             "Direction")


def test_the_top_level_is_the_session_tier() -> None:
    assert set(filesync.__all__) == TIER
    for name in INTERNALS:
        assert not hasattr(filesync, name), name
    for name in filesync.__all__:
        assert getattr(filesync, name) is not None


def test_the_documented_names_are_the_exported_ones() -> None:
    doc = (Path(filesync.__file__).resolve().parents[1] / "docs" / "library.md").read_text()
    section = doc.split("### The public API, by name", 1)[1].split("\n## ", 1)[0]
    for name in TIER - {"FilesyncError", "UsageError", "BadMapping", "PatternError",
                        "SafetyRefusal", "SelfSync", "TransportError", "ConnectionLost",
                        "RemoteSilent", "LockBusy", "TransferFailed", "SessionClosed",
                        "SessionTimeout", "ShutdownError", "InternalError"}:
        assert f"`{name}`" in section, name
    errors = doc.split("### Errors", 1)[1].split("### The public API", 1)[0]
    for name in ("UsageError", "LockBusy", "TransferFailed", "ShutdownError", "InternalError",
                 "RemoteSilent"):
        assert f"`{name}`" in errors, name


def test_report_actions_equal_their_json_strings(tmp_path: Path) -> None:
    write(tmp_path / "skills" / "a.md", "a\n")
    with Session(tmp_path / "box", state_dir=tmp_path / "state") as s:
        report = s.push(Mapping(tmp_path / "skills", "skills"))
    assert report.changes == [Change("a.md", ChangeAction.UPLOAD, 2)]
    change = report.changes[0]
    assert change.action == "upload" and json.dumps(change.action) == '"upload"'
    assert {a.value for a in ChangeAction} == {str(a) for a in ChangeAction}
    with Session(tmp_path / "box", state_dir=tmp_path / "state") as s:
        write(tmp_path / "skills" / "b.md", "b\n")
        plan = s.status(Mapping(tmp_path / "skills", "skills")).plan
    assert [(step.path, step.kind) for step in plan] == [("b.md", "upload")]


def test_importing_filesync_loads_no_internals() -> None:
    code = ("import sys, filesync; print(sorted(m for m in sys.modules "
            "if m.startswith(('filesync.sync', 'filesync.session', 'asyncssh'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


def test_the_library_tier_loads_what_the_passes_import_on_first_use() -> None:
    # A session's call may run at interpreter teardown, when nothing can be imported.
    code = (
        "import json, sys\n"
        "import filesync\n"
        "from filesync.session.runner import DEFERRED\n"
        "before = [m for m in DEFERRED if m in sys.modules]\n"
        "filesync.Session\n"
        "print(json.dumps([before, [m for m in DEFERRED if m not in sys.modules]]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    assert json.loads(done.stdout) == [[], []]


def test_the_library_tier_preloads_every_module_a_pass_loads_on_first_use() -> None:
    from filesync.session.runner import DEFERRED

    package = Path(filesync.__file__).parent
    loaded = {
        call.args[0].value
        for path in package.rglob("*.py")
        for call in ast.walk(ast.parse(path.read_text()))
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
        and call.func.attr == "load" and isinstance(call.func.value, ast.Name)
        and call.func.value.id == "deferred" and call.args
        and isinstance(call.args[0], ast.Constant)
    }
    assert loaded == set(DEFERRED)
