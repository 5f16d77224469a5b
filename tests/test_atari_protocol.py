"""The Atari protocol on real ALE games: max over the last two frames of each repeat, FIRE after
a reset and a lost life, a lost life as a learning boundary, rewards clipped for learning only."""
import gymnasium as gym
import numpy as np
import pytest
import torch

from hogwild_a3c.children.reports import InProcessReports
from hogwild_a3c.children.shared import HogwildLink, SharedState
from hogwild_a3c.children.worker import Worker
from hogwild_a3c.config import Config
from hogwild_a3c.envs.make import AtariSteps, EnvSpecError, describe_env, env_options, make_env, register_atari
from hogwild_a3c.learning.model import build_model
from hogwild_a3c.learning.optim import LrSchedule

register_atari()
NOOP, FIRE = 0, 1


def test_max_pool_is_the_max_of_the_last_two_frames_of_each_repeat():
    # The slow reference: four gym steps of a frameskip-1 env, max of the 3rd and 4th frames.
    reference = gym.make("ALE/SpaceInvaders-v5", obs_type="grayscale", frameskip=1, repeat_action_probability=0.0)
    pooled = AtariSteps(gym.make("ALE/SpaceInvaders-v5", obs_type="grayscale", frameskip=1,
                                 repeat_action_probability=0.0), skip=4, max_pool=True, fire_reset=False)
    ref_obs, _ = reference.reset(seed=3)
    obs, _ = pooled.reset(seed=3)
    np.testing.assert_array_equal(obs, ref_obs)
    actions = np.random.default_rng(0).integers(0, 6, 300)
    differs_from_last = 0
    for step, action in enumerate(actions):
        frames, ref_reward, ended = [], 0.0, False
        for _ in range(4):
            frame, reward, terminated, truncated, _ = reference.step(int(action))
            frames.append(frame)
            ref_reward += reward
            if terminated or truncated:
                ended = True
                break
        obs, reward, terminated, truncated, info = pooled.step(int(action))
        expected = np.maximum(frames[-2], frames[-1]) if len(frames) > 1 and not ended else frames[-1]
        np.testing.assert_array_equal(obs, expected, err_msg=f"step {step}")
        assert reward == ref_reward and (terminated or truncated) == ended
        assert info["lives"] == reference.unwrapped.ale.lives()
        differs_from_last += bool((obs != frames[-1]).any())
        if ended:
            break
    # The point of it: in SpaceInvaders the last frame alone misses what the frame before drew.
    assert differs_from_last > 100


def test_max_pool_keeps_the_time_limit_in_agent_steps():
    env = make_env("ALE/Breakout-v5", {"max_episode_steps": 7}, max_pool=True)
    env.reset(seed=0)
    ends = [env.step(NOOP)[3] for _ in range(7)]
    assert ends == [False] * 6 + [True]


def test_max_pool_refuses_a_random_frameskip_in_one_line():
    with pytest.raises(EnvSpecError, match="--max-pool needs a fixed frameskip"):
        describe_env("ALE/Breakout-v5", {"frameskip": (2, 5)}, max_pool=True)


def noop_until_lives_lost(env, steps):
    env.reset(seed=0)
    lost, ended = [], False
    for _ in range(steps):
        _, _, terminated, truncated, info = env.step(NOOP)
        lost.append(info["life_lost"])
        if terminated or truncated:
            ended = True
            break
    return sum(lost), ended


def test_fire_reset_launches_breakouts_ball_after_a_reset_and_after_each_lost_life():
    kwargs = {"repeat_action_probability": 0.0}
    # Without FIRE the ball never comes: NOOPs lose no life.
    assert noop_until_lives_lost(make_env("ALE/Breakout-v5", kwargs), 400) == (0, False)
    # With it, NOOPs miss every ball: four lives lost, the fifth ends the game.
    lost, ended = noop_until_lives_lost(make_env("ALE/Breakout-v5", kwargs, fire_reset=True), 2000)
    assert (lost, ended) == (4, True)


def worker_on(env, **settings):
    cfg = Config(env=env, num_workers=0, envs_per_worker=2, rollout_steps=20, lstm_size=8, **settings)
    info = describe_env(cfg.env, cfg.env_kwargs, **env_options(cfg))
    torch.manual_seed(0)
    shared = SharedState.create(build_model(info.obs_shape, info.distribution, 8), 1, "adam", LrSchedule(1e-3))
    reports = InProcessReports()
    return Worker(0, cfg, info, HogwildLink(shared, 0, reports), seed=1), reports


def test_a_lost_life_cuts_the_targets_but_not_the_game_or_the_lstm_state():
    worker, _ = worker_on("ALE/Breakout-v5", life_loss=True, fire_reset=True)
    lives = [env.unwrapped.ale.lives() for env in worker.envs]
    for _ in range(60):
        returns_before = worker.episode_return.copy()
        rollout = worker.collect()
        for t, k in zip(*np.nonzero(rollout.dones)):
            assert rollout.done_values[t, k] == 0.0
            if t + 1 < rollout.dones.shape[0]:
                assert not rollout.resets[t + 1, k], "a lost life zeroed the LSTM state"
        now = [env.unwrapped.ale.lives() for env in worker.envs]
        lost = [k for k, (n, before) in enumerate(zip(now, lives)) if 0 < n < before]
        if lost and rollout.dones[:, lost].any() and not rollout.resets.any():  # the game went on
            k = lost[0]
            # the episode's return went on (Breakout's rewards are >= 0), and so did the LSTM state
            assert worker.episode_return[k] >= returns_before[k] and worker.episode_length[k] > rollout.dones.shape[0]
            assert worker.state[0][:, k].abs().sum() > 0 and worker.state[1][:, k].abs().sum() > 0
            return
        lives = now
    pytest.fail("no life was lost in 60 rollouts of random play")


def test_rewards_are_clipped_for_learning_and_returns_stay_raw():
    worker, reports = worker_on("ALE/SpaceInvaders-v5", clip_reward=True)
    for _ in range(40):
        before = worker.episode_return.copy()
        rollout = worker.collect()
        assert rollout.rewards.max() <= 1.0
        grew = worker.episode_return - before
        if (grew > 1.0).any():  # a hit pays 5 to 30 points: the return took the raw reward
            assert rollout.rewards.max() == 1.0
            return
    pytest.fail("no reward above 1 in 40 rollouts of random play")
