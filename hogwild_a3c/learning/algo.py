"""The A3C maths as pure functions: discounting, returns, GAE and universe's summed loss (with
PPO's clipped policy term for the later passes of `--epochs`).

Nothing here knows about processes or environments, so every function can be checked against
a slow reference (tests/test_algo.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .distributions import Categorical


def discount(x: np.ndarray, gamma: float) -> np.ndarray:
    """y[t] = sum_k gamma^k x[t+k] along axis 0: universe's `scipy.signal.lfilter([1], [1, -gamma],
    x[::-1])[::-1]`, as the recursion y[t] = x[t] + gamma * y[t+1] (tests check both agree).

    A plain loop, because rollouts are 5-20 steps long and importing scipy.signal was nearly half
    of every spawned child's start: the start of every run.
    """
    x = np.asarray(x, dtype=np.float64)
    out = np.empty_like(x)
    if x.ndim == 1:
        running = 0.0
        values = x.tolist()
        for t in range(len(values) - 1, -1, -1):
            running = values[t] + gamma * running
            values[t] = running
        out[:] = values
        return out
    running_rows = np.zeros(x.shape[1:])
    for t in range(len(x) - 1, -1, -1):
        running_rows = x[t] + gamma * running_rows
        out[t] = running_rows
    return out


def running_returns(rewards: np.ndarray, dones: np.ndarray, running: np.ndarray, gamma: float
                    ) -> tuple[np.ndarray, np.ndarray]:
    """The discounted return so far of each env at each step [T, K] (float64), carried in from
    `running` [K] and zeroed after an episode's end or a non-finite value; and the one carried out.
    What --normalize-reward scales rewards by (the running std of these returns)."""
    returns = np.empty_like(rewards, dtype=np.float64)
    for t in range(len(rewards)):
        running = running * gamma + rewards[t]
        returns[t] = running
        running = np.where(dones[t] | ~np.isfinite(running), 0.0, running)
    return returns, running


def segment_targets(
    rewards: np.ndarray, values: np.ndarray, bootstrap: float, gamma: float, lam: float
) -> tuple[np.ndarray, np.ndarray]:
    """Returns and GAE advantages of one stretch of steps that lies inside one episode.

    `bootstrap` is V(s_T) when the stretch stopped mid-episode or at a time-limit cut, and 0
    at a true terminal (universe's `rollout.r`).
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    values_plus = np.append(np.asarray(values, dtype=np.float64), bootstrap)
    returns = discount(np.append(rewards, bootstrap), gamma)[:-1]
    deltas = rewards + gamma * values_plus[1:] - values_plus[:-1]
    advantages = discount(deltas, gamma * lam)
    return returns.astype(np.float32), advantages.astype(np.float32)


def rollout_targets(
    rewards: np.ndarray,
    values: np.ndarray,
    dones: np.ndarray,
    done_values: np.ndarray,
    last_values: np.ndarray,
    gamma: float,
    lam: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Returns and advantages of a [T, K] rollout of K environments.

    An environment whose episode ended at step t (dones[t, k]) splits its column into
    independent stretches: the one ending at t bootstraps from done_values[t, k] (0 when
    terminated, V(final observation) when truncated), the last one from last_values[k].
    """
    steps, envs = rewards.shape
    returns = np.empty((steps, envs), dtype=np.float32)
    advantages = np.empty((steps, envs), dtype=np.float32)
    for k in range(envs):
        start = 0
        for end in (np.flatnonzero(dones[:, k]) + 1).tolist() + [steps]:
            if end <= start:
                continue
            bootstrap = done_values[end - 1, k] if dones[end - 1, k] else last_values[k]
            returns[start:end, k], advantages[start:end, k] = segment_targets(
                rewards[start:end, k], values[start:end, k], bootstrap, gamma, lam
            )
            start = end
    return returns, advantages


def normalized_advantages(advantages: np.ndarray, eps: float = 1e-8) -> np.ndarray:
    """Advantages shifted and scaled to mean 0 and std 1 over the batch (`--normalize-advantages`).
    A batch whose advantages are all equal carries no preference between its actions: all 0."""
    centred = advantages - advantages.mean(dtype=np.float64)
    return (centred / (centred.std(dtype=np.float64) + eps)).astype(np.float32)


@dataclass
class LossTerms:
    total: torch.Tensor
    policy: torch.Tensor
    value: torch.Tensor
    entropy: torch.Tensor
    log_probs: torch.Tensor  # log pi(a) of each sample's action, [N]


def a3c_loss(
    action_params: torch.Tensor,
    values: torch.Tensor,
    actions: torch.Tensor,
    advantages: torch.Tensor,
    returns: torch.Tensor,
    value_coef: float = 0.5,
    entropy_coef: float = 0.01,
    reduction: str = "sum",
    old_log_probs: torch.Tensor | None = None,
    ratio_clip: float = 0.1,
    distribution: Any = None,
) -> LossTerms:
    """Universe's loss, summed over the batch rather than averaged (`reduction="sum"`), of the
    action distribution's parameters [N, P] (`distribution`; None: logits of a Categorical).

    pi_loss = -sum(log pi(a) * adv); vf_loss = 0.5 * sum((V - R)^2);
    entropy = -sum(pi * log pi); total = pi_loss + value_coef * vf_loss - entropy_coef * entropy.
    With `reduction="mean"` every sum is a mean over the batch (SB3's A2C, at value_coef 0.5,
    gives the value term the same weight relative to the policy term as here at value_coef 1.0,
    since SB3's value loss has no 0.5 inside). Summing makes the gradient grow with the batch, so
    against a fixed clip norm a large batch is clipped hard and a large value error swamps the
    policy gradient; the mean keeps the clip threshold and lr meaningful for any batch size.

    With `old_log_probs` (log pi_old(a) of the policy that first learned from the batch, for the
    passes of `--epochs` after the first) the policy term is PPO's clipped surrogate,
    -sum(min(r * adv, clip(r, 1 - ratio_clip, 1 + ratio_clip) * adv)) with r = pi(a) / pi_old(a):
    once the policy has moved past the clip on a sample, that sample stops pushing it further.
    Where pi = pi_old its gradient is the A3C term's, so a first pass could use either.
    """
    reduce = torch.sum if reduction == "sum" else torch.mean
    if distribution is None:
        distribution = Categorical(action_params.shape[-1])
    chosen, entropies = distribution.evaluate(action_params, actions)
    if old_log_probs is None:
        policy_loss = -reduce(chosen * advantages)
    else:
        ratio = torch.exp(chosen - old_log_probs)
        clipped = torch.clamp(ratio, 1.0 - ratio_clip, 1.0 + ratio_clip)
        policy_loss = -reduce(torch.minimum(ratio * advantages, clipped * advantages))
    value_loss = 0.5 * reduce((values - returns).pow(2))
    entropy = reduce(entropies)
    total = policy_loss + value_coef * value_loss - entropy_coef * entropy
    return LossTerms(total, policy_loss, value_loss, entropy, chosen)
