"""A run saved before the rooms change (the modules' move, the action head's new name) resumes,
loads and plays after it. tests/fixtures/run-before-rooms/ is a real run directory written by
bb4b8e3 (`python -m hogwild_a3c.train --env CartPole-v1 --num-workers 1 --max-steps 3000 ...`):
its checkpoint names the action head `policy.*`."""
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from hogwild_a3c import evaluate, load_policy, train

FIXTURE = Path(__file__).parent / "fixtures" / "run-before-rooms"


def copy_of_the_old_run(tmp_path):
    run_dir = tmp_path / "old-run"
    shutil.copytree(FIXTURE, run_dir)
    return run_dir


def test_the_fixture_is_from_before_the_rename():
    saved = torch.load(FIXTURE / "checkpoints" / "latest.pt", weights_only=True)
    assert "policy.weight" in saved["model"] and "action_head.weight" not in saved["model"]


def test_a_run_saved_before_the_move_resumes_after_it(tmp_path):
    run_dir = copy_of_the_old_run(tmp_path)
    before = pd.read_csv(run_dir / "episodes.csv")
    result = train(resume=str(run_dir), max_steps=9000, num_workers=0, progress=False)
    assert result.ok and result.ended == "max_steps" and result.global_step >= 9000
    after = pd.read_csv(run_dir / "episodes.csv")
    assert len(after) > len(before)  # appended to, not overwritten
    pd.testing.assert_frame_equal(after.iloc[:len(before)], before)
    saved = torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=True)
    assert "action_head.weight" in saved["model"] and "policy.weight" not in saved["model"]


def test_a_policy_saved_before_the_move_loads_acts_and_evaluates(tmp_path):
    run_dir = copy_of_the_old_run(tmp_path)
    old = torch.load(FIXTURE / "checkpoints" / "latest.pt", weights_only=True)["model"]
    policy = load_policy(run_dir)
    torch.testing.assert_close(policy.model.action_head.weight, old["policy.weight"])
    obs, _ = policy.make_env().reset(seed=0)
    action, _ = policy.act(obs, policy.initial_state(), greedy=True, rng=np.random.default_rng(0))
    assert type(action) is int and action in (0, 1)
    returns = evaluate(str(run_dir), episodes=2)
    assert len(returns) == 2 and all(r >= 1 for r in returns)
