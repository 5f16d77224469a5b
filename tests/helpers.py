"""What several test files share: argv lists of tiny runs, starting and watching real runs,
looking at processes and run directories, and small stand-ins. Fixtures live in conftest.py."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from hogwild_a3c import train
from hogwild_a3c.children.shared import copy_weights

REPO = Path(__file__).resolve().parent.parent

# The smallest CartPole runs the tests train: a 16-unit LSTM, no progress bar. CARTPOLE is the
# reference's algorithm with progress rows twice a second, which the fault tests wait on.
TINY = ["--env", "CartPole-v1", "--lstm-size", "16", "--no-progress", "--progress-interval", "1"]
CARTPOLE = ["--env", "CartPole-v1", "--preset", "universe", "--lstm-size", "16", "--no-progress",
            "--progress-interval", "0.5"]


# -- processes -----------------------------------------------------------------------------------

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


# -- real runs -----------------------------------------------------------------------------------

def start_run(run_dir, *args):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "hogwild_a3c.train", *CARTPOLE, "--run-dir", str(run_dir), *map(str, args)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def wait_for(condition, timeout=90.0, what="condition", proc=None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition():
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"run exited ({proc.returncode}) while waiting for {what}:\n{proc.stdout.read()}")
        time.sleep(0.2)
    if proc is not None:
        proc.kill()
    raise AssertionError(f"timed out waiting for {what}")


def training_started(run_dir, min_step=1):
    def check():
        path = Path(run_dir) / "progress.csv"
        try:
            steps = pd.read_csv(path)["global_step"]
        except (OSError, ValueError, KeyError, pd.errors.EmptyDataError):
            return False
        return len(steps) > 0 and steps.max() >= min_step

    return check


def start_training(run_dir, *args, min_step=1):
    """Start a real run, wait until it has trained; returns the process and its children's pids."""
    proc = start_run(run_dir, *args)
    wait_for(training_started(run_dir, min_step), what="training", proc=proc)
    return proc, child_pids(proc.pid)


def finish(proc, timeout=60):
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError(f"run did not exit within {timeout} s:\n{out}") from None
    return proc.returncode, out


def last_session(run_dir):
    return json.loads((Path(run_dir) / "meta.json").read_text())["sessions"][-1]


def last_progress(run_dir):
    return pd.read_csv(Path(run_dir) / "progress.csv").iloc[-1]


def serial_run(run_dir, *extra, steps=200):
    assert train.main([*CARTPOLE, "--num-workers", "0", "--max-steps", str(steps), "--eval-episodes", "0",
                       "--run-dir", str(run_dir), *extra]) == 0
    return run_dir


def small_pong_run(run_dir, *extra, steps=600):
    """A real 1-worker Pong run of a few hundred steps with a tiny LSTM, no evaluator."""
    assert train.main(["--env", "ALE/Pong-v5", "--env-kwargs", "repeat_action_probability=0.0", "--lstm-size", "16",
                       "--num-workers", "1", "--envs-per-worker", "2", "--max-steps", str(steps), "--eval-episodes",
                       "0", "--no-progress", "--run-dir", str(run_dir), *extra]) == 0
    assert pd.read_csv(Path(run_dir) / "progress.csv")["global_step"].iloc[-1] >= steps
    return run_dir


def one_error_line(capsys):
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("warning")]
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


# -- stand-ins -----------------------------------------------------------------------------------

class FixedLink:
    """An `EvaluatorLink` over a model in this process, recording what the evaluator reports."""

    def __init__(self, model):
        self.model, self.reported = model, []

    def snapshot(self, model):
        copy_weights(model, self.model)

    def global_step(self):
        return 1000

    def report_evaluation(self, global_step, episodes, lstm=None):
        self.reported.append((global_step, episodes))
        self.lstm_health = lstm

    def heartbeat(self):
        pass

    def should_stop(self):
        return False


def slow_linear_resize(image, out_h, out_w):
    """Bilinear resize with pixel-centre alignment, one output pixel at a time."""
    in_h, in_w = image.shape
    out = np.zeros((out_h, out_w))
    for i in range(out_h):
        for j in range(out_w):
            y = min(max((i + 0.5) * in_h / out_h - 0.5, 0), in_h - 1)
            x = min(max((j + 0.5) * in_w / out_w - 0.5, 0), in_w - 1)
            y0, x0 = int(y), int(x)
            y1, x1 = min(y0 + 1, in_h - 1), min(x0 + 1, in_w - 1)
            fy, fx = y - y0, x - x0
            out[i, j] = ((1 - fy) * (1 - fx) * image[y0, x0] + (1 - fy) * fx * image[y0, x1]
                         + fy * (1 - fx) * image[y1, x0] + fy * fx * image[y1, x1])
    return out


def mount_tmpfs(folder, size: str, skip_reason: str):
    """A tmpfs of `size` at `folder` (a disk that fills), unmounted when the generator is closed;
    skips the test where mount is not permitted (it needs root, as on CI)."""
    folder.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(skip_reason)
    yield folder
    subprocess.run(["umount", "-l", str(folder)], check=False)


def acts_and_learns_in_a_worker(cfg, info, rollouts=2):
    """The model of `cfg` for the env `info` describes passes the start-up trial, and a worker in this
    process acts `rollouts` full rollouts and moves the shared weights; the worker comes back (closed)."""
    import torch

    from hogwild_a3c.children.reports import InProcessReports
    from hogwild_a3c.children.shared import HogwildLink, SharedState
    from hogwild_a3c.children.worker import Worker
    from hogwild_a3c.learning.learner import trial_update_problem
    from hogwild_a3c.learning.model import model_for_env
    from hogwild_a3c.learning.optim import LrSchedule

    assert trial_update_problem(model_for_env(info, cfg), cfg) is None
    torch.manual_seed(0)
    shared = SharedState.create(model_for_env(info, cfg), 1, cfg.optimizer, LrSchedule(cfg.lr))
    worker = Worker(0, cfg, info, HogwildLink(shared, 0, InProcessReports()), seed=1)
    before = [p.detach().clone() for p in shared.model.parameters()]
    try:
        for _ in range(rollouts):
            assert worker.run_rollout() == cfg.rollout_steps * cfg.envs_per_worker
    finally:
        worker.close()
    assert any(not torch.equal(a, b) for a, b in zip(before, shared.model.parameters()))
    return worker
