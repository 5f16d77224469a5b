"""The dead-LSTM warning: the evaluator measures the cell state and the spread of h over each
evaluation, and the main process warns once when both say the network is dead. A dead network
is made as the dead Pong networks were (results README, "The reference's LSTM forget-gate bias"): every gate saturated,
input and forget gates open and the cell input +1 (biases +100), so c counts up one per step,
and the output gate shut (-100), so h is 0 whatever the input."""
import pytest
import torch

from hogwild_a3c import train
from hogwild_a3c.children.evaluator import Evaluator
from hogwild_a3c.config import Config
from hogwild_a3c.envs.make import describe_env
from hogwild_a3c.files.checkpoint import load_checkpoint, save_checkpoint
from hogwild_a3c.learning.lstm_watch import DEAD_CELL, LstmWatch
from hogwild_a3c.learning.model import build_model
from tests.helpers import FixedLink

EPISODE = 120  # Counting-v0 steps per episode: long enough for a dead cell to pass DEAD_CELL
COUNTING = ["--env", "tests.envs:Counting-v0", "--env-kwargs", f"length={EPISODE}", "--preset", "universe",
            "--lstm-size", "8", "--hidden-size", "16"]


def kill_lstm(state_dict):
    for name in ("lstm.bias_ih_l0", "lstm.bias_hh_l0"):
        bias = torch.full_like(state_dict[name], 100.0)
        bias[3 * len(bias) // 4 :] = -100.0  # torch's gate order: input, forget, cell, output
        state_dict[name] = bias
    return state_dict


def evaluate_once(model_state, tmp_path):
    cfg = Config(env="tests.envs:Counting-v0", env_kwargs={"length": EPISODE}, eval_episodes=2, lstm_size=8,
                 hidden_size=16)
    info = describe_env(cfg.env, cfg.env_kwargs)
    model = build_model(info.obs_shape, info.distribution, cfg)
    if model_state is not None:
        model.load_state_dict(model_state(model.state_dict()))
    link = FixedLink(model)
    assert Evaluator(cfg, info, link, tmp_path, best_return=0.0, seed=0).evaluate()
    return link.lstm_health


def test_the_evaluator_tells_a_saturated_lstm_from_a_fresh_one(tmp_path):
    torch.manual_seed(0)
    fresh = evaluate_once(None, tmp_path)
    dead = evaluate_once(kill_lstm, tmp_path)
    assert not fresh.dead and fresh.cell < 1.0 and fresh.h_spread > 1e-4
    assert dead.dead and dead.cell == pytest.approx(EPISODE, rel=0.01) and dead.h_spread < 1e-8


def test_a_flat_h_alone_or_a_large_cell_alone_is_not_called_dead():
    flat = LstmWatch()
    for _ in range(10):
        flat.observe((torch.ones(1, 1, 4), torch.full((1, 1, 4), 0.5)))
    flat.episode_ended()
    assert flat.health().h_spread < 1e-8 and not flat.health().dead
    moving = LstmWatch()
    for t in range(10):
        moving.observe((torch.full((1, 1, 4), t / 10), torch.full((1, 1, 4), 10.0 * DEAD_CELL)))
    moving.episode_ended()
    assert moving.health().cell > DEAD_CELL and not moving.health().dead
    assert LstmWatch().health() is None  # nothing watched, nothing said


def train_log(run_dir):
    return (run_dir / "train.log").read_text()


@pytest.mark.timeout(180)
def test_a_run_whose_lstm_died_is_warned_once_and_a_healthy_one_not_at_all(tmp_path):
    run_dir = tmp_path / "run"
    evals = ["--eval-episodes", "1", "--eval-interval", "0.05", "--num-workers", "0", "--no-progress"]
    assert train.main([*COUNTING, *evals, "--max-steps", "600", "--run-dir", str(run_dir)]) == 0
    assert "looks dead" not in train_log(run_dir)
    payload = load_checkpoint(run_dir / "checkpoints" / "latest.pt")
    payload["model"] = kill_lstm(payload["model"])
    for path in (run_dir / "checkpoints").glob("*.pt"):
        path.unlink()
    save_checkpoint(run_dir / "checkpoints", payload, payload["global_step"])
    assert train.main(["--resume", str(run_dir), "--env", "tests.envs:Counting-v0", *evals[:4], "--max-steps", "3000",
                       "--no-progress"]) == 0
    warnings = [line for line in train_log(run_dir).splitlines() if "looks dead" in line]
    assert len(warnings) == 1, warnings
    assert "another --seed" in warnings[0] and "|c| = 1" in warnings[0]  # ~120: one per step of the episode
