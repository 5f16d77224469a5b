"""The action-distribution seam: Categorical against the sampler it replaced and against
torch.distributions; the kind chosen for an action space, and the one line for a space no kind takes."""
import gymnasium as gym
import numpy as np
import pytest
import torch

from hogwild_a3c.envs.make import EnvSpecError, describe_env
from hogwild_a3c.learning.distributions import Categorical, UnsupportedActions, choose, distribution_for


def sample_actions_before_the_seam(logits, rng):
    """model.sample_actions as it was at bb4b8e3, the reference for bit-identical sampling."""
    probs = torch.softmax(logits, dim=-1).numpy().astype(np.float64)
    cdf = np.cumsum(probs, axis=1)
    draws = rng.random((len(cdf), 1)) * cdf[:, -1:]
    return np.minimum((cdf < draws).sum(axis=1), cdf.shape[1] - 1)


def logits_like_a_run(rows=8, actions=6, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, actions, generator=generator) * 3


def test_categorical_draws_the_same_actions_as_before_from_the_same_generator():
    mine, reference = np.random.default_rng(7), np.random.default_rng(7)
    for step in range(500):
        logits = logits_like_a_run(seed=step)
        logits[step % 8, :] = torch.tensor([-1e9, 50.0, -1e9, 0.0, 0.0, 0.0])  # near-certain rows too
        actions, _ = Categorical(6).sample(logits, mine)
        np.testing.assert_array_equal(actions, sample_actions_before_the_seam(logits, reference))
    assert mine.random() == reference.random()  # the generator advanced exactly as before


def test_the_behaviour_log_probability_is_that_of_the_drawn_action():
    logits = logits_like_a_run()
    actions, log_probs = Categorical(6).sample(logits, np.random.default_rng(1))
    expected = torch.distributions.Categorical(logits=logits).log_prob(torch.from_numpy(actions))
    assert log_probs.dtype == np.float32
    np.testing.assert_allclose(log_probs, expected.numpy(), rtol=1e-5, atol=1e-6)


def test_log_prob_entropy_and_mode_against_torch_distributions():
    logits = logits_like_a_run(rows=32)
    actions = torch.arange(32) % 6
    reference = torch.distributions.Categorical(logits=logits)
    categorical = Categorical(6)
    torch.testing.assert_close(categorical.log_prob(logits, actions), reference.log_prob(actions))
    torch.testing.assert_close(categorical.entropy(logits), reference.entropy())
    log_probs, entropies = categorical.evaluate(logits, actions)
    torch.testing.assert_close(log_probs, reference.log_prob(actions))
    torch.testing.assert_close(entropies, reference.entropy())
    np.testing.assert_array_equal(categorical.mode(logits), logits.argmax(-1).numpy())
    np.testing.assert_array_equal(choose(categorical, logits, np.random.default_rng(0), greedy=True),
                                  logits.argmax(-1).numpy())


def test_evaluate_is_differentiable_and_its_gradient_is_torchs():
    logits = logits_like_a_run().requires_grad_()
    actions = torch.arange(8) % 6
    log_probs, entropies = Categorical(6).evaluate(logits, actions)
    (log_probs.sum() + entropies.sum()).backward()
    mine = logits.grad.clone()
    logits.grad = None
    reference = torch.distributions.Categorical(logits=logits)
    (reference.log_prob(actions).sum() + reference.entropy().sum()).backward()
    torch.testing.assert_close(mine, logits.grad)


def test_each_action_space_gets_its_kind_and_the_env_gets_its_own_action_type():
    categorical = distribution_for(gym.spaces.Discrete(4))
    assert categorical == Categorical(4) and categorical.param_size == 4
    action = categorical.env_action(np.int64(3))
    assert action == 3 and type(action) is int


def test_a_space_no_kind_takes_is_one_line_naming_what_would_do():
    with pytest.raises(UnsupportedActions) as caught:
        distribution_for(gym.spaces.Dict({"a": gym.spaces.Discrete(2)}))
    assert "\n" not in str(caught.value) and "Categorical (Discrete)" in str(caught.value)
    with pytest.raises(EnvSpecError) as caught:
        describe_env("Pendulum-v1")
    assert str(caught.value).startswith("--env 'Pendulum-v1': action space Box(") and "\n" not in str(caught.value)


def test_a_second_kind_is_one_class_the_model_and_the_start_up_trial_take():
    """A stand-in second kind (two Bernoulli actions, MultiBinary(2)): registered with one class,
    the env's space picks it, the model's head is sized by it, and the start-up trial (one acting
    step, one learn step) runs with its array-shaped actions."""
    from torch import nn

    from hogwild_a3c.config import Config
    from hogwild_a3c.learning import distributions
    from hogwild_a3c.learning.learner import trial_update_problem
    from hogwild_a3c.learning.model import build_model

    @distributions.action_kind
    class TwoCoins:
        serves, action_shape, action_dtype, param_size = "MultiBinary(2)", (2,), np.int64, 2

        @staticmethod
        def takes(space):
            return isinstance(space, gym.spaces.MultiBinary) and space.n == 2

        @classmethod
        def of(cls, space):
            return cls()

        def head(self, in_features):
            return nn.Linear(in_features, 2)

        def _bernoulli(self, params):
            return torch.distributions.Bernoulli(logits=params)

        def sample(self, params, rng):
            actions = (rng.random(params.shape) < torch.sigmoid(params).numpy()).astype(np.int64)
            return actions, self.log_prob(params, torch.from_numpy(actions)).numpy()

        def mode(self, params):
            return (params > 0).long().numpy()

        def log_prob(self, params, actions):
            return self._bernoulli(params).log_prob(actions.float()).sum(-1)

        def entropy(self, params):
            return self._bernoulli(params).entropy().sum(-1)

        def evaluate(self, params, actions):
            return self.log_prob(params, actions), self.entropy(params)

        def env_action(self, action):
            return np.asarray(action, dtype=np.int8)

    try:
        kind = distribution_for(gym.spaces.MultiBinary(2))
        assert isinstance(kind, TwoCoins)
        model = build_model((4,), kind, Config(lstm_size=8, hidden_size=8))
        assert model.action_head.out_features == 2
        assert trial_update_problem(model, Config()) is None
    finally:
        distributions._KINDS.remove(TwoCoins)
