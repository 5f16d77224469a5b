"""Training and playing from Python: hogwild_a3c.train / load_policy / evaluate."""
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time

import gymnasium as gym
import numpy as np
import pytest
import torch

import hogwild_a3c
from hogwild_a3c.config import Config, config_from_dict
from hogwild_a3c.envs.make import register_atari
from hogwild_a3c.files.checkpoint import save_checkpoint
from hogwild_a3c.learning.model import build_model
from tests.helpers import REPO

SMALL = dict(env="CartPole-v1", lstm_size=16, eval_episodes=0, progress=False)


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


@pytest.mark.parametrize("size", [42, 84])
def test_a_policy_takes_raw_atari_frames_as_training_saw_them(tmp_path, size):
    register_atari()
    cfg = Config(env="ALE/Pong-v5", lstm_size=32, num_workers=1, image_size=size)
    torch.manual_seed(0)
    model = build_model((1, size, size), 6, 32)
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


BOOL_FIELDS = [f.name for f in dataclasses.fields(Config) if f.type in ("bool", bool)]


@pytest.mark.parametrize("value", [True, False])
@pytest.mark.parametrize("name", BOOL_FIELDS)
def test_every_bool_setting_is_taken_as_given(name, value):
    """False is a setting, not an absence: it must win over what the preset says."""
    assert getattr(hogwild_a3c.resolve_config(env="CartPole-v1", **{name: value}), name) is value


def test_false_turns_off_what_the_preset_turns_on(tmp_path):
    assert hogwild_a3c.resolve_config(env="CartPole-v1").normalize_obs is True  # the vector preset's
    result = hogwild_a3c.train(env="CartPole-v1", lstm_size=16, eval_episodes=0, progress=False, num_workers=0,
                               max_steps=200, normalize_obs=False, run_dir=tmp_path / "run")
    assert result.ok
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["normalize_obs"] is False and saved["progress"] is False
    assert "obs_stats" not in torch.load(tmp_path / "run" / "checkpoints" / "latest.pt", weights_only=True)


def test_a_config_round_trips_exactly_even_where_it_is_set_back_to_the_seeds_value(tmp_path):
    cfg = hogwild_a3c.resolve_config(env="CartPole-v1", lstm_size=16, eval_episodes=0, no_progress=True, num_workers=0,
                                     max_steps=200, run_dir=str(tmp_path / "run"))
    assert cfg.preset == "vector" and cfg.lr != Config().lr
    cfg.lr = Config().lr  # the reference's value: dropped as "not given" until the API stopped going through argv
    cfg.normalize_reward = False
    assert hogwild_a3c.train(cfg).ok
    assert json.loads((tmp_path / "run" / "config.json").read_text()) == cfg.to_dict()
    again = config_from_dict(json.loads((tmp_path / "run" / "config.json").read_text()), "config.json")
    again.run_dir = str(tmp_path / "again")
    assert hogwild_a3c.train(again).ok
    assert json.loads((tmp_path / "again" / "config.json").read_text()) == again.to_dict()


@pytest.mark.parametrize("settings, expected", [
    (dict(max_steps="abc"), "'max_steps' must be an integer or null (got 'abc')"),
    (dict(lr=[1]), "'lr' must be a number (got [1])"),
    (dict(env=None), "'env' must be a string (got None)"),
    (dict(normalize_obs=1), "'normalize_obs' must be true or false (got 1)"),
    (dict(progress=False, no_progress=False), "give progress= or no_progress=, not both"),
])
def test_settings_of_the_wrong_type_raise_value_error(tmp_path, settings, expected):
    with pytest.raises(ValueError, match=re.escape(expected)):
        hogwild_a3c.train(**{"env": "CartPole-v1", **settings}, run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.timeout(120)
def test_a_script_without_the_main_guard_gets_one_error_and_no_extra_runs(tmp_path):
    """The spawn trap: every child imports the main script again. Without the guard each child
    used to start a run of its own, each in a new folder."""
    script = tmp_path / "train_it.py"
    script.write_text(
        "import hogwild_a3c\n"
        "result = hogwild_a3c.train(env='CartPole-v1', lstm_size=16, num_workers=1, eval_episodes=0,"
        " max_steps=100000, progress=False)\n"
        "print('RESULT', result.exit_code)\n"
    )
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=100,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert "put the call under `if __name__ == \"__main__\":`" in proc.stderr, proc.stderr[-3000:]
    assert "RESULT 1" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    assert len(list((tmp_path / "runs" / "CartPole-v1").iterdir())) == 1  # the parent's run, no child's


def test_a_nan_observation_is_refused_not_played_as_action_0(tmp_path):
    cfg = Config(env="CartPole-v1", lstm_size=8)
    model = build_model((4,), 2, cfg)
    save_checkpoint(tmp_path, {"model": model.state_dict(), "config": cfg.to_dict(), "global_step": 0}, 0)
    policy = hogwild_a3c.load_policy(tmp_path / "latest.pt")
    state = policy.initial_state()
    policy.act(np.zeros(4), state)
    with pytest.raises(ValueError, match=r"observation holds NaN at index \(2,\)"):
        policy.act(np.array([0.0, 0.0, np.nan, 0.0]), state)
    with pytest.raises(ValueError, match="observation holds inf"):
        policy.act(np.array([np.inf, 0.0, 0.0, 0.0]), state)
