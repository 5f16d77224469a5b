"""meta.json: what a run was trained on and how each of its sessions went.

Written once at a run's start (the machine, the package versions, the git commit, the command
line) and again through every session: one entry each, with its start, its child pids, how and
at which step it ended, its exit code, the processor and versions it ran on (a resumed run may
continue on another machine). A session that a kill cut off is found still "running" by the next
one and marked as `KILLED`, with its last known step. The recorder writes it (`MetaJson`) under
its rules for failed writes; `rundir.read_meta` reads it back for a resume.
"""
from __future__ import annotations

import datetime as dt
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from .. import __version__
from ..config import MAX_STEPS
from .atomic import rewrite_json_in_place, write_json
from .machine import cpu

KILLED = "killed or crashed (no clean end recorded)"


def now_iso() -> str:
    return dt.datetime.now().astimezone().isoformat(timespec="seconds")


def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent, capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def versions() -> dict[str, str]:
    import gymnasium
    import numpy
    import scipy
    import torch

    found = {
        "hogwild_a3c": __version__, "python": platform.python_version(), "torch": str(torch.__version__),
        "gymnasium": gymnasium.__version__, "numpy": numpy.__version__, "scipy": scipy.__version__,
    }
    try:
        import ale_py

        found["ale_py"] = ale_py.__version__
    except ImportError:
        pass
    return found


def new_meta(argv: list[str]) -> dict[str, Any]:
    return {
        "versions": versions(),
        "git_commit": git_commit(),
        "cores": os.cpu_count(),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "created": now_iso(),
        "sessions": [],
        "argv": [sys.executable, "-m", "hogwild_a3c.train", *argv],
    }


class MetaJson:
    """A run's meta.json with this session's entry appended; `write` raises WriteError."""

    def __init__(self, run_dir: Path, meta: dict[str, Any] | None, argv: list[str], session: int,
                 global_step: int, num_workers: int | None, node: dict[str, Any] | None = None):
        self.path = run_dir / "meta.json"
        self.data = meta if meta is not None else new_meta(argv)
        self.session: dict[str, Any] = {
            "session": session, "pid": os.getpid(), "start": now_iso(), "end": None, "ended": "running",
            "exit_code": None, "global_step_start": global_step, "argv": argv,
            "versions": versions(), "cpu": cpu(), "num_workers": num_workers,
        }
        if node is not None:
            self.session["node"] = node  # rank, world size, host: the multi-node layout of this session
        self.data["sessions"].append(self.session)

    def child_pids(self, pids: dict[str, int]) -> None:
        self.session.setdefault("pids", {}).update(pids)

    def sync_start(self, agreed: int, restored: int) -> None:
        """A node's session starts where the nodes agreed (the most progress of any), not at the
        step of its own checkpoint, which is kept beside it."""
        self.session.update(global_step_start=agreed, global_step_restored=restored)

    def end(self, ended: str, exit_code: int, global_step: int, time_s: float) -> None:
        self.session.update(end=now_iso(), ended=ended, exit_code=exit_code, global_step_end=global_step,
                            time_s_end=round(time_s, 3))

    def write(self) -> None:
        write_json(self.path, self.data)

    def rewrite_in_place(self) -> None:
        rewrite_json_in_place(self.path, self.data)


def close_dead_sessions(
    meta: dict[str, Any], run_dir: Path, checkpoint: tuple[int, Path] | None
) -> list[dict[str, Any]]:
    """Mark the sessions that meta.json still says are running as ended by a kill or a crash.

    Only a process that holds the run's lock gets here, so none of them is running. Each gets
    its last known global step and where that comes from: for a session followed by another,
    the step that one resumed from; for the last, the largest of the newest checkpoint's step
    (`checkpoint`: step and file), progress.csv's last row and the step it started from."""
    sessions = [s for s in meta.get("sessions", []) if isinstance(s, dict)]
    closed = []
    step: int | None
    for i, session in enumerate(sessions):
        if session.get("ended") != "running":
            continue
        following = sessions[i + 1].get("global_step_start") if i + 1 < len(sessions) else None
        if _is_step(following):
            step, source = following, "the step the next session resumed from"
        else:
            step, source = _last_known_step(run_dir, checkpoint, session.get("global_step_start"))
        session.update(ended=KILLED, exit_code=None, global_step_end=step, global_step_end_from=source)
        closed.append(session)
    return closed


def _is_step(value: Any) -> bool:  # read from meta.json: a crafted one may hold anything
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_STEPS


def _last_known_step(run_dir: Path, checkpoint: tuple[int, Path] | None, start: Any) -> tuple[int | None, str]:
    found = []  # (step, rank on a tie, source): a checkpoint is the surest record of a step
    if checkpoint is not None:
        found.append((checkpoint[0], 2, f"the newest checkpoint, {checkpoint[1].name}"))
    row = _last_progress_step(run_dir / "progress.csv")
    if row is not None:
        found.append((row, 1, "progress.csv's last row"))
    if _is_step(start):
        found.append((start, 0, "the step it started from (no later checkpoint or progress row)"))
    if not found:
        return None, "nothing recorded"
    step, _, source = max(found)
    return step, source


def _last_progress_step(path: Path) -> int | None:
    try:
        lines = path.read_bytes().decode(errors="replace").split("\n")
    except OSError:
        return None
    complete = lines[:-1]  # a line without its newline was cut by the kill
    if len(complete) < 2:
        return None
    header, last = complete[0].split(","), complete[-1].split(",")
    try:
        return int(float(last[header.index("global_step")]))
    except (ValueError, IndexError):
        return None
