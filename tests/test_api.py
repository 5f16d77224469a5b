"""Training and playing from Python: hogwild_a3c.train / load_policy / evaluate."""
import json
import os
import signal
import subprocess
import sys
import time

import gymnasium as gym
import numpy as np
import pytest
import torch

import hogwild_a3c
from hogwild_a3c.checkpoint import save_checkpoint
from hogwild_a3c.config import Config
from hogwild_a3c.envs import register_atari
from hogwild_a3c.model import build_model
from tests.conftest import REPO

SMALL = dict(env="CartPole-v1", lstm_size=16, eval_episodes=0, no_progress=True)


def test_train_from_python_then_resume_load_and_evaluate(tmp_path):
    run_dir = tmp_path / "run"
    result = hogwild_a3c.train(**SMALL, num_workers=1, max_steps=2000, run_dir=run_dir)
    assert result.ok and result.ended == "max_steps" and result.global_step >= 2000 and result.run_dir == run_dir
    again = hogwild_a3c.train(resume=run_dir, max_steps=3000, num_workers=0)
    assert again.ok and again.global_step >= 3000
    assert [s["ended"] for s in json.loads((run_dir / "meta.json").read_text())["sessions"]] == ["max_steps"] * 2

    policy = hogwild_a3c.load_policy(run_dir)
    env = policy.make_env()
    obs, _ = env.reset(seed=0)
    state, rng = policy.initial_state(), np.random.default_rng(0)
    for _ in range(20):
        action, state = policy.act(obs, state, rng=rng)
        assert env.action_space.contains(action)
        obs, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            break
    returns = hogwild_a3c.evaluate(run_dir, episodes=2, seed=1)
    assert len(returns) == 2 and all(r >= 1 for r in returns)


def test_a_config_object_and_bad_settings(tmp_path):
    cfg = Config(**SMALL, num_workers=0, max_steps=300, run_dir=str(tmp_path / "run"))
    assert hogwild_a3c.train(cfg, seed=2).ok
    assert json.loads((tmp_path / "run" / "config.json").read_text())["seed"] == 2
    with pytest.raises(ValueError, match="--lr must be a positive number"):
        hogwild_a3c.train(**SMALL, lr=-1.0, run_dir=tmp_path / "bad")
    with pytest.raises(ValueError, match="unknown setting"):
        hogwild_a3c.train(**SMALL, learning_rate=1e-3)
    assert not (tmp_path / "bad").exists()


def test_a_policy_takes_raw_atari_frames_as_training_saw_them(tmp_path):
    register_atari()
    cfg = Config(env="ALE/Pong-v5", lstm_size=32, num_workers=1)
    torch.manual_seed(0)
    model = build_model((1, 42, 42), 6, 32)
    save_checkpoint(tmp_path, {"model": model.state_dict(), "config": cfg.to_dict(), "global_step": 0}, 0)
    policy = hogwild_a3c.load_policy(tmp_path / "latest.pt")
    raw = gym.make("ALE/Pong-v5", obs_type="grayscale")
    processed = policy.make_env()
    frame, _ = raw.reset(seed=3)
    obs, _ = processed.reset(seed=3)
    state_raw = state_processed = policy.initial_state()
    for _ in range(5):
        action, state_raw = policy.act(frame, state_raw, greedy=True)
        same, state_processed = policy.act(obs, state_processed, greedy=True)
        assert action == same and torch.equal(state_raw[0], state_processed[0])
        frame, *_ = raw.step(action)
        obs, *_ = processed.step(action)
    with pytest.raises(ValueError, match="this policy takes"):
        policy.act(np.zeros(4), state_raw)


@pytest.mark.timeout(120)
def test_ctrl_c_stops_a_run_started_from_python_cleanly(tmp_path):
    script = (
        "import hogwild_a3c\n"
        f"r = hogwild_a3c.train(env='CartPole-v1', lstm_size=16, num_workers=2, eval_episodes=0, no_progress=True,"
        f" progress_interval=0.5, run_dir={str(tmp_path / 'run')!r})\n"
        "print('RESULT', r.exit_code, r.ended)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    progress = tmp_path / "run" / "progress.csv"
    deadline = time.time() + 90
    while time.time() < deadline and not (progress.exists() and len(progress.read_text().splitlines()) > 1):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "RESULT 130 interrupted (SIGINT)" in out and "Traceback" not in out
