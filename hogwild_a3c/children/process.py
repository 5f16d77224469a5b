"""Process hygiene shared by every child: one thread, no SIGINT, die with the parent, report errors.

A classic PyTorch A3C port hangs when children are forked from a parent whose OpenMP pool is
already warm, until the user exports OMP_NUM_THREADS=1 by hand. Here children are always
started with `spawn` or `forkserver` and pin themselves to one thread, so no incantation is
needed and N workers never oversubscribe N cores.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

from ..files.atomic import pid_exists

PR_SET_PDEATHSIG = 1
# Thread-pool sizes read once, when each library loads. A spawned child loads numpy and torch
# while unpickling its arguments, before any code of ours runs, so the parent must set these.
THREAD_POOL_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS",
                         "VECLIB_MAXIMUM_THREADS", "BLIS_NUM_THREADS")


def one_thread_per_child() -> None:
    """Make every child started from now on use one thread per library.

    Measured here on 2 cores: with OpenBLAS's default pool, two workers that each run a small
    numpy matmul per frame (the 42x42 resize) spin each other's threads and fall from ~840 to
    ~125 acting steps/s in total. Whatever the user exported, children get 1; the user's values
    still apply to this process's own pools, already loaded.
    """
    for name in THREAD_POOL_VARIABLES:
        os.environ[name] = "1"


def _die_with_parent(parent_pid: int) -> None:
    """Exit when the main process disappears, even after `kill -9` of it.

    PR_SET_PDEATHSIG is Linux's way; the polling thread covers other systems. Our direct parent
    is the main process under `spawn` and the fork server under `forkserver` (which exits when
    the main process does), so the thread watches for our parent changing, whichever it is.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    parent = os.getppid()
    if parent != parent_pid and not pid_exists(parent_pid):  # the main process died before we got here
        os._exit(3)

    def watch() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(3)
            time.sleep(1.0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def flush_denormals(enabled: bool = True) -> bool:
    """Treat floats below ~1.2e-38 as zero in this thread's arithmetic; returns the previous
    setting (so the main process can give a notebook its own back).

    Measured in a Pong run (K=8, Adam 6e-4): a few minutes in, ~70% of Adam's first moments of the
    LSTM weights had decayed into the denormal range (their gradients were zero for hundreds of
    updates, and 0.9^n shrinks a moment past 1e-38) and both workers fell from ~2,400 to ~1,000
    steps/s, for good: arithmetic on denormals takes a slow path in the CPU. Values that small move
    no weight. TensorFlow, which universe ran on, flushes them in its CPU threads as well.
    """
    tiny = torch.tensor(torch.finfo(torch.float32).tiny / 4)
    was_on = bool((tiny * 1.0).item() == 0.0)
    torch.set_flush_denormal(enabled)
    return was_on


def setup_child(parent_pid: int) -> None:
    torch.set_num_threads(1)
    flush_denormals()
    # Ctrl-C reaches the whole process group, and so does torchrun's SIGTERM (it signals its
    # worker's process group); only the main process decides how to stop. A syncer killed by
    # SIGTERM could not carry this node's stop vote to the other nodes, which would then record
    # a failed sync. The supervisor's stop ends in SIGKILL for a child that does not stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _die_with_parent(parent_pid)


def run_child(role: str, rank: int, parent_pid: int, body: Callable[[], None], report: Callable[[Any], None]) -> None:
    """Run `body` as a child process: report any exception with its traceback, exit non-zero."""
    setup_child(parent_pid)
    try:
        body()
    except BaseException as exc:  # noqa: BLE001 - everything must reach the parent
        text = traceback.format_exc()
        try:
            from .messages import ChildRaised

            report(ChildRaised(role, rank, f"{type(exc).__name__}: {exc}", text))
        finally:
            sys.stderr.write(f"[{role} {rank} pid {os.getpid()}] {text}")
            sys.stderr.flush()
            os._exit(1)


def rss_mb(pid: int) -> float:
    """Resident memory of a process in MiB (Linux /proc); NaN where that cannot be read."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return float("nan")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds a process has used (Linux /proc); NaN where that cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            # The command name is in parentheses and may hold spaces: count fields after its ')'.
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


class CpuShare:
    """The evaluator's share of the CPU time the workers and the evaluator used between two calls:
    how much of what training got went to playing evaluation episodes (progress.csv's
    eval_cpu_share; the main process and a syncer are not counted).

    Per pid, so that a restarted child (a new pid) counts from its start and not against its
    predecessor's total; a child that died between two calls loses its last interval."""

    def __init__(self) -> None:
        self.seen: dict[int, float] = {}

    def _used_since(self, pids: list[int]) -> float:
        used = 0.0
        for pid in pids:
            now = cpu_seconds(pid)
            if now != now:  # NaN: gone, or no /proc here
                continue
            used += max(0.0, now - self.seen.get(pid, 0.0))  # a reused pid must not count negative time
            self.seen[pid] = now
        return used

    def sample(self, worker_pids: list[int], evaluator_pid: int | None) -> float:
        """Evaluator CPU / (workers' + evaluator's CPU) since the last call; NaN with no evaluator
        of its own process or nothing measured."""
        evaluators = [evaluator_pid] if evaluator_pid is not None and evaluator_pid not in worker_pids else []
        alive = set(worker_pids) | set(evaluators)
        self.seen = {pid: seconds for pid, seconds in self.seen.items() if pid in alive}
        # The workers' totals move on every call, so that a row with no evaluator (one restarting)
        # does not leave two intervals of their time to the next row.
        training = self._used_since(worker_pids)
        if not evaluators:
            return float("nan")
        evaluating = self._used_since(evaluators)
        total = evaluating + training
        return evaluating / total if total > 0 else float("nan")
