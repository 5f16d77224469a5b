"""Action distributions: what the model's action head outputs, and how an action is drawn from it,
scored and handed to the env.

The seam between the policy's numbers and everything that takes an action: the worker samples
with `sample`, the learner scores with `evaluate` (log-probabilities and entropies together), the
evaluator and `load_policy().act` play `mode` or `sample`, and `env_action` is what `env.step`
receives. A new kind of action space is one new class here, registered with `@action_kind`:
nothing else changes.

`distribution_for(space)` picks the kind for an env's action space; a space no kind takes gets
one line (`UnsupportedActions`), before any process starts.
"""
from __future__ import annotations

from typing import Any, Protocol

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class UnsupportedActions(ValueError):
    """An action space that no distribution here takes."""


class ActionDistribution(Protocol):
    param_size: int  # how many numbers the action head gives per observation
    action_shape: tuple[int, ...]  # of one action as the rollout stores it
    action_dtype: type[np.generic]  # numpy dtype of the stored actions

    def head(self, in_features: int) -> nn.Linear:
        """The model's action head: a linear layer (initialised by the model) whose output, for a
        batch of features, is `param_size` numbers a row."""

    def sample(self, params: torch.Tensor, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """One action per row of `params` [B, param_size], drawn with `rng`, and its
        log-probability [B] (float32): the behaviour policy's, stored with the rollout."""

    def mode(self, params: torch.Tensor) -> np.ndarray:
        """The most likely action of each row (what `--greedy` plays)."""

    def evaluate(self, params: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """log pi(a) of each row's action and each row's entropy, both [B], differentiable."""

    def log_prob(self, params: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """log pi(a) of each row's action, [B]."""

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        """Each row's entropy, [B]."""

    def env_action(self, action: np.ndarray) -> Any:
        """One stored action as the env's `step` takes it."""


_KINDS: list[Any] = []


def action_kind(cls: Any) -> Any:
    """Registers a distribution class: `cls.takes(space)` says whether it serves an action space,
    `cls.of(space)` builds it."""
    _KINDS.append(cls)
    return cls


def distribution_for(space: gym.Space) -> ActionDistribution:
    """The action distribution for an env's action space; UnsupportedActions names what would do."""
    for kind in _KINDS:
        if kind.takes(space):
            return kind.of(space)
    kinds = ", ".join(kind.__name__ + " (" + kind.serves + ")" for kind in _KINDS)
    raise UnsupportedActions(f"action space {space} is not one this trainer samples from; it takes {kinds}")


@action_kind
class Categorical:
    """One of `n` actions (`Discrete(n)`): the head gives n logits, pi = softmax(logits)."""

    serves = "Discrete"
    action_shape: tuple[int, ...] = ()
    action_dtype: type[np.generic] = np.int64

    def __init__(self, n: int):
        self.n: int = n
        self.param_size: int = n

    @staticmethod
    def takes(space: gym.Space) -> bool:
        return isinstance(space, gym.spaces.Discrete)

    @classmethod
    def of(cls, space: gym.Space) -> Categorical:
        assert isinstance(space, gym.spaces.Discrete)
        return cls(int(space.n))

    def __repr__(self) -> str:
        return f"Categorical({self.n})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Categorical) and other.n == self.n

    def __hash__(self) -> int:
        return hash(("Categorical", self.n))

    def head(self, in_features: int) -> nn.Linear:
        return nn.Linear(in_features, self.n)

    def sample(self, params: torch.Tensor, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        # By inverting the CDF with one uniform draw a row, in float64 from the float32 softmax:
        # one rng call a step, whatever the batch, so a seeded run draws the same actions as before.
        probs = torch.softmax(params, dim=-1).numpy().astype(np.float64)
        cdf = np.cumsum(probs, axis=1)
        draws = rng.random((len(cdf), 1)) * cdf[:, -1:]
        actions = np.minimum((cdf < draws).sum(axis=1), cdf.shape[1] - 1)
        chosen = probs[np.arange(len(actions)), actions] / cdf[:, -1]
        with np.errstate(divide="ignore"):
            return actions, np.log(chosen).astype(np.float32)

    def mode(self, params: torch.Tensor) -> np.ndarray:
        return params.argmax(dim=-1).numpy()

    def evaluate(self, params: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        log_probs = F.log_softmax(params, dim=-1)  # once for both: the learn step's one softmax
        chosen = log_probs.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
        return chosen, -(log_probs.exp() * log_probs).sum(-1)

    def log_prob(self, params: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(params, dim=-1).gather(-1, actions.unsqueeze(-1)).squeeze(-1)

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        log_probs = F.log_softmax(params, dim=-1)
        return -(log_probs.exp() * log_probs).sum(-1)

    def env_action(self, action: np.ndarray) -> int:
        return int(action)


def choose(distribution: ActionDistribution, params: torch.Tensor, rng: np.random.Generator,
           greedy: bool = False) -> np.ndarray:
    """Each row's action: the most likely one when `greedy`, else a draw (what a player does)."""
    return distribution.mode(params) if greedy else distribution.sample(params, rng)[0]
