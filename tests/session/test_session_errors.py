"""Every failure kind a session raises is a FilesyncError subclass exported by ``filesync``."""

from __future__ import annotations

import subprocess
import sys

import pytest

import filesync
from filesync import Mapping, Session

KINDS = {"BadMapping": 2, "SelfSync": 3, "SessionClosed": 1, "SessionTimeout": 1,
         "TransferFailed": 1, "LockBusy": 1, "ConnectionLost": 1, "TransportError": 1,
         "UsageError": 2, "SafetyRefusal": 3, "ShutdownError": 1, "InternalError": 1,
         "RemoteSilent": 1, "PatternError": 2}


@pytest.mark.parametrize("name", sorted(KINDS))
def test_exported_subclass_with_its_exit_code(name: str) -> None:
    cls = getattr(filesync, name)
    assert name in filesync.__all__
    assert issubclass(cls, filesync.FilesyncError) and cls is not filesync.FilesyncError
    assert cls.exit_code == KINDS[name]


def test_the_session_names_are_exported_and_lazy() -> None:
    for name in ("Session", "AsyncSession", "SessionReport", "Conduit", "RemoteProcess"):
        assert name in filesync.__all__ and getattr(filesync, name).__name__ == name
    code = ("import sys, filesync; filesync.BadMapping; "
            "print(any(m.startswith('filesync.session') or m == 'asyncssh' for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def test_bad_arguments_are_usage_errors() -> None:
    with pytest.raises(filesync.UsageError):
        Session()
    with pytest.raises(filesync.UsageError):
        Session("host", exclude="*.bak")  # type: ignore[arg-type]
    with pytest.raises(filesync.UsageError):
        Session("/tmp/x", via="")
    s = Session("/tmp/x")
    with pytest.raises(filesync.UsageError):
        s.push(["not a mapping"])  # type: ignore[list-item]
    s.close()
    assert isinstance(Mapping("a", "b"), Mapping)
