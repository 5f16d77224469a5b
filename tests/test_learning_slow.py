"""Long learning runs, excluded from `make test`; run them with `make test-slow`.

Every classic-control run here gives no flag but --env (and the process and budget settings a
test needs): the env's preset must do the rest."""
import json

import numpy as np
import pandas as pd
import pytest

from hogwild_a3c import train

pytestmark = pytest.mark.slow


def _learn(tmp_path, *flags, target, budget_s):
    run_dir = tmp_path / "run"
    code = train.main([*flags, "--num-workers", "2", "--target-return", str(target), "--eval-episodes", "5",
                       "--eval-interval", "5", "--max-seconds", str(budget_s), "--no-progress",
                       "--run-dir", str(run_dir)])
    evals = pd.read_csv(run_dir / "eval.csv")
    return code, float(np.mean(evals["episode_return"].tail(5))), json.loads((run_dir / "config.json").read_text())


@pytest.mark.timeout(700)
def test_cartpole_to_475_with_no_flags(tmp_path):
    code, mean, config = _learn(tmp_path, "--env", "CartPole-v1", target=475, budget_s=600)
    assert config["preset"] == "vector"
    assert code == 0 and mean >= 475


@pytest.mark.timeout(700)
def test_acrobot_to_minus_100_with_no_flags(tmp_path):
    code, mean, _ = _learn(tmp_path, "--env", "Acrobot-v1", target=-100, budget_s=600)
    assert code == 0 and mean >= -100


@pytest.mark.timeout(700)
def test_rewards_100x_larger_learn_as_well_with_no_flags(tmp_path):
    """CartPole with every reward x100 (a user's env of another scale): 475 x 100 in evaluation."""
    code, mean, config = _learn(tmp_path, "--env", "tests.envs:ScaledCartPole-v1", target=47500, budget_s=600)
    assert config["preset"] == "vector" and config["normalize_reward"]
    assert code == 0 and mean >= 47500


@pytest.mark.timeout(700)
def test_cartpole_with_shared_adam(tmp_path):
    code, mean, _ = _learn(tmp_path, "--env", "CartPole-v1", "--optimizer", "shared-adam", target=195, budget_s=600)
    assert code == 0 and mean >= 195


@pytest.mark.timeout(700)
def test_cartpole_with_the_feed_forward_core_on_the_vector_preset(tmp_path):
    """The vector preset before it had memory, one flag away."""
    code, mean, _ = _learn(tmp_path, "--env", "CartPole-v1", "--core", "mlp", "--rollout-steps", "5", target=195,
                           budget_s=600)
    assert code == 0 and mean >= 195


def _learn_within_steps(tmp_path, env, target, max_steps):
    """A run with no flag but --env and the budget: it must end at the target, within the steps."""
    run_dir = tmp_path / "run"
    code = train.main(["--env", env, "--num-workers", "2", "--target-return", str(target), "--eval-episodes", "10",
                       "--eval-interval", "5", "--max-steps", str(max_steps), "--no-progress",
                       "--run-dir", str(run_dir)])
    meta = json.loads((run_dir / "meta.json").read_text())
    return code, meta["sessions"][-1]["ended"], json.loads((run_dir / "config.json").read_text())


@pytest.mark.timeout(900)
def test_minigrid_empty_8x8_to_an_evaluation_mean_of_0_9_within_200k_steps(tmp_path):
    pytest.importorskip("minigrid")
    code, ended, config = _learn_within_steps(tmp_path, "minigrid:MiniGrid-Empty-8x8-v0", 0.9, 200_000)
    assert config["preset"] == "grid"
    assert code == 0 and ended == "target_return"


@pytest.mark.timeout(1800)
def test_minigrid_doorkey_5x5_to_an_evaluation_mean_of_0_9_within_500k_steps(tmp_path):
    pytest.importorskip("minigrid")
    code, ended, _ = _learn_within_steps(tmp_path, "minigrid:MiniGrid-DoorKey-5x5-v0", 0.9, 500_000)
    assert code == 0 and ended == "target_return"
