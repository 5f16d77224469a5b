import numpy as np
import pytest
import torch

from hogwild_a3c.learning.algo import a3c_loss, discount, rollout_targets, segment_targets


def slow_discount(x, gamma):
    return np.array([sum(gamma**k * x[t + k] for k in range(len(x) - t)) for t in range(len(x))])


def slow_segment(rewards, values, bootstrap, gamma, lam):
    """Returns and GAE by the textbook double sums."""
    n = len(rewards)
    v = list(values) + [bootstrap]
    returns = [sum(gamma**k * rewards[t + k] for k in range(n - t)) + gamma ** (n - t) * bootstrap for t in range(n)]
    deltas = [rewards[t] + gamma * v[t + 1] - v[t] for t in range(n)]
    adv = [sum((gamma * lam) ** k * deltas[t + k] for k in range(n - t)) for t in range(n)]
    return np.array(returns), np.array(adv)


def test_discount_matches_slow_reference():
    rng = np.random.default_rng(0)
    x = rng.normal(size=17)
    np.testing.assert_allclose(discount(x, 0.9), slow_discount(x, 0.9), rtol=1e-10)


def test_discount_equals_the_seeds_lfilter_formula():
    import scipy.signal

    rng = np.random.default_rng(1)
    for x in (rng.normal(size=21), rng.normal(size=(7, 3)), np.zeros(0), np.array([2.5])):
        seed = scipy.signal.lfilter([1.0], [1.0, -0.99], x[::-1], axis=0)[::-1]
        np.testing.assert_allclose(discount(x, 0.99), seed, rtol=1e-12, atol=1e-12)


def test_discount_hand_computed():
    np.testing.assert_allclose(discount(np.array([1.0, 2.0, 3.0]), 0.5), [1 + 1 + 0.75, 2 + 1.5, 3.0])


@pytest.mark.parametrize("lam", [1.0, 0.95, 0.0])
@pytest.mark.parametrize("bootstrap", [0.0, 2.5])
def test_segment_targets_match_slow_reference(lam, bootstrap):
    rng = np.random.default_rng(1)
    rewards, values = rng.normal(size=20), rng.normal(size=20)
    returns, adv = segment_targets(rewards, values, bootstrap, 0.99, lam)
    ref_returns, ref_adv = slow_segment(rewards, values, bootstrap, 0.99, lam)
    np.testing.assert_allclose(returns, ref_returns, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(adv, ref_adv, rtol=1e-5, atol=1e-5)


def test_segment_targets_hand_computed():
    # rewards [1, 0], values [0.5, 0.25], bootstrap 2, gamma 0.5, lambda 1
    returns, adv = segment_targets(np.array([1.0, 0.0]), np.array([0.5, 0.25]), 2.0, 0.5, 1.0)
    np.testing.assert_allclose(returns, [1 + 0 + 0.25 * 2, 0 + 0.5 * 2])
    # lambda = 1: advantage is return minus value
    np.testing.assert_allclose(adv, [1.5 - 0.5, 1.0 - 0.25])


def test_rollout_targets_split_at_episode_ends():
    rng = np.random.default_rng(2)
    steps, envs = 6, 2
    rewards, values = rng.normal(size=(steps, envs)), rng.normal(size=(steps, envs))
    dones = np.zeros((steps, envs), bool)
    done_values = np.zeros((steps, envs))
    dones[2, 0] = True  # env 0: terminated at step 2
    dones[3, 1], done_values[3, 1] = True, 4.0  # env 1: truncated at step 3, V(final obs) = 4
    last = np.array([1.5, -2.0])
    returns, adv = rollout_targets(rewards, values, dones, done_values, last, 0.9, 0.95)
    for k, cut, cut_value in [(0, 3, 0.0), (1, 4, 4.0)]:
        r1, a1 = slow_segment(rewards[:cut, k], values[:cut, k], cut_value, 0.9, 0.95)
        r2, a2 = slow_segment(rewards[cut:, k], values[cut:, k], last[k], 0.9, 0.95)
        np.testing.assert_allclose(returns[:, k], np.concatenate([r1, r2]), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(adv[:, k], np.concatenate([a1, a2]), rtol=1e-5, atol=1e-5)


def test_loss_is_the_seeds_summed_loss():
    torch.manual_seed(0)
    logits = torch.randn(5, 3)
    values = torch.randn(5)
    actions = torch.tensor([0, 2, 1, 1, 0])
    adv, ret = torch.randn(5), torch.randn(5)
    terms = a3c_loss(logits, values, actions, adv, ret, value_coef=0.5, entropy_coef=0.01)
    probs = torch.softmax(logits, -1)
    pi_loss = -sum(torch.log(probs[i, actions[i]]) * adv[i] for i in range(5))
    vf_loss = 0.5 * sum((values[i] - ret[i]) ** 2 for i in range(5))
    entropy = -sum((probs[i] * torch.log(probs[i])).sum() for i in range(5))
    torch.testing.assert_close(terms.policy, pi_loss)
    torch.testing.assert_close(terms.value, vf_loss)
    torch.testing.assert_close(terms.entropy, entropy)
    torch.testing.assert_close(terms.total, pi_loss + 0.5 * vf_loss - 0.01 * entropy)
