"""The action-distribution seam: Categorical against the sampler it replaced and against
torch.distributions; the kind chosen for an action space, and the one line for a space no kind takes."""
import gymnasium as gym
import numpy as np
import pytest
import torch

import tests.envs  # noqa: F401 - registers the test envs
from hogwild_a3c.envs.make import EnvSpecError, describe_env
from hogwild_a3c.learning.distributions import (
    LOG_STD_FLOOR,
    Bernoulli,
    Categorical,
    Gaussian,
    MultiCategorical,
    UnsupportedActions,
    choose,
    distribution_for,
)


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
    for env_id, space in [("tests.envs:DictAction-v0", "Dict("),
                          ("tests.envs:IntegerBox-v0", "Box(0, 5, (2,), int64)")]:
        with pytest.raises(EnvSpecError) as caught:
            describe_env(env_id)
        line = str(caught.value)
        assert line.startswith(f"--env '{env_id}': action space {space}") and "\n" not in line
        assert "Gaussian (Box of floats)" in line and "MultiCategorical (MultiDiscrete)" in line


def test_a_second_kind_is_one_class_the_model_and_the_start_up_trial_take():
    """A stand-in kind (two Bernoulli actions on a Box of two integers 0-1, which no kind here
    takes): registered with one class, the env's space picks it, the model's head is sized by it,
    and the start-up trial (one acting step, one learn step) runs with its array-shaped actions."""
    from torch import nn

    from hogwild_a3c.config import Config
    from hogwild_a3c.learning import distributions
    from hogwild_a3c.learning.learner import trial_update_problem
    from hogwild_a3c.learning.model import build_model

    @distributions.action_kind
    class TwoCoins:
        serves, action_shape, action_dtype, param_size = "Box(0, 1, (2,), int64)", (2,), np.int64, 2
        evaluated_at_mode = False

        @staticmethod
        def takes(space):
            return isinstance(space, gym.spaces.Box) and space.dtype == np.int64 and space.shape == (2,)

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
            return np.asarray(action, dtype=np.int64)

        def for_settings(self, arch):
            return self

    try:
        kind = distribution_for(gym.spaces.Box(0, 1, (2,), np.int64))
        assert isinstance(kind, TwoCoins)
        model = build_model((4,), kind, Config(lstm_size=8, hidden_size=8))
        assert model.action_head.out_features == 2
        assert trial_update_problem(model, Config()) is None
    finally:
        distributions._KINDS.remove(TwoCoins)


# -- Gaussian (Box), MultiCategorical (MultiDiscrete), Bernoulli (MultiBinary) -------------------

def gaussian_params(rows=16, dims=3, seed=0, log_std_scale=1.0):
    generator = torch.Generator().manual_seed(seed)
    mean = torch.randn(rows, dims, generator=generator) * 2
    log_std = torch.randn(rows, dims, generator=generator) * log_std_scale
    return torch.cat([mean, log_std], -1)


def test_gaussian_log_prob_and_entropy_are_torchs_normal_summed_over_dimensions():
    gaussian = distribution_for(gym.spaces.Box(-1.0, 1.0, (3,), np.float32))
    assert isinstance(gaussian, Gaussian) and gaussian.param_size == 6 and gaussian.action_shape == (3,)
    params = gaussian_params().requires_grad_()
    actions = torch.randn(16, 3) * 3  # beyond the bounds too: stored actions are never clipped
    mean, log_std = params.detach().split(3, -1)
    # Above the floor the floored log-std is the raw one within float32's rounding.
    reference = torch.distributions.Normal(mean, torch.exp(gaussian.split(params.detach())[1]))
    log_probs, entropies = gaussian.evaluate(params, actions)
    torch.testing.assert_close(log_probs, reference.log_prob(actions).sum(-1))
    torch.testing.assert_close(entropies, reference.entropy().sum(-1))
    torch.testing.assert_close(gaussian.split(params.detach())[1], log_std, atol=1e-4, rtol=0)
    (log_probs.sum() + entropies.sum()).backward()
    assert torch.isfinite(params.grad).all() and params.grad.abs().sum() > 0
    np.testing.assert_allclose(gaussian.mode(params), mean.numpy())


def test_a_gaussian_draws_with_its_own_std_and_stores_the_log_probability_of_what_it_stored():
    gaussian = Gaussian(np.full(2, -1.0), np.full(2, 1.0), (2,))
    params = torch.tensor([[0.5, -0.5, np.log(0.3), np.log(2.0)]]).repeat(20_000, 1)
    actions, log_probs = gaussian.sample(params, np.random.default_rng(3))
    assert actions.dtype == np.float32 and log_probs.dtype == np.float32
    np.testing.assert_allclose(actions.mean(0), [0.5, -0.5], atol=0.05)
    np.testing.assert_allclose(actions.std(0), [0.3, 2.0], rtol=0.03)
    expected = gaussian.log_prob(params, torch.from_numpy(actions)).numpy()
    np.testing.assert_allclose(log_probs, expected, rtol=1e-5, atol=1e-4)
    assert (np.abs(actions) > 1).any()  # stored as drawn, beyond the bounds


def test_only_the_copy_handed_to_the_env_is_clipped_and_scaled_onto_the_bounds():
    gaussian = distribution_for(gym.spaces.Box(np.float32([-2.0, 0.0]), np.float32([2.0, 10.0]), dtype=np.float32))
    stored = np.array([1.7, -0.5], np.float32)
    kept = stored.copy()
    sent = gaussian.env_action(stored)
    np.testing.assert_allclose(sent, [2.0, 2.5])  # [-1, 1] onto [low, high], clipped first
    assert sent.dtype == np.float32 and sent.shape == (2,)
    np.testing.assert_array_equal(stored, kept)  # the stored action is untouched
    np.testing.assert_allclose(gaussian.env_action(np.array([-1.0, 1.0])), [-2.0, 10.0])


def test_a_box_with_infinite_bounds_is_acted_in_its_own_units_and_a_box_of_any_rank_is_flattened():
    unbounded = distribution_for(gym.spaces.Box(-np.inf, np.inf, (2, 2), np.float64))
    assert unbounded.param_size == 8 and unbounded.action_shape == (4,)
    sent = unbounded.env_action(np.array([-7.0, 0.5, 3.0, 100.0]))
    assert sent.shape == (2, 2) and sent.dtype == np.float64
    np.testing.assert_array_equal(sent, [[-7.0, 0.5], [3.0, 100.0]])
    half = distribution_for(gym.spaces.Box(np.float32([0.0, -np.inf]), np.float32([np.inf, 1.0]), dtype=np.float32))
    np.testing.assert_array_equal(half.env_action(np.array([-3.0, 5.0])), [0.0, 1.0])  # its finite bound only


def test_the_std_has_a_floor_that_keeps_every_number_finite_and_a_gradient_through_it():
    gaussian = Gaussian(np.full(1, -1.0), np.full(1, 1.0), (1,))
    params = torch.tensor([[0.0, -1e4], [0.0, -5.5], [0.0, 1e4]], requires_grad=True)
    actions = torch.tensor([[0.3], [0.1], [5.0]])
    log_probs, entropies = gaussian.evaluate(params, actions)
    assert torch.isfinite(log_probs).all() and torch.isfinite(entropies).all()
    assert gaussian.split(params)[1][0].item() == pytest.approx(LOG_STD_FLOOR)
    (log_probs.sum() + entropies.sum()).backward()
    assert torch.isfinite(params.grad).all() and params.grad[1, 1] != 0  # pushed below the floor: a gradient still
    drawn, drawn_log_probs = gaussian.sample(params.detach(), np.random.default_rng(0))
    assert np.isfinite(drawn).all() and np.isfinite(drawn_log_probs).all()


def test_the_state_dependent_std_is_a_second_output_of_the_head_and_the_free_one_a_parameter():
    from hogwild_a3c.config import Config
    from hogwild_a3c.learning.model import build_model

    space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    free = build_model((4,), distribution_for(space), Config(core="mlp", hidden_size=8))
    state = build_model((4,), distribution_for(space), Config(core="mlp", hidden_size=8, action_std="state"))
    assert free.action_head.out_features == 3 and free.action_head.log_std.shape == (3,)
    assert state.action_head.out_features == 6 and not hasattr(state.action_head, "log_std")
    obs = torch.randn(5, 4)
    with torch.no_grad():
        free.action_head.log_std.copy_(torch.tensor([0.1, -0.2, 0.3]))
        params = free.step(obs, free.initial_state(5))[0]
    torch.testing.assert_close(params[:, 3:], torch.tensor([[0.1, -0.2, 0.3]]).expand(5, 3))
    assert state.step(obs, state.initial_state(5))[0].shape == (5, 6)


def multi_discrete_reference(logits, sizes):
    return [torch.distributions.Categorical(logits=part) for part in logits.split(sizes, -1)]


def test_multi_discrete_log_prob_and_entropy_are_the_sums_of_torchs_categoricals():
    space = gym.spaces.MultiDiscrete([3, 5, 2])
    kind = distribution_for(space)
    assert isinstance(kind, MultiCategorical) and kind.param_size == 10 and kind.action_shape == (3,)
    logits = logits_like_a_run(rows=12, actions=10)
    actions, log_probs = kind.sample(logits, np.random.default_rng(4))
    assert actions.dtype == np.int64 and ((actions >= 0) & (actions < [3, 5, 2])).all()
    parts = multi_discrete_reference(logits, [3, 5, 2])
    expected = sum(part.log_prob(torch.from_numpy(actions[:, i])) for i, part in enumerate(parts))
    np.testing.assert_allclose(log_probs, expected.numpy(), rtol=1e-5, atol=1e-5)
    chosen, entropies = kind.evaluate(logits, torch.from_numpy(actions))
    torch.testing.assert_close(chosen, expected)
    torch.testing.assert_close(entropies, sum(part.entropy() for part in parts))
    torch.testing.assert_close(kind.entropy(logits), entropies)
    np.testing.assert_array_equal(kind.mode(logits), np.stack([p.probs.argmax(-1).numpy() for p in parts], -1))


def test_multi_discrete_with_a_start_and_a_shape_hands_the_env_its_own_values():
    kind = distribution_for(gym.spaces.MultiDiscrete(np.array([[2, 3], [4, 5]]), start=np.array([[1, -1], [0, 10]])))
    assert kind.param_size == 14 and kind.action_shape == (4,)
    sent = kind.env_action(np.array([1, 0, 3, 4]))
    np.testing.assert_array_equal(sent, [[2, -1], [3, 14]])
    assert gym.spaces.MultiDiscrete(np.array([[2, 3], [4, 5]]), start=np.array([[1, -1], [0, 10]])).contains(sent)


def test_multi_binary_log_prob_and_entropy_are_torchs_bernoullis_summed():
    kind = distribution_for(gym.spaces.MultiBinary([2, 3]))
    assert isinstance(kind, Bernoulli) and kind.param_size == 6
    logits = logits_like_a_run(rows=10, actions=6)
    logits[0, 0], logits[1, 1] = 80.0, -80.0  # near-certain coins stay finite
    actions, log_probs = kind.sample(logits, np.random.default_rng(5))
    reference = torch.distributions.Bernoulli(logits=logits)
    expected = reference.log_prob(torch.from_numpy(actions).float()).sum(-1)
    np.testing.assert_allclose(log_probs, expected.numpy(), rtol=1e-5, atol=1e-5)
    chosen, entropies = kind.evaluate(logits, torch.from_numpy(actions))
    torch.testing.assert_close(chosen, expected)
    torch.testing.assert_close(entropies, reference.entropy().sum(-1))
    sent = kind.env_action(actions[0])
    assert sent.shape == (2, 3) and gym.spaces.MultiBinary([2, 3]).contains(sent)


def test_every_kind_survives_a_pickle_and_equal_spaces_give_equal_kinds():
    import pickle

    for space in [gym.spaces.Discrete(3), gym.spaces.Box(-1.0, 2.0, (2,), np.float32), gym.spaces.MultiDiscrete([2, 3]),
                  gym.spaces.MultiBinary(4)]:
        kind = distribution_for(space)
        assert pickle.loads(pickle.dumps(kind)) == kind == distribution_for(space)
        assert hash(kind) == hash(distribution_for(space))


def test_with_tanh_the_copy_sent_is_squashed_and_what_is_stored_and_scored_is_the_draw():
    from hogwild_a3c.config import Config

    space = gym.spaces.Box(np.float32([-2.0, 0.0]), np.float32([2.0, 10.0]), dtype=np.float32)
    squashing = distribution_for(space).for_settings(Config(action_bound="tanh"))
    clipping = distribution_for(space).for_settings(Config())
    draw = np.array([3.0, -0.2], np.float32)
    np.testing.assert_allclose(squashing.env_action(draw), [2.0 * np.tanh(3.0), 5.0 + 5.0 * np.tanh(-0.2)], rtol=1e-6)
    np.testing.assert_allclose(clipping.env_action(draw), [2.0, 4.0], rtol=1e-6)
    params = gaussian_params(rows=4, dims=2)
    actions = torch.from_numpy(np.tile(draw, (4, 1)))
    torch.testing.assert_close(squashing.evaluate(params, actions)[0], clipping.evaluate(params, actions)[0])
    assert squashing != clipping
