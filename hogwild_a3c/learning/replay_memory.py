"""A worker's replay memory: its last N rollouts, kept for `ReplayLearner` to learn from again.

Each slot holds what an off-policy update needs and nothing more: the observations (uint8 frames
where the observations are frames in [0, 1], a quarter of float32's memory), the actions and the
behaviour policy's log-probabilities, rewards, episode ends and their bootstraps, the LSTM resets,
s_T with its reset, and the LSTM state at the rollout's start. The arrays are allocated once, at
their full size, so the memory is bounded from the first rollout: `nbytes` is what it will hold.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .distributions import ActionDistribution
from .rollout import FRAME_LEVELS, LstmState, Rollout, to_frame_levels


@dataclass
class StoredRollout:
    """One slot of the memory as torch tensors (views of the memory's arrays, valid until that slot
    is written again), the observations (or what was kept in their place) as float32 with s_T
    appended: [T + 1, K, *obs_shape]."""

    obs: torch.Tensor
    resets: torch.Tensor  # [T + 1, K]
    start_state: LstmState
    actions: np.ndarray  # [T, K, *action_shape]
    log_probs: np.ndarray  # [T, K], log mu(a_t)
    rewards: np.ndarray
    dones: np.ndarray
    done_values: np.ndarray


class ReplayMemory:
    def __init__(self, capacity: int, steps: int, envs: int, obs_shape: tuple[int, ...], state_size: int,
                 distribution: ActionDistribution, frames_uint8: bool):
        self.capacity = capacity
        self.frames_uint8 = frames_uint8
        # np.zeros takes pages as they are first written: the memory grows to nbytes as it fills.
        arrays = {name: np.zeros(shape, dtype) for name, (shape, dtype) in
                  _slots(capacity, steps, envs, obs_shape, state_size, distribution, frames_uint8).items()}
        self.obs = arrays["obs"]  # s_0 .. s_T in one array, so a replay reads one contiguous block
        self.resets, self.actions, self.log_probs = arrays["resets"], arrays["actions"], arrays["log_probs"]
        self.rewards, self.dones, self.done_values = arrays["rewards"], arrays["dones"], arrays["done_values"]
        self.start_h, self.start_c = torch.from_numpy(arrays["start_h"]), torch.from_numpy(arrays["start_c"])
        self.nbytes = sum(a.nbytes for a in arrays.values())
        self.size = 0  # slots filled
        self.added = 0  # rollouts ever added: the next one goes to slot added % capacity

    @staticmethod
    def bytes_for(capacity: int, steps: int, envs: int, obs_shape: tuple[int, ...], state_size: int,
                  distribution: ActionDistribution, frames_uint8: bool) -> int:
        """What a full memory of these shapes holds, allocating nothing."""
        slots = _slots(capacity, steps, envs, obs_shape, state_size, distribution, frames_uint8)
        return sum(math.prod(shape) * np.dtype(dtype).itemsize for shape, dtype in slots.values())

    def add(self, rollout: Rollout, inputs: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """Copy `rollout` in (a worker refills its one Rollout), over the oldest slot once full.
        `inputs`: what to keep in place of its observations and s_T ([T, K, F] and [K, F]: the
        encoder's features, for a memory made with obs_shape (F,))."""
        slot = self.added % self.capacity
        steps = rollout.rewards.shape[0]
        obs = self.obs[slot]
        if inputs is not None:
            obs[:steps], obs[steps] = inputs
        elif self.frames_uint8:
            if rollout.obs.dtype == np.uint8:
                obs[:steps] = rollout.obs
            else:
                to_frame_levels(rollout.obs, obs[:steps])
            to_frame_levels(rollout.next_obs, obs[steps])
        else:
            obs[:steps] = rollout.obs
            obs[steps] = rollout.next_obs
        self.resets[slot, :steps] = rollout.resets
        self.resets[slot, steps] = rollout.next_resets
        self.actions[slot] = rollout.actions
        self.log_probs[slot] = rollout.log_probs
        self.rewards[slot] = rollout.rewards
        self.dones[slot] = rollout.dones
        self.done_values[slot] = rollout.done_values
        self.start_h[slot].copy_(rollout.start_state[0])
        self.start_c[slot].copy_(rollout.start_state[1])
        self.added += 1
        self.size = min(self.size + 1, self.capacity)

    def sample(self, rng: np.random.Generator) -> StoredRollout:
        """A slot drawn uniformly from the filled ones (ACER's sampling)."""
        return self.stored(int(rng.integers(self.size)))

    def stored(self, slot: int) -> StoredRollout:
        obs = torch.from_numpy(self.obs[slot])
        return StoredRollout(
            obs=obs.float().div_(FRAME_LEVELS) if self.frames_uint8 else obs,
            resets=torch.from_numpy(self.resets[slot]),
            start_state=(self.start_h[slot], self.start_c[slot]),
            actions=self.actions[slot], log_probs=self.log_probs[slot], rewards=self.rewards[slot],
            dones=self.dones[slot], done_values=self.done_values[slot],
        )


def _slots(capacity: int, steps: int, envs: int, obs_shape: tuple[int, ...], state_size: int,
           distribution: ActionDistribution, frames_uint8: bool) -> dict[str, tuple[tuple[int, ...], Any]]:
    per_step = (capacity, steps, envs)
    return {
        "obs": ((capacity, steps + 1, envs, *obs_shape), np.uint8 if frames_uint8 else np.float32),
        "resets": ((capacity, steps + 1, envs), bool),
        "actions": ((*per_step, *distribution.action_shape), distribution.action_dtype),
        "log_probs": (per_step, np.float32), "rewards": (per_step, np.float32), "dones": (per_step, bool),
        "done_values": (per_step, np.float32),
        "start_h": ((capacity, 1, envs, state_size), np.float32),  # 0 wide for the mlp core
        "start_c": ((capacity, 1, envs, state_size), np.float32),
    }
