"""Hangs that a dead or stuck child used to cause, injected for real: a killed evaluator, a
random child killed at a random moment, a hung evaluator, a slow start-up, Ctrl-C during the
imports. Every wait has a hard timeout, so a regression fails instead of hanging."""
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from hogwild_a3c import train
from hogwild_a3c.files.checkpoint import load_checkpoint
from tests.helpers import REPO, alive, finish, last_session, start_run, start_training, wait_for

# The README's bound: after a child dies the main process notices within a second, and a stop
# takes at most 10 s of grace + 2 s terminate + 2 s kill, plus the final checkpoint.
SHUTDOWN_BOUND_S = 30


def session_pids(run_dir):
    try:
        return last_session(run_dir).get("pids", {})
    except (OSError, ValueError, KeyError, IndexError):
        return {}


def all_children_gone(pids):
    wait_for(lambda: not any(alive(pid) for pid in pids), timeout=15, what="children to exit")


@pytest.mark.timeout(150)
def test_killed_evaluator_is_restarted_and_sigint_still_stops_the_run(tmp_path):
    run_dir = tmp_path / "run"
    proc, _ = start_training(run_dir, "--num-workers", "2", "--eval-interval", "1", "--eval-episodes", "1")
    first = session_pids(run_dir)["evaluator"]
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: session_pids(run_dir).get("evaluator") not in (None, first), timeout=30,
             what="a new evaluator", proc=proc)
    wait_for(lambda: len((run_dir / "eval.csv").read_text().splitlines()) >= 2, timeout=60,
             what="an evaluation by the new evaluator", proc=proc)
    pids = list(session_pids(run_dir).values()) + [first]
    proc.send_signal(signal.SIGINT)
    code, out = finish(proc, timeout=SHUTDOWN_BOUND_S)
    assert code == 130, out
    assert "evaluator was killed by signal 9; restarting it (1/3)" in (run_dir / "train.log").read_text()
    assert last_session(run_dir)["ended"] == "interrupted (SIGINT)"
    load_checkpoint(run_dir / "checkpoints" / "latest.pt")
    all_children_gone(pids)


@pytest.mark.timeout(150)
def test_evaluator_dying_beyond_its_restarts_stops_the_run_cleanly(tmp_path):
    run_dir = tmp_path / "run"
    proc, _ = start_training(run_dir, "--num-workers", "1", "--eval-interval", "1", "--eval-episodes", "1",
                             "--max-evaluator-restarts", "0")
    pids = list(session_pids(run_dir).values())
    os.kill(session_pids(run_dir)["evaluator"], signal.SIGKILL)
    code, out = finish(proc, timeout=SHUTDOWN_BOUND_S)
    assert code == 1, out
    assert last_session(run_dir)["ended"] == "failed: evaluator was killed by signal 9"
    load_checkpoint(run_dir / "checkpoints" / "latest.pt")
    all_children_gone(pids)


def kill_a_random_child(tmp_path, rng, index):
    """Start a run, kill one of its children (any worker or the evaluator) at a random moment
    from its start-up on, and check that the run ends by itself, saved, with no process left."""
    run_dir = tmp_path / f"run{index}"
    proc = start_run(run_dir, "--num-workers", "2", "--eval-interval", "1", "--eval-episodes", "1",
                     "--max-seconds", "10")
    wait_for(lambda: len(session_pids(run_dir)) == 3, timeout=60, what="children to start", proc=proc)
    pids = session_pids(run_dir)
    victim = rng.choice(sorted(pids))
    time.sleep(rng.uniform(0.0, 4.0))
    os.kill(pids[victim], signal.SIGKILL)
    code, out = finish(proc, timeout=10 + SHUTDOWN_BOUND_S)
    # A killed worker stops the run (no restarts allowed); a killed evaluator is restarted and
    # the run goes on to its budget.
    expected = 0 if victim == "evaluator" else 1
    assert code == expected, (victim, out)
    load_checkpoint(run_dir / "checkpoints" / "latest.pt")
    all_children_gone(list(pids.values()) + list(session_pids(run_dir).values()))
    return victim


@pytest.mark.timeout(300)
def test_a_random_child_killed_at_a_random_moment_never_hangs_the_run(tmp_path):
    rng = random.Random(int(os.environ.get("STRESS_SEED", "0")))
    for index in range(3):
        kill_a_random_child(tmp_path, rng, index)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_stress_twenty_random_kills(tmp_path):
    rng = random.Random(int(os.environ.get("STRESS_SEED", "1")))
    victims = [kill_a_random_child(tmp_path, rng, index) for index in range(20)]
    assert "evaluator" in victims and any(v.startswith("worker") for v in victims)


@pytest.mark.timeout(120)
def test_hung_evaluator_is_reported_as_stalled_and_the_run_still_ends(tmp_path):
    run_dir = tmp_path / "run"
    code = train.main([
        "--env", "tests.envs:Faulty-v0", "--env-kwargs", "fault='hang_in_evaluator'", "fail_at=20",
        "--num-workers", "1", "--eval-interval", "1", "--eval-episodes", "1", "--max-seconds", "10",
        "--stall-timeout", "3", "--lstm-size", "8", "--no-progress", "--run-dir", str(run_dir),
    ])
    assert code == 0
    errors = (run_dir / "errors.log").read_text()
    assert "evaluator stalled" in errors and "worker 0 stalled" not in errors


@pytest.mark.timeout(120)
def test_a_slow_start_up_is_not_a_stall(tmp_path):
    run_dir = tmp_path / "run"
    code = train.main([
        # 2 envs of 5 s each: the worker starts for 10 s, five stall timeouts (not the preset's 8: 40 s of test)
        "--env", "tests.envs:Faulty-v0", "--env-kwargs", "fault='slow_start'", "hang_s=5", "--envs-per-worker", "2",
        "--num-workers", "1", "--eval-episodes", "0", "--max-steps", "2000", "--stall-timeout", "2",
        "--lstm-size", "8", "--no-progress", "--run-dir", str(run_dir),
    ])
    assert code == 0
    assert not (run_dir / "errors.log").exists() or "stalled" not in (run_dir / "errors.log").read_text()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("delay_s", [0.5, 0.9, 1.3])
def test_ctrl_c_during_the_imports_is_one_line_and_exit_130(tmp_path, delay_s):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "hogwild_a3c.train", "--env", "CartPole-v1", "--no-progress",
         "--run-dir", str(tmp_path / "run")],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    time.sleep(delay_s)  # the interpreter is up; torch and gymnasium are still importing
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=45)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err


@pytest.mark.timeout(120)
def test_ctrl_c_while_a_worker_still_makes_its_envs_stops_at_once(tmp_path):
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        # The worker's env takes an hour to make; the main process's own start-up check does not wait for it.
        [sys.executable, "-m", "hogwild_a3c.train", "--env", "tests.envs:Faulty-v0",
         "--env-kwargs", "fault='slow_start_in_worker'", "--num-workers", "1", "--eval-episodes", "0",
         "--lstm-size", "8", "--no-progress", "--run-dir", str(run_dir)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    wait_for(lambda: session_pids(run_dir), timeout=60, what="the worker to be started", proc=proc)
    pids = list(session_pids(run_dir).values())
    proc.send_signal(signal.SIGINT)
    code, out = finish(proc, timeout=SHUTDOWN_BOUND_S)
    assert code == 130, out
    # On the old code the stop waited out the grace period for a worker that held nothing, then killed it.
    assert "did not stop within" not in out
    assert last_session(run_dir)["ended"] == "interrupted (SIGINT)"
    all_children_gone(pids)
