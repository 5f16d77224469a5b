import os
import subprocess
import sys
from pathlib import Path

import pytest

import tests.envs  # noqa: F401 - registers the test environments in this process

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def run_cli():
    """Run `python -m MODULE ARGS` from the repo root; returns the CompletedProcess."""

    def run(*args, module="hogwild_a3c.train", timeout=180, **kwargs):
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        return subprocess.run(
            [sys.executable, "-m", module, *map(str, args)],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, **kwargs,
        )

    return run


def child_pids(pid: int) -> list[int]:
    """Direct children of `pid` that are multiprocessing spawn children (not the resource tracker)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid and "spawn_main" in cmdline:
            found.append(int(entry.name))
    return sorted(found)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
