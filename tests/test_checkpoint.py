"""The checkpoint format's owner: best.pt on improvement only, kept across resume and preferred
by evaluate; resume with more workers and with shared Adam statistics; forkserver children."""
import json
import math

import pandas as pd
import pytest
import torch

from hogwild_a3c import train
from hogwild_a3c.children.evaluator import Evaluator
from hogwild_a3c.children.shared import SharedState
from hogwild_a3c.config import Config
from hogwild_a3c.envs.make import describe_env
from hogwild_a3c.files.checkpoint import (
    Progress,
    load_checkpoint,
    resolve_checkpoint,
    restore_training,
    training_payload,
)
from hogwild_a3c.learning.model import build_model
from hogwild_a3c.learning.optim import LrSchedule
from tests.helpers import CARTPOLE, FixedLink, last_session


def test_best_pt_is_written_only_on_improvement(tmp_path):
    cfg = Config(env="CartPole-v1", eval_episodes=2, lstm_size=8)
    info = describe_env(cfg.env)
    link = FixedLink(build_model(info.obs_shape, info.distribution, 8))
    best = tmp_path / "checkpoints" / "best.pt"
    assert Evaluator(cfg, info, link, tmp_path, best_return=1e9, seed=0).evaluate()
    assert not best.exists() and len(link.reported) == 1  # reported, but no better than before
    evaluator = Evaluator(cfg, info, link, tmp_path, best_return=-math.inf, seed=0)
    evaluator.evaluate()
    payload = load_checkpoint(best)
    assert payload["kind"] == "best" and payload["global_step"] == 1000
    assert payload["eval_mean_return"] == sum(r for r, _ in link.reported[-1][1]) / 2
    written = best.stat().st_mtime_ns
    evaluator.best_return = 1e9
    evaluator.evaluate()
    assert best.stat().st_mtime_ns == written


def test_best_is_kept_across_resume_and_preferred_by_evaluate(tmp_path):
    run_dir = tmp_path / "run"
    argv = [*CARTPOLE, "--num-workers", "0", "--eval-interval", "0.01", "--eval-episodes", "1"]
    assert train.main([*argv, "--max-steps", "300", "--run-dir", str(run_dir)]) == 0
    best = load_checkpoint(run_dir / "checkpoints" / "best.pt")
    latest = load_checkpoint(run_dir / "checkpoints" / "latest.pt")
    assert latest["best_eval_return"] == best["eval_mean_return"] == pd.read_csv(run_dir / "eval.csv")[
        "episode_return"].max()
    assert train.main(["--resume", str(run_dir), "--max-steps", "600", "--no-progress"]) == 0
    resumed = load_checkpoint(run_dir / "checkpoints" / "latest.pt")
    assert resumed["best_eval_return"] >= best["eval_mean_return"]
    payload, path = resolve_checkpoint(run_dir)
    assert path.name == "best.pt" and payload["eval_mean_return"] == resumed["best_eval_return"]


def test_resume_with_more_workers_gives_new_slots_an_old_workers_statistics(tmp_path):
    run_dir = tmp_path / "run"
    assert train.main([*CARTPOLE, "--num-workers", "1", "--max-steps", "1000", "--eval-episodes", "0",
                       "--run-dir", str(run_dir)]) == 0
    before = load_checkpoint(run_dir / "checkpoints" / "latest.pt")
    assert train.main(["--resume", str(run_dir), "--num-workers", "2", "--max-steps", "3000", "--no-progress"]) == 0
    after = load_checkpoint(run_dir / "checkpoints" / "latest.pt")
    assert len(after["optimizer"]["states"]) == 2 and after["global_step"] >= 3000
    # Whether the new worker got an update in before the budget ran out is up to the scheduler;
    # that its statistics started as the old worker's is not: restore into two slots directly.
    old = int(before["optimizer"]["states"][0]["step"][0])
    assert all(int(state["step"][0]) >= old for state in after["optimizer"]["states"])
    assert last_session(run_dir)["num_workers"] == 2
    from hogwild_a3c.config import config_from_dict

    cfg = config_from_dict(json.loads((run_dir / "config.json").read_text()), "config.json")
    info = describe_env(cfg.env)
    model = build_model(info.obs_shape, info.distribution, cfg)
    shared = SharedState.create(model, 2, cfg.optimizer, LrSchedule(cfg.lr))
    restore_training(shared, before)
    saved = before["optimizer"]["states"][0]
    for state in shared.optimizer_states:
        assert torch.equal(state["step"], saved["step"])
        assert all(torch.equal(a, b) for a, b in zip(state["exp_avg_sq"], saved["exp_avg_sq"]))


@pytest.mark.parametrize("optimizer", ["shared-adam", "shared-rmsprop"])
def test_resume_with_a_shared_optimizer_continues_its_one_set_of_statistics(tmp_path, optimizer):
    run_dir = tmp_path / "run"
    argv = ["--num-workers", "0", "--optimizer", optimizer, "--eval-episodes", "0"]
    assert train.main([*CARTPOLE, *argv, "--max-steps", "400", "--run-dir", str(run_dir)]) == 0
    before = load_checkpoint(run_dir / "checkpoints" / "latest.pt")["optimizer"]
    assert train.main(["--resume", str(run_dir), "--max-steps", "800", "--no-progress"]) == 0
    after = load_checkpoint(run_dir / "checkpoints" / "latest.pt")["optimizer"]
    assert after["kind"] == optimizer and len(after["states"]) == 1
    assert int(after["states"][0]["step"][0]) == int(before["states"][0]["step"][0]) + 20


def test_restore_is_the_inverse_of_the_payload():
    torch.manual_seed(0)
    shared = SharedState.create(build_model((4,), 2, 8), 2, "adam", LrSchedule(1e-3))
    shared.optimizer_states[1]["step"].fill_(7)
    counters = {"updates": 10, "skipped_updates": 1, "env_errors": 2, "worker_restarts": 0}
    progress = Progress(1234, 56.5, 3, 9.5, counters)
    payload = training_payload(shared.snapshot_weights(), shared, Config(env="CartPole-v1"), progress)
    fresh = SharedState.create(build_model((4,), 2, 8), 2, "adam", LrSchedule(1e-3))
    assert restore_training(fresh, payload) == progress
    assert fresh.global_step() == 1234 and int(fresh.optimizer_states[1]["step"][0]) == 7
    for key, value in shared.snapshot_weights().items():
        assert torch.equal(fresh.model.state_dict()[key], value)


def test_forkserver_children_train(tmp_path):
    run_dir = tmp_path / "run"
    assert train.main([*CARTPOLE, "--num-workers", "1", "--start-method", "forkserver", "--max-steps", "1000",
                       "--eval-episodes", "1", "--eval-interval", "1", "--run-dir", str(run_dir)]) == 0
    assert load_checkpoint(run_dir / "checkpoints" / "latest.pt")["global_step"] >= 1000


def test_a_run_saved_when_the_reference_was_called_seed_resumes(tmp_path):
    """config.json and the checkpoint of runs from before the rename say "seed" for the preset
    and the frame mode; resuming them (even naming the old preset again) is not a change."""
    run_dir = tmp_path / "run"
    assert train.main([*CARTPOLE, "--num-workers", "0", "--max-steps", "300", "--eval-episodes", "0",
                       "--run-dir", str(run_dir)]) == 0
    config = json.loads((run_dir / "config.json").read_text())
    (run_dir / "config.json").write_text(json.dumps({**config, "preset": "seed", "frame": "seed"}))
    for path in (run_dir / "checkpoints").glob("*.pt"):
        payload = torch.load(path, weights_only=True)
        payload["config"] = {**payload["config"], "preset": "seed", "frame": "seed"}
        torch.save(payload, path)
    assert train.main(["--resume", str(run_dir), "--preset", "seed", "--max-steps", "600", "--no-progress"]) == 0
    assert load_checkpoint(run_dir / "checkpoints" / "latest.pt")["global_step"] >= 600
