"""The CLI's typed boundary: the parsed arguments become frozen values once, in cli/main.py;
nothing else takes them, and the conduit pool is keyed by those values."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import pytest

from filesync.agent.server import KeptConduits
from filesync.cli.config import load_config
from filesync.cli.main import parse, request_from
from filesync.cli.settings import Output, PassSettings, Request
from filesync.core.reconcile import Direction
from filesync.errors import UsageError
from filesync.transport.base import Conduit
from filesync.transport.pool import Conduits
from filesync.transport.target import ConnectOptions, Target

ROOT = Path(__file__).resolve().parents[2]


_ARGPARSE = re.compile(r"^\s*(import|from) argparse\b|\bargparse\.\w|\bNamespace\b", re.M)


def test_only_the_cli_entry_point_sees_argparse() -> None:
    seen = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "filesync").rglob("*.py")
                  if _ARGPARSE.search(p.read_text()))
    assert seen == ["filesync/cli/main.py"]


def test_arguments_become_frozen_typed_values(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "local").mkdir()
    req = request_from(parse(["status", "local", "me@box:skills", "-F", "cfg", "-i", "key",
                              "--exclude", "*.bak", "--no-default-excludes",
                              "--max-file-size", "2M", "--lock-timeout", "5", "-v"]))
    assert req.local == tmp_path / "local"
    assert req.targets == (Target("ssh", "skills", "box", "me"),)
    assert req.settings == PassSettings(
        exclude=("*.bak",), default_excludes=False, dry_run=True, lock_timeout=5.0,
        max_file_size=2 << 20)
    assert req.connect == ConnectOptions(ssh_config=tmp_path / "cfg", identity=tmp_path / "key")
    assert req.connect.log is not None and req.output == Output(verbose=1)
    with pytest.raises(AttributeError):  # a dataclass's FrozenInstanceError is one too
        req.settings.force = True  # type: ignore[misc]
    opts = req.settings.options(Direction.PUSH, tmp_path)
    assert opts.max_file_size == 2 << 20 and opts.dry_run and opts.lock_timeout == 5.0


def test_request_needs_local_remote_or_config() -> None:
    with pytest.raises(UsageError, match="LOCAL REMOTE"):
        request_from(parse(["push"]))


@pytest.mark.parametrize("field,value", [
    ("max_file_size", 0), ("max_file_size", -5), ("max_pull_bytes", 1.5),
    ("max_file_size", True), ("timeout", -3.0), ("lock_timeout", float("nan")),
    ("timeout", float("inf")), ("exclude", ["*.bak"]), ("exclude", (1,)),
])
def test_pass_settings_reject_values_no_pass_can_use(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        PassSettings(**{field: value})  # type: ignore[arg-type]


def test_pool_key_comes_from_the_typed_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/a")
    box = Target("ssh", "one", "box", "me")
    key = KeptConduits.key(box, ConnectOptions(identity=Path("/k"), log=print))
    # another path on the same host, another log function: the same connection
    assert KeptConduits.key(dataclasses.replace(box, path="two"),
                            ConnectOptions(identity=Path("/k"))) == key
    assert KeptConduits.key(box, ConnectOptions(identity=Path("/other"))) != key
    assert KeptConduits.key(box, ConnectOptions(identity=Path("/k"),
                                                accept_new_host_key=True)) != key
    assert KeptConduits.key(Target("via", "one", via="docker exec -i a"),
                            ConnectOptions(identity=Path("/k"))) != key
    monkeypatch.setenv("HOME", "/home/b")
    assert KeptConduits.key(box, ConnectOptions(identity=Path("/k"))) != key


async def test_the_pool_ends_what_runs_on_a_conduit_before_closing_it(tmp_path: Path) -> None:
    ended: list[tuple[Conduit, bool]] = []

    class Recording(Conduits):
        async def end(self, conduit: Conduit, healthy: bool) -> None:
            ended.append((conduit, healthy))

    pool = Recording()
    conduit, reused = await pool.acquire(Target("local", str(tmp_path)), ConnectOptions())
    assert not reused and conduit.identity == "local"
    proc = await conduit.start("cat")
    await pool.release(conduit, True)
    assert ended == [(conduit, True)]
    assert await proc.wait() != 0  # closing killed what still ran


def test_a_request_is_the_whole_command() -> None:
    req = Request("undo", PassSettings(), ConnectOptions(), Output(),
                  local=Path(os.sep), targets=(Target("local", "/r"),))
    assert not req.plan_only
    assert Request("status", PassSettings(), ConnectOptions(), Output()).plan_only


def test_connect_options_need_a_positive_connect_timeout() -> None:
    with pytest.raises(ValueError, match="connect_timeout"):
        ConnectOptions(connect_timeout=0)


def test_a_request_context_resolves_every_path_of_the_command_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Given a working directory and an environment (the agent's client's), relative paths
    are made absolute against that directory and ``~`` is that environment's ``HOME``,
    for every path of the command line and of a config file; the process's own are not
    used (here they point elsewhere)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "process-home"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "process-state"))
    cwd, home = tmp_path / "client", tmp_path / "client-home"
    (cwd / "local").mkdir(parents=True)
    env = {"HOME": str(home)}
    req = request_from(parse(["push", "local", "remote", "-F", "cfg", "-i", "~/key",
                              "--state-dir", "~/st"], env), env=env, cwd=str(cwd))
    assert req.local == cwd / "local" and req.targets == (Target("local", str(cwd / "remote")),)
    assert req.settings.state_dir == home / "st"
    assert (req.connect.ssh_config, req.connect.identity) == (cwd / "cfg", home / "key")
    plain = request_from(parse(["push", "local", "remote"], env), env=env, cwd=str(cwd))
    assert plain.settings.state_path(plain.env) == home / ".local" / "state" / "filesync"
    (cwd / "sync.toml").write_text('remotes = ["there"]\n[[mapping]]\nlocal = "~/docs"\n'
                                   'remote = "docs"\n')
    req = request_from(parse(["sync", "--config", "sync.toml"], env), env=env, cwd=str(cwd))
    assert req.config == cwd / "sync.toml"
    config = load_config(req.config, env=req.env)
    assert config.remotes == [str(cwd / "there")]
    assert config.mappings[0].mapping.local == str(home / "docs")
