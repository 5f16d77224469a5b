"""Every action space a distribution takes, end to end: toy Box, MultiDiscrete and MultiBinary envs
learned to a threshold with no flags but --env; resume, act, evaluate and MP4 on each; ONNX Runtime acting with a
Gaussian head whose log-std is a free parameter; the preset --preset auto picks, said in train.log;
action spaces no distribution takes refused in one line before anything is written."""
import json

import gymnasium as gym
import numpy as np
import pandas as pd
import pytest
import torch

import tests.envs  # noqa: F401 - registers the test envs
from hogwild_a3c import train
from hogwild_a3c.acting.actor import resolve
from hogwild_a3c.acting.onnx_backend import OnnxRuntimeActor
from hogwild_a3c.api import load_policy
from hogwild_a3c.children.reports import InProcessReports
from hogwild_a3c.children.shared import HogwildLink, SharedState
from hogwild_a3c.children.worker import Worker
from hogwild_a3c.config import Config
from hogwild_a3c.envs.make import describe_env
from hogwild_a3c.learning.distributions import Gaussian
from hogwild_a3c.learning.model import model_for_env
from hogwild_a3c.learning.optim import LrSchedule
from tests.helpers import one_error_line


def evaluations(run_dir):
    return pd.read_csv(run_dir / "eval.csv").groupby("global_step")["episode_return"].mean()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("env, target", [
    # Uniform random actions return about -21; a policy that learned nothing beyond the mean, -15.
    ("tests.envs:TargetBox-v0", -3.0),
    # Random actions return about 5.8, the best 20.
    ("tests.envs:TargetParts-v0", 17.0),
    # Random actions return about 20, the best 40.
    ("tests.envs:TargetBits-v0", 36.0),
])
def test_a_toy_env_of_each_new_action_space_is_learned_with_no_flags(tmp_path, env, target):
    run_dir = tmp_path / "run"
    assert train.main(["--env", env, "--num-workers", "2", "--max-seconds", "150", "--eval-interval", "3",
                       "--eval-episodes", "20", "--target-return", str(target), "--no-progress",
                       "--run-dir", str(run_dir)]) == 0
    assert evaluations(run_dir).max() >= target, evaluations(run_dir).to_dict()
    assert json.loads((run_dir / "meta.json").read_text())["sessions"][-1]["ended"] == "target_return"


def test_a_box_run_resumes_evaluates_and_records_with_the_envs_own_actions(tmp_path, capsys):
    from hogwild_a3c import evaluate

    run_dir = tmp_path / "run"
    common = ["--num-workers", "0", "--eval-episodes", "0", "--no-progress"]
    assert train.main(["--env", "Pendulum-v1", "--max-steps", "4000", "--run-dir", str(run_dir), *common]) == 0
    log = (run_dir / "train.log").read_text()
    assert "settings from preset continuous (what --preset auto picks for Box actions" in log
    assert train.main(["--resume", str(run_dir), "--max-steps", "8000", *common[:2]]) == 0
    assert pd.read_csv(run_dir / "progress.csv")["global_step"].iloc[-1] >= 8000
    policy = load_policy(run_dir)
    assert isinstance(policy.model.distribution, Gaussian)
    env = policy.make_env()
    obs, _ = env.reset(seed=0)
    state = policy.initial_state()
    action, state = policy.act(obs, state, greedy=True)
    assert isinstance(action, np.ndarray) and action.dtype == np.float32 and env.action_space.contains(action)
    again, _ = policy.act(obs, policy.initial_state(), greedy=True)
    np.testing.assert_array_equal(action, again)  # greedy plays the mean
    capsys.readouterr()
    assert evaluate.main([str(run_dir), "--episodes", "2", "--greedy", "--record", str(tmp_path / "video")]) == 0
    assert "mean return over 2 episodes" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "video").iterdir()) == ["episode-1.mp4", "episode-2.mp4"]
    assert all(p.stat().st_size > 1000 for p in (tmp_path / "video").iterdir())


def test_onnx_runtime_acts_for_an_image_model_with_a_free_log_std_and_its_log_probabilities_are_torchs():
    cfg = Config(env="tests.envs:ImageBox-v0", num_workers=0, envs_per_worker=2, rollout_steps=5, lstm_size=16,
                 normalize_obs=True, act_backend="onnxruntime")
    info = describe_env(cfg.env, cfg.env_kwargs)
    model = model_for_env(info, cfg)
    assert isinstance(model.distribution, Gaussian) and model.distribution.std_source == "free"
    # A fallback to torch would be silent in the run but not here: auto must take ONNX Runtime.
    assert resolve("auto", model)[0] == "onnxruntime"
    torch.manual_seed(0)
    shared = SharedState.create(model_for_env(info, cfg), 1, "adam", LrSchedule(1e-3))
    with torch.no_grad():  # a log-std the graph must read, not the zeros it starts at
        shared.model.action_head.log_std.copy_(torch.tensor([-0.5, 0.2, 0.7]))
    worker = Worker(0, cfg, info, HogwildLink(shared, 0, InProcessReports()), seed=1)
    assert isinstance(worker.actor, OnnxRuntimeActor)
    worker.link.pull(worker.model)
    rollout = worker.collect()
    with torch.no_grad():
        params, values = worker.model.replay(torch.from_numpy(rollout.obs), rollout.start_state,
                                             torch.from_numpy(rollout.resets))
    expected = worker.model.distribution.log_prob(params, torch.from_numpy(rollout.actions))
    assert np.abs(rollout.log_probs - expected.numpy()).max() <= 1e-4
    torch.testing.assert_close(params[..., 3:], torch.tensor([-0.5, 0.2, 0.7]).expand(5, 2, 3))
    assert worker.run_rollout() == 10


@pytest.mark.parametrize("env_id, words", [
    ("tests.envs:DictAction-v0", "action space Dict("),
    ("tests.envs:IntegerBox-v0", "action space Box(0, 5, (2,), int64)"),
])
def test_an_action_space_no_distribution_takes_is_one_line_and_nothing_is_written(tmp_path, capsys, env_id, words):
    run_dir = tmp_path / "run"
    assert train.main(["--env", env_id, "--num-workers", "1", "--run-dir", str(run_dir)]) != 0
    line = one_error_line(capsys)
    assert words in line and "Gaussian (Box of floats)" in line
    assert not run_dir.exists()


def test_the_evaluator_plays_a_gaussian_policy_at_its_mean_and_a_categorical_one_sampled():
    from hogwild_a3c.children.evaluator import play_episodes
    from hogwild_a3c.envs.make import make_env

    def returns(env_id, rng_seed):
        cfg = Config(env=env_id, core="mlp", hidden_size=8)
        info = describe_env(cfg.env)
        torch.manual_seed(0)
        model = model_for_env(info, cfg)
        envs = [make_env(env_id) for _ in range(2)]
        for k, env in enumerate(envs):
            env.reset(seed=k)
        return play_episodes(model, envs, np.random.default_rng(rng_seed), 4)

    # Each env shows the targets its seed draws, and the mean action is the same whatever the generator.
    assert returns("tests.envs:TargetBox-v0", 1) == returns("tests.envs:TargetBox-v0", 2)
    assert returns("CartPole-v1", 1) != returns("CartPole-v1", 2)


@pytest.mark.parametrize("space", [
    gym.spaces.Box(-1.0, 1.0, (3,), np.float32),
    gym.spaces.MultiDiscrete([3, 4]),
    gym.spaces.MultiBinary(5),
], ids=["Box", "MultiDiscrete", "MultiBinary"])
def test_onnx_runtime_acts_for_an_image_model_of_every_new_kind(space):
    from hogwild_a3c.acting.onnx_backend import trial_difference
    from hogwild_a3c.learning.distributions import distribution_for
    from hogwild_a3c.learning.model import build_model

    torch.manual_seed(0)
    model = build_model((3, 24, 24), distribution_for(space), Config(lstm_size=16, normalize_obs=True))
    assert resolve("auto", model)[0] == "onnxruntime"
    assert trial_difference(model, batch=4) <= 1e-5


@pytest.mark.parametrize("env_id, shape, dtype", [("tests.envs:TargetParts-v0", (2,), np.int64),
                                                   ("tests.envs:TargetBits-v0", (4,), np.int8)],
                         ids=["MultiDiscrete", "MultiBinary"])
def test_a_multi_part_policy_resumes_acts_evaluates_and_records_with_the_envs_own_actions(tmp_path, capsys, env_id,
                                                                                        shape, dtype):
    from hogwild_a3c import evaluate

    run_dir = tmp_path / "run"
    common = ["--num-workers", "0", "--eval-episodes", "0", "--no-progress"]
    assert train.main(["--env", env_id, "--max-steps", "2000", "--run-dir", str(run_dir), *common]) == 0
    # a resume imports only the module its command line names
    assert train.main(["--resume", str(run_dir), "--env", env_id, "--max-steps", "4000", *common[:2]]) == 0
    assert pd.read_csv(run_dir / "progress.csv")["global_step"].iloc[-1] >= 4000
    policy = load_policy(run_dir, env=env_id)  # a checkpoint imports no code by itself
    env = policy.make_env()
    obs, _ = env.reset(seed=0)
    action, _ = policy.act(obs, policy.initial_state(), greedy=True)
    assert env.action_space.contains(action) and action.shape == shape and action.dtype == dtype
    capsys.readouterr()
    video = tmp_path / "video"
    assert evaluate.main([str(run_dir), "--episodes", "2", "--env", env_id, "--record", str(video)]) == 0
    assert "mean return over 2 episodes" in capsys.readouterr().out
    assert sorted(p.name for p in video.iterdir()) == ["episode-1.mp4", "episode-2.mp4"]
    assert all(p.stat().st_size > 500 for p in video.iterdir())
