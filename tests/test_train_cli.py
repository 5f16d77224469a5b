"""The real entry point: smoke run, repeatable serial run, bad input, learning CartPole."""
import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch

from hogwild_a3c import train
from hogwild_a3c.files.checkpoint import load_checkpoint
from hogwild_a3c.files.logs import EPISODES_COLUMNS, EVAL_COLUMNS, PROGRESS_COLUMNS, load_run
from tests.helpers import TINY


def test_smoke_two_workers_writes_the_whole_run_directory(tmp_path):
    run_dir = tmp_path / "run"
    # A user's thread settings must neither deadlock nor oversubscribe the workers.
    env = {**os.environ, "OMP_NUM_THREADS": "4", "MKL_NUM_THREADS": "4", "PYTHONUNBUFFERED": "1"}
    # The run ends at its first evaluation (every CartPole return is >= 8 > 0), not at a step
    # budget: a budget would race the workers against the evaluator's first evaluation.
    proc = subprocess.run(
        [sys.executable, "-m", "hogwild_a3c.train", *TINY, "--num-workers", "2", "--max-steps", "10000000",
         "--target-return", "0", "--eval-interval", "1", "--eval-episodes", "2", "--run-dir", str(run_dir)],
        env=env, capture_output=True, text=True, timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    for name in ("config.json", "meta.json", "episodes.csv", "eval.csv", "progress.csv", "checkpoints/latest.pt"):
        assert (run_dir / name).is_file(), name
    assert list(pd.read_csv(run_dir / "episodes.csv").columns) == list(EPISODES_COLUMNS)
    assert list(pd.read_csv(run_dir / "eval.csv").columns) == list(EVAL_COLUMNS)
    assert list(pd.read_csv(run_dir / "progress.csv").columns) == list(PROGRESS_COLUMNS)
    assert len(pd.read_csv(run_dir / "eval.csv")) >= 2  # an evaluation of two episodes
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["sessions"][-1]["ended"] == "target_return" and meta["sessions"][-1]["exit_code"] == 0
    assert {"worker 0", "worker 1", "evaluator"} <= set(meta["sessions"][-1]["pids"])
    assert meta["cores"] >= 1 and "torch" in meta["versions"]
    config = json.loads((run_dir / "config.json").read_text())
    assert config["num_workers"] == 2 and config["env"] == "CartPole-v1"
    payload = load_checkpoint(run_dir / "checkpoints" / "latest.pt")
    assert len(payload["optimizer"]["states"]) == 2
    run = load_run(run_dir)
    assert run["config"]["env"] == "CartPole-v1"


def _serial_run(tmp_path, name, seed):
    run_dir = tmp_path / name
    code = train.main([*TINY, "--num-workers", "0", "--max-steps", "800", "--seed", str(seed),
                       "--eval-episodes", "0", "--run-dir", str(run_dir)])
    assert code == 0
    return load_checkpoint(run_dir / "checkpoints" / "latest.pt")["model"]


def test_serial_run_is_exactly_repeatable(tmp_path):
    first = _serial_run(tmp_path, "a", seed=3)
    second = _serial_run(tmp_path, "b", seed=3)
    other = _serial_run(tmp_path, "c", seed=4)
    for key in first:
        assert torch.equal(first[key], second[key]), key
    assert any(not torch.equal(first[key], other[key]) for key in first)


BAD_INPUTS = [
    (["--env", "NoSuchEnv-v0"], "--env 'NoSuchEnv-v0'"),
    (["--env", "tests.envs:DictAction-v0"], "is not one this trainer samples from; it takes Categorical (Discrete)"),
    (["--env", "tests.envs:RankFour-v0"], "a Box of rank 4 (shape (2, 8, 8, 3)) is not supported; supported: a Box"),
    (["--env", "tests.envs:TextOnly-v0"], "nothing in it is an array or a discrete value (dropped: mission (Text))"),
    (["--env", "tests.envs:Image-v0", "--image-size", "4"], "--image-size must be an integer from 8 to 256 (got 4)"),
    (["--env", "no_such_module:Env-v0"], "cannot import module"),
    (["--env", "CartPole-v1", "--env-kwargs", "=3"], "--env-kwargs"),
    (["--env", "CartPole-v1", "--env-kwargs", "no_such_kwarg=1"], "--env-kwargs"),
    (["--num-workers", "-1"], "--num-workers must be an integer >= 0"),
    (["--lr", "0"], "--lr must be a positive number"),
    (["--lr-warmup-updates", "-5"], "--lr-warmup-updates must be an integer >= 0 (0: no warm-up) (got -5)"),
    (["--gamma", "1.5"], "--gamma must be in (0, 1]"),
    (["--target-return", "1", "--eval-episodes", "0"], "--target-return needs evaluations"),
    (["--resume", "/nonexistent/run"], "--resume /nonexistent/run"),
    # Values that used to reach the machine unchecked (a traceback, or silently wrong episodes):
    (["--env", "CartPole-v1", "--seed", str(2**64)], "--seed must be an integer from 0 to 4294967295"),
    (["--env", "CartPole-v1", "--env-kwargs", "max_episode_steps=0"], "max_episode_steps must be an integer >= 1"),
    (["--env", "CartPole-v1", "--env-kwargs", "max_episode_steps=True"], "max_episode_steps must be an integer >= 1"),
    (["--env", "tests.envs:Counting-v0", "--env-kwargs", "length=0"], "--env-kwargs length=0: length must be >= 1"),
    (["--env", "CartPole-v1", "--num-workers", "100000"], "--num-workers 100000 needs about"),
]


@pytest.mark.parametrize("argv,expected", BAD_INPUTS)
def test_bad_input_is_one_clear_line_and_exit_2(argv, expected, capsys, tmp_path):
    code = train.main([*argv, "--run-dir", str(tmp_path / "r")] if "--resume" not in argv else argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("error: ") and expected in err[0], err
    assert not (tmp_path / "r").exists()


def test_an_absurd_learning_rate_is_warned_about(tmp_path, capsys):
    assert train.main([*TINY, "--num-workers", "0", "--max-steps", "50", "--eval-episodes", "0", "--lr", "1e30",
                       "--run-dir", str(tmp_path / "r")]) == 0
    assert "warning: --lr 1e+30 is far above" in capsys.readouterr().err


def test_every_config_error_is_reported_at_once(capsys):
    assert train.main(["--lr", "-1", "--gamma", "0", "--rollout-steps", "0"]) == 2
    err = capsys.readouterr().err
    assert "--lr" in err and "--gamma" in err and "--rollout-steps" in err


def test_existing_run_dir_is_never_overwritten(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "episodes.csv").write_text("precious\n")
    assert train.main([*TINY, "--run-dir", str(run_dir), "--max-steps", "100"]) == 2
    assert "--resume" in capsys.readouterr().err
    assert (run_dir / "episodes.csv").read_text() == "precious\n"


def test_unknown_flag_exits_2_from_the_command_line(run_cli):
    proc = run_cli("--no-such-flag", timeout=60)
    assert proc.returncode == 2 and "--no-such-flag" in proc.stderr


def test_cartpole_is_learned_by_the_multiprocess_trainer(tmp_path):
    """CartPole-v1 to a mean evaluation return >= 195 over 5 episodes, with no tuning flags."""
    run_dir = tmp_path / "cartpole"
    code = train.main([
        "--env", "CartPole-v1", "--num-workers", "2", "--seed", "1",
        "--target-return", "195", "--eval-episodes", "5", "--eval-interval", "5",
        "--max-seconds", "300", "--no-progress", "--run-dir", str(run_dir),
    ])
    evals = pd.read_csv(run_dir / "eval.csv")
    assert code == 0
    assert json.loads((run_dir / "meta.json").read_text())["sessions"][-1]["ended"] == "target_return"
    assert np.mean(evals["episode_return"].tail(5)) >= 195


def test_shared_adam_keeps_one_set_of_statistics(tmp_path):
    run_dir = tmp_path / "run"
    assert train.main([*TINY, "--num-workers", "2", "--optimizer", "shared-adam", "--max-steps", "3000",
                       "--eval-episodes", "0", "--run-dir", str(run_dir)]) == 0
    payload = load_checkpoint(run_dir / "checkpoints" / "latest.pt")
    states = payload["optimizer"]["states"]
    assert payload["optimizer"]["kind"] == "shared-adam" and len(states) == 1
    # Both workers stepped the one shared set: its step count is the total number of updates
    # (an increment may be lost when two workers step at once: Hogwild takes no lock).
    updates = pd.read_csv(run_dir / "progress.csv")["updates"].iloc[-1]
    assert 0.9 * updates <= int(states[0]["step"][0]) <= updates


def test_tensorboard_without_the_package_is_a_clear_error(tmp_path, capsys):
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("tensorboard is installed here; the error path cannot be shown")
    assert train.main([*TINY, "--tensorboard", "--max-steps", "100", "--run-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--tensorboard needs the tensorboard package" in err[0]
    assert not (tmp_path / "r").exists()


def test_wandb_logs_offline_into_the_run_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")  # no network: the default, said here explicitly
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = tmp_path / "run"
    assert train.main([*TINY, "--num-workers", "0", "--max-steps", "400", "--eval-episodes", "1",
                       "--eval-interval", "0.01", "--progress-interval", "0.05", "--wandb",
                       "--run-dir", str(run_dir)]) == 0
    (log,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    data = log.read_bytes()  # the run's records, metric names as plain UTF-8 inside
    for name in (b"train/episode_return", b"eval/mean_return", b"train/entropy", b"global_step"):
        assert name in data, name


def test_wandb_leaves_a_users_own_run_active(tmp_path, monkeypatch):
    """A notebook's own wandb run goes on beside the trainer's; ending the trainer's run must
    neither finish it nor shut the service it logs through."""
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    users = wandb.init(project="users-own", dir=str(tmp_path), mode="offline")
    try:
        assert train.main([*TINY, "--num-workers", "0", "--max-steps", "300", "--eval-episodes", "0", "--wandb",
                           "--run-dir", str(tmp_path / "run")]) == 0
        assert wandb.run is users
        users.log({"after_training": 1.0})  # raises if the run was finished or its service shut
    finally:
        users.finish()
        wandb.teardown()
    (log,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    assert b"after_training" in log.read_bytes()


def test_the_evaluator_runs_at_the_priority_asked_and_its_cpu_share_is_logged(tmp_path):
    from tests.helpers import finish, start_run, wait_for

    run_dir = tmp_path / "run"
    proc = start_run(run_dir, "--num-workers", "1", "--eval-nice", "7", "--eval-interval", "0.5",
                     "--eval-episodes", "1", "--max-steps", "100000000")

    def evaluator_pid():
        try:
            return json.loads((run_dir / "meta.json").read_text())["sessions"][-1]["pids"]["evaluator"]
        except (OSError, ValueError, KeyError):
            return None

    try:
        # An evaluation written: the evaluator is past its start-up, where it lowers its priority.
        wait_for(lambda: evaluator_pid() is not None and (run_dir / "eval.csv").is_file()
                 and len(pd.read_csv(run_dir / "eval.csv")) > 0, what="an evaluation", proc=proc)
        with open(f"/proc/{evaluator_pid()}/stat") as f:
            nice = int(f.read().rsplit(")", 1)[1].split()[16])
        assert nice == min(19, os.nice(0) + 7)  # the kernel caps it at 19
        wait_for(lambda: (run_dir / "progress.csv").is_file()
                 and pd.read_csv(run_dir / "progress.csv")["eval_cpu_share"].between(0, 1).sum() >= 2,
                 what="progress rows with the evaluator's share", proc=proc)
    finally:
        proc.send_signal(2)
        finish(proc)


def test_eval_nice_outside_0_to_19_is_one_line_naming_the_flag(tmp_path, capsys):
    from tests.helpers import one_error_line

    assert train.main([*TINY, "--eval-nice", "20", "--run-dir", str(tmp_path / "r")]) == 2
    assert "--eval-nice must be an integer from 0 to 19 (got 20)" in one_error_line(capsys)
    assert not (tmp_path / "r").exists()
