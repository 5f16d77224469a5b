"""V-trace (Espeholt et al. 2018, IMPALA): targets for a rollout acted by an older policy mu and
learned from by the current policy pi, with truncated importance weights.

With rho_t = min(rho_bar, pi(a_t)/mu(a_t)), c_t = min(c_bar, pi(a_t)/mu(a_t)) and
delta_t = r_t + gamma V(s_{t+1}) - V(s_t), within one episode stretch:

    v_t - V(s_t) = rho_t delta_t + gamma c_t (v_{t+1} - V(s_{t+1}))             (value target)
    A_t          = rho_t delta_t + gamma lambda c_t A_{t+1}                      (policy advantage)

At lambda = 1 and rho_bar = c_bar, A_t is IMPALA's rho_t (r_t + gamma v_{t+1} - V(s_t)); for lambda
below 1 it is the GAE form of the same correction. On-policy (every ratio 1) v_t is the n-step
return and A_t the GAE advantage, exactly what `algo.rollout_targets` gives an on-policy update
(tests check both, and the sums against a slow reference).
"""
from __future__ import annotations

import numpy as np

# IMPALA's truncation levels: no weight above 1, so a replayed sample can only count less than an
# on-policy one, never more; its ablations found 1 the best of those tried.
RHO_BAR = 1.0
C_BAR = 1.0


def vtrace_targets(
    rewards: np.ndarray,
    values: np.ndarray,
    dones: np.ndarray,
    done_values: np.ndarray,
    last_values: np.ndarray,
    log_ratios: np.ndarray,
    gamma: float,
    lam: float,
    rho_bar: float = RHO_BAR,
    c_bar: float = C_BAR,
) -> tuple[np.ndarray, np.ndarray]:
    """Value targets and policy advantages [T, K] (float32) of a rollout of K environments.

    `values` [T, K] and `last_values` [K] are V at the learner's weights; `log_ratios` [T, K] are
    log pi(a_t) - log mu(a_t). An environment whose episode ended at step t (dones[t, k]) bootstraps
    that stretch from done_values[t, k] (0 at a terminal) and carries nothing across the cut, as
    `algo.rollout_targets` does."""
    steps = rewards.shape[0]
    ratios = np.exp(np.minimum(log_ratios.astype(np.float64), 50.0))  # no overflow; truncated below anyway
    rhos = np.minimum(rho_bar, ratios)
    cs = np.minimum(c_bar, ratios)
    value_targets = np.empty(rewards.shape, dtype=np.float32)
    advantages = np.empty(rewards.shape, dtype=np.float32)
    value_carry = np.zeros(rewards.shape[1:])  # v_{t+1} - V(s_{t+1})
    advantage_carry = np.zeros(rewards.shape[1:])  # A_{t+1}
    next_values = last_values.astype(np.float64)
    for t in range(steps - 1, -1, -1):
        ended = dones[t]
        bootstrap = np.where(ended, done_values[t], next_values)
        value_carry = np.where(ended, 0.0, value_carry)
        advantage_carry = np.where(ended, 0.0, advantage_carry)
        value_t = values[t].astype(np.float64)
        weighted_delta = rhos[t] * (rewards[t] + gamma * bootstrap - value_t)
        value_carry = weighted_delta + gamma * cs[t] * value_carry
        advantage_carry = weighted_delta + gamma * lam * cs[t] * advantage_carry
        value_targets[t] = value_t + value_carry
        advantages[t] = advantage_carry
        next_values = value_t
    return value_targets, advantages
