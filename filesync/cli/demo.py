"""``filesync demo``: the sync-back scenario end to end, with no root and no network.

An in-process SSH server (asyncssh) listens on loopback with a temporary remote
home. The demo pushes a sample skills tree, lets a "remote agent" edit a skill,
add one and leave bookkeeping junk behind, then pulls and shows what came back.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

from filesync.core.exclude import ExcludeRule
from filesync.core.reconcile import Direction
from filesync.errors import FilesyncError
from filesync.session.runner import EndpointConduits, Job, PassRun, Runner
from filesync.session.terms import Options, Report, WarmState
from filesync.transport.target import ConnectOptions, Target

REMOTE_ROOT = ".hermes/skills"


def _write(path: Path, data: bytes | str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    path.chmod(mode)


def sample_skills(root: Path) -> None:
    """A small skills tree like an agent's ``~/.hermes/skills``."""
    _write(root / "pdf-tools" / "SKILL.md", "# pdf-tools\nExtract text from PDFs.\n")
    _write(root / "pdf-tools" / "scripts" / "extract.py", "print('extract')\n", 0o755)
    _write(root / "pdf-tools" / "references" / "api.md", "pdf api notes\n")
    _write(root / "web-search" / "SKILL.md", "# web-search\n")
    _write(root / "web-search" / "templates" / "query.txt", "{q}\n")
    _write(root / ".bundled_manifest", "pdf-tools\nweb-search\n")
    _write(root / ".usage.json", "{}\n")
    _write(root / ".hub" / "lock.json", '{"owner": "this laptop"}\n')


def remote_agent_works(root: Path) -> int:
    """What a remote agent leaves behind; returns the bytes of junk it made."""
    _write(root / "pdf-tools" / "SKILL.md", "# pdf-tools\nExtract text and tables.\n")
    _write(root / "csv-clean" / "SKILL.md", "# csv-clean\nNew skill written remotely.\n")
    _write(root / "csv-clean" / "scripts" / "clean.sh", "#!/bin/sh\necho clean\n", 0o755)
    _write(root / ".hub" / "lock.json", '{"owner": "a remote hermes build"}\n')
    junk = 0
    for i in range(24):
        _write(root / ".curator_backups" / f"backup-{i:02d}.tar", os.urandom(1 << 20))
        junk += 1 << 20
    for i in range(200):
        _write(root / "csv-clean" / "node_modules" / "left-pad" / f"f{i}.js", "x" * 512)
        junk += 512
    return junk


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


async def _demo(workdir: Path) -> None:
    from filesync.cli.demo_server import start_server

    host_skills = workdir / "laptop" / ".hermes" / "skills"
    remote_home = workdir / "remote-home"
    remote_home.mkdir(parents=True)
    sample_skills(host_skills)
    opts = Options(Direction.PUSH, ExcludeRule.build(), workdir / "state")
    server = await start_server(remote_home)
    warm = WarmState(keep_state=False)
    try:
        print(f"in-process SSH server on {server.host}:{server.port}, remote home {remote_home}")
        runner = Runner(EndpointConduits(warm), warm,
                        ConnectOptions(ssh_config=server.ssh_config, ssh_client="asyncssh"))
        report = await _pass(runner, host_skills, opts)
        print(f"push: {report.uploaded} files uploaded to ~/{REMOTE_ROOT} "
              f"({report.excluded} excluded, .hub stays on the laptop)")
        junk = remote_agent_works(remote_home / REMOTE_ROOT)
        print(f"remote agent: edited pdf-tools/SKILL.md, added csv-clean/, left "
              f"{_mib(junk)} of .curator_backups, node_modules and a stale .hub/lock.json")
        report = await _pass(runner, host_skills, replace(opts, direction=Direction.PULL))
        _print_pull(report, host_skills, junk)
    finally:
        await warm.close()
        await server.close()


async def _pass(runner: Runner, host_skills: Path, opts: Options) -> Report:
    """One pass between the laptop's skills and the remote's, through the runner."""
    async def plan(_conduit: object, _endpoint: object) -> list[PassRun]:
        return [PassRun(host_skills, REMOTE_ROOT, opts)]

    (outcome,) = await runner.run([Job(Target("ssh", REMOTE_ROOT, host="demo"), plan)],
                                  guard=False)
    result = outcome.passes[0][1] if outcome.passes else outcome.error
    if not isinstance(result, Report):
        raise result or FilesyncError("the demo's pass did not run")
    return result


def _print_pull(report: Report, host_skills: Path, junk: int) -> None:
    print(f"pull: {report.downloaded} files came back, {report.bytes_received} bytes received:")
    for action in report.plan:
        print(f"  {action.kind.value:<10} {action.path}")
    lock = (host_skills / ".hub" / "lock.json").read_text().strip()
    print(f"stayed remote: .curator_backups, node_modules, .hub ({_mib(junk)} never read)")
    print(f"laptop .hub/lock.json untouched: {lock}")
    came_back = (host_skills / ".curator_backups").exists()
    print(f"laptop .curator_backups created: {came_back}")


def run_demo(keep_dir: Path | None = None) -> int:
    """Run the demo in a temp dir (or ``keep_dir``); returns the exit code."""
    workdir = Path(tempfile.mkdtemp(prefix="filesync-demo-", dir=keep_dir))
    try:
        asyncio.run(_demo(workdir))
    finally:
        if keep_dir is None:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"demo trees kept in {workdir}")
    return 0
