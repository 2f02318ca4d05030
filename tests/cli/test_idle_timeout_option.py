"""``--idle-timeout``: a number of seconds > 0 (0 is refused, not "none"), default 60,
carried as a typed value down to the engine's ``Options`` and the endpoint's conduit."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

import filesync
from filesync.cli.main import main, parse, request_from
from filesync.cli.settings import PassSettings
from filesync.core.reconcile import Direction
from filesync.endpoint.idle import IDLE_TIMEOUT, IdleConduit, check_idle_timeout
from filesync.sync.engine import Options
from filesync.transport.local import local_conduit


def test_the_default_is_60_seconds_everywhere(tmp_path: Path) -> None:
    args = parse(["pull", str(tmp_path), "host:x"])
    assert request_from(args).settings.idle_timeout == IDLE_TIMEOUT == 60.0
    assert Options(Direction.PULL).idle_timeout == 60.0
    assert PassSettings().options(Direction.PULL, tmp_path).idle_timeout == 60.0


def test_the_option_reaches_the_engine_options(tmp_path: Path) -> None:
    settings = request_from(parse(["pull", str(tmp_path), "host:x", "--idle-timeout", "2.5"]))
    assert settings.settings.options(Direction.PULL, tmp_path).idle_timeout == 2.5


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "soon"])
def test_a_deadline_that_is_not_positive_is_a_usage_error(value: str, tmp_path: Path) -> None:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["pull", str(tmp_path), "host:x", f"--idle-timeout={value}"])
    assert code == 2
    lines = err.getvalue().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("filesync: error: "), lines
    assert "--idle-timeout" in lines[0]


@pytest.mark.parametrize("value", [0, -2.0, float("nan"), float("inf"), True, "60"])
def test_library_values_are_checked_too(value: object) -> None:
    with pytest.raises(ValueError, match="idle_timeout"):
        PassSettings(idle_timeout=value)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="idle_timeout"):
        check_idle_timeout(value)


def test_the_error_class_is_public_and_a_transport_error() -> None:
    assert "RemoteSilent" in filesync.__all__
    assert issubclass(filesync.RemoteSilent, filesync.TransportError)


async def test_a_local_command_silent_past_the_deadline_is_killed(tmp_path: Path) -> None:
    conduit = IdleConduit(local_conduit(), 0.5)
    proc = await conduit.start("echo ready; exec sleep 3600")
    assert await proc.readexactly(6) == b"ready\n"
    with pytest.raises(filesync.RemoteSilent, match=r"sent nothing for 0\.5 s"):
        await proc.read(1)
    assert await proc.wait() != 0  # killed, not left running
