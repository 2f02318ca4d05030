"""``openssh_login.begin_all``: a fan-out's ``ssh -G`` lookups run side by side.

Each login needs its destination's ``ssh -G`` before its master can be spawned. Run one
after another, they would hold the last host's login back by every other host's lookup.
The ``ssh`` here is a wrapper first on PATH whose ``-G`` waits until every lookup of the
test has started (a barrier on marker files, not a sleep), so lookups run one at a time
cannot all pass it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from filesync.errors import TransportError
from filesync.transport.ssh import openssh_login

HOSTS = ("alpha", "beta", "gamma")
#: How long the wrapper's ``-G`` waits for the others before it gives up (a wait for the
#: condition: side by side, every one passes at once).
BARRIER_SECONDS = 30


def _wrapper(tmp_path: Path, expected: int) -> Path:
    real = shutil.which("ssh")
    assert real is not None, "the OpenSSH client is needed (scripts/dev installs it)"
    marks = tmp_path / "marks"
    marks.mkdir()
    script = tmp_path / "bin" / "ssh"
    script.parent.mkdir()
    script.write_text(
        "#!/bin/sh\n"
        'case " $* " in *" -G "*)\n'
        f'  : > "{marks}/$$"\n'
        "  i=0\n"
        f'  while [ "$(ls "{marks}" | wc -l)" -lt {expected} ]; do\n'
        "    i=$((i + 1))\n"
        f'    if [ $i -gt {BARRIER_SECONDS * 20} ]; then echo "lookups ran one at a time" >&2; '
        "exit 255; fi\n"
        "    sleep 0.05\n"
        "  done;;\n"
        "esac\n"
        f'exec {real} "$@"\n'
    )
    script.chmod(0o755)
    return script.parent


def _config(tmp_path: Path) -> Path:
    # A ControlPath of the user's: begin looks for their master instead of spawning one,
    # so the lookups alone are exercised.
    config = tmp_path / "ssh_config"
    config.write_text("".join(
        f"Host {name}\n    HostName 10.99.0.{i}\n    ControlPath {tmp_path}/cm-%h\n"
        for i, name in enumerate(HOSTS, 1)))
    return config


def test_a_fan_outs_lookups_run_side_by_side(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = _wrapper(tmp_path, len(HOSTS))
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path(shutil.which('ssh') or '').parent}")
    pendings = openssh_login.begin_all([(h, None, None) for h in HOSTS],
                                       ssh_config=_config(tmp_path))
    assert [p.error for p in pendings] == [None] * len(HOSTS)
    # each login has its own destination's settings, in the order asked
    assert [p.res.host if p.res else None for p in pendings] == [
        "10.99.0.1", "10.99.0.2", "10.99.0.3"]
    assert [p.key[0] for p in pendings] == list(HOSTS)
    assert all(p.master is None for p in pendings)  # the user's ControlPath: none spawned


def test_a_failed_lookup_is_that_logins_error_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two lookups meet at the barrier; a third destination's user is refused by ssh's
    # own config parsing (a user name with a newline), and only its login carries it.
    bin_dir = _wrapper(tmp_path, 3)
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path(shutil.which('ssh') or '').parent}")
    pendings = openssh_login.begin_all(
        [("alpha", None, None), ("beta", "bad\nuser", None), ("gamma", None, None)],
        ssh_config=_config(tmp_path))
    assert pendings[0].error is None and pendings[2].error is None
    error = pendings[1].error
    assert isinstance(error, TransportError) and "beta" in str(error)
    assert "\n" not in str(error)


def test_begin_is_begin_all_of_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = _wrapper(tmp_path, 1)
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path(shutil.which('ssh') or '').parent}")
    pending = openssh_login.begin("beta", ssh_config=_config(tmp_path))
    assert pending.error is None and pending.res is not None
    assert pending.res.host == "10.99.0.2"
