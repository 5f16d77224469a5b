"""A rollout: what a worker's acting leaves for its learner. T steps of K environments, as arrays
indexed [t, k], with everything an update needs to score the actions again: the observations, the
actions and the behaviour policy's log-probabilities, the rewards and values, where episodes ended
and with what bootstrap, and the LSTM state the rollout started from."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .distributions import ActionDistribution

# A frame stored as uint8 is round(x * 255) of an observation in [0, 1]: a quarter of float32's
# memory, for a learner that keeps rollouts (the conv encoders' frames are in [0, 1]).
FRAME_LEVELS = 255.0

# model.State, written out: the rollout stays a leaf of plain arrays below the model and the memory.
LstmState = tuple[torch.Tensor, torch.Tensor]


@dataclass
class Rollout:
    """A worker fills one preallocated Rollout again and again: one returned by `collect` is valid
    until the next `collect`. A new per-step quantity is one more field here, filled while acting."""

    obs: np.ndarray  # [T, K, *obs_shape] float32 (or uint8 frames), the observation each action was taken on
    actions: np.ndarray  # [T, K, *distribution.action_shape], of the distribution's dtype
    log_probs: np.ndarray  # [T, K] float32, log mu(a_t): the behaviour policy's, as acting sampled it
    rewards: np.ndarray  # [T, K] float32
    values: np.ndarray  # [T, K] float32, V(s_t) while acting
    dones: np.ndarray  # [T, K] bool, an episode ended after step t
    done_values: np.ndarray  # [T, K] float32, the bootstrap where it ended (0 at a terminal)
    resets: np.ndarray  # [T, K] bool, the LSTM state is zeroed before step t
    last_values: np.ndarray  # [K] float32, V(s_T): the bootstrap of each column's last stretch
    start_state: LstmState  # the LSTM state before step 0 (detached), where the replay starts
    # s_T, and whether the LSTM state was zeroed before it (an episode ended at step T-1): what a
    # learner that replays this rollout later needs to take V(s_T) at its own weights.
    next_obs: np.ndarray  # [K, *obs_shape] float32
    next_resets: np.ndarray  # [K] bool
    # What acting kept for the learner, when it asked (each encoder ELU's output [T, K, ...] float32,
    # written channels-last where `activations_nhwc` says so): learner.py reads them.
    activations: list[np.ndarray] = field(default_factory=list)
    activations_nhwc: list[bool] = field(default_factory=list)

    @classmethod
    def empty(cls, steps: int, envs: int, obs_shape: tuple[int, ...], start_state: LstmState,
              distribution: ActionDistribution, frames_uint8: bool = False,
              activation_shapes: Sequence[tuple[int, ...]] = (), activations_nhwc: Sequence[bool] = ()) -> Rollout:
        per_step = {"log_probs": np.float32, "rewards": np.float32, "values": np.float32, "dones": bool,
                    "done_values": np.float32, "resets": bool}
        arrays: dict[str, Any] = {name: np.zeros((steps, envs), dtype=dtype) for name, dtype in per_step.items()}
        return cls(
            obs=np.zeros((steps, envs, *obs_shape), dtype=np.uint8 if frames_uint8 else np.float32),
            actions=np.zeros((steps, envs, *distribution.action_shape), dtype=distribution.action_dtype),
            **arrays,
            last_values=np.zeros(envs, dtype=np.float32),
            start_state=start_state,
            next_obs=np.zeros((envs, *obs_shape), dtype=np.float32),
            next_resets=np.zeros(envs, dtype=bool),
            activations=[np.zeros((steps, envs, *shape), dtype=np.float32) for shape in activation_shapes],
            activations_nhwc=list(activations_nhwc),
        )

    def store_obs(self, t: int, obs: np.ndarray) -> None:
        """Step t's observations [K, *obs_shape], as this rollout stores them: uint8 frames only
        for observations in [0, 1] (what the conv encoders read), which the caller knows."""
        if self.obs.dtype == np.uint8:
            to_frame_levels(obs, self.obs[t])
        else:
            self.obs[t] = obs

    def observations(self) -> torch.Tensor:
        """The observations [T, K, *obs_shape] as the model reads them: float32 (a view when stored so)."""
        if self.obs.dtype == np.uint8:
            return torch.from_numpy(self.obs).float().div_(FRAME_LEVELS)
        return torch.from_numpy(self.obs)

    @property
    def steps(self) -> int:
        return self.rewards.size


def to_frame_levels(obs: np.ndarray, out: np.ndarray) -> None:
    """Observations in [0, 1] written into the uint8 array `out` as round(x * 255)."""
    np.rint(np.clip(obs, 0.0, 1.0) * FRAME_LEVELS, out=out, casting="unsafe")
