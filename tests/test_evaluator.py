"""The evaluator plays an evaluation's episodes side by side (one forward a step for all of
them): each episode must be the one the policy plays alone, and every episode started is
played to its end."""
import gymnasium as gym
import numpy as np
import pytest
import torch

from hogwild_a3c.children.evaluator import play_episode, play_episodes
from hogwild_a3c.config import Config
from hogwild_a3c.envs.make import describe_env
from hogwild_a3c.learning.lstm_watch import LstmWatch
from hogwild_a3c.learning.model import build_model


class FirstAction:
    """A generator whose every draw is 0: `Categorical.sample` then picks action 0 whatever the
    logits, so each env's episodes depend on its seed alone and batching cannot change them."""

    def random(self, shape):
        return np.zeros(shape)


class Counted(gym.Wrapper):
    def __init__(self, env):
        super().__init__(env)
        self.resets, self.steps, self.cut = 0, 0, False
        self.running = False

    def reset(self, **kwargs):
        self.cut = self.cut or self.running  # a reset of an episode that had not ended
        self.resets, self.running = self.resets + 1, True
        return self.env.reset(**kwargs)

    def step(self, action):
        out = self.env.step(action)
        self.steps += 1
        self.running = not (out[2] or out[3])
        return out


def cartpole_model():
    cfg = Config(env="CartPole-v1", lstm_size=16)
    info = describe_env(cfg.env)
    torch.manual_seed(0)
    return build_model(info.obs_shape, info.distribution, cfg)


def seeded(seeds):
    envs = [gym.make("CartPole-v1") for _ in seeds]
    for env, seed in zip(envs, seeds):
        env.reset(seed=seed)
    return envs


def test_episodes_side_by_side_end_in_the_states_each_reaches_alone():
    model = cartpole_model()
    alone, lengths = LstmWatch(), []
    for env in seeded([3, 4, 5]):  # each env's first two episodes, played alone
        for _ in range(2):
            played = play_episode(model, env, FirstAction(), on_state=alone.observe)
            alone.episode_ended()
            lengths.append(played[1])
    # No episode twice as long as another: side by side, each env then plays exactly two of the six.
    assert max(lengths) < 2 * min(lengths)
    side_by_side = LstmWatch()
    results = play_episodes(model, seeded([3, 4, 5]), FirstAction(), 6, watch=side_by_side)
    assert sorted(length for _, length in results) == sorted(lengths)
    assert side_by_side.steps == alone.steps == sum(lengths)
    # Each episode's own LSTM state, zeroed at its start: the same final cells, up to batching's rounding.
    assert np.allclose(sorted(side_by_side.cells), sorted(alone.cells), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("episodes", [1, 3, 7])
def test_every_episode_started_is_played_to_its_end(episodes):
    envs = [Counted(env) for env in seeded([0, 1, 2])]
    for env in envs:
        env.resets, env.running = 0, False  # the seeding reset above is not an episode
    results = play_episodes(cartpole_model(), envs, np.random.default_rng(0), episodes)
    assert len(results) == episodes
    assert sum(env.resets for env in envs) == episodes
    assert not any(env.cut or env.running for env in envs)
    assert sum(env.steps for env in envs) == sum(length for _, length in results)


def test_a_stop_request_ends_the_evaluation_with_none():
    calls = []
    result = play_episodes(cartpole_model(), seeded([0, 1]), np.random.default_rng(0), 1000,
                           should_stop=lambda: calls.append(1) or True)
    assert result is None and calls == [1]
