"""Action distributions: what the model's action head outputs, and how an action is drawn from it,
scored and handed to the env.

The seam between the policy's numbers and everything that takes an action: the worker samples
with `sample`, the learner scores with `evaluate` (log-probabilities and entropies together), the
evaluator and `load_policy().act` play `mode` or `sample`, and `env_action` is what `env.step`
receives. A new kind of action space is one new class here, registered with `@action_kind`:
nothing else changes.

`distribution_for(space)` picks the kind for an env's action space; a space no kind takes gets
one line (`UnsupportedActions`), before any process starts. Kinds: `Categorical` (Discrete),
`Gaussian` (a Box of floats), `MultiCategorical` (MultiDiscrete), `Bernoulli` (MultiBinary).
"""
from __future__ import annotations

import math
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
    # Whether the run's evaluator plays the most likely action rather than a draw.
    evaluated_at_mode: bool
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

    def for_settings(self, arch: Any) -> ActionDistribution:
        """This distribution as a run's settings shape its head (the Gaussian's --action-std)."""


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
    evaluated_at_mode = False  # a greedy policy can loop forever where a sampled one moves on (Atari)
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
        actions, chosen = _inverse_cdf(torch.softmax(params, dim=-1).numpy().astype(np.float64),
                                       rng.random(len(params)))
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

    def for_settings(self, arch: Any) -> Categorical:
        return self


LOG_2PI = math.log(2 * math.pi)
# The floor under a Gaussian's log-std: a std of e^-5 (0.7% of the half-range of a bounded action),
# so that nothing divides by a std that has collapsed to 0. Reached softly (a sharp softplus: the
# raw value itself from about one unit above it), so that a log-std pushed to it still has a
# gradient that can bring it back. The ceiling only keeps exp() finite.
LOG_STD_FLOOR, LOG_STD_CEILING = -5.0, 4.0


def _floored(raw_log_std: torch.Tensor) -> torch.Tensor:
    return (LOG_STD_FLOOR + F.softplus(raw_log_std - LOG_STD_FLOOR, beta=4.0)).clamp(max=LOG_STD_CEILING)


class FreeLogStdHead(nn.Linear):
    """A Gaussian's head with a state-independent log-std (CleanRL's, SB3's): the linear layer
    gives the mean, one learned number per action dimension the log-std; both are output, so the
    acting graph (ONNX) reads the log-std like any weight."""

    def __init__(self, in_features: int, dims: int):
        super().__init__(in_features, dims)
        self.log_std = nn.Parameter(torch.zeros(dims))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        mean = super().forward(features)
        return torch.cat([mean, self.log_std.expand_as(mean)], dim=-1)


@action_kind
class Gaussian:
    """A diagonal Gaussian over `Box` actions of a float dtype (any shape, flattened): the head gives
    the means and log-stds, `[mean (d), log_std (d)]` a row.

    A Box with finite bounds is learned in [-1, 1] a dimension and mapped onto [low, high], so
    one initial std (1: half the range) suits every env; the sample is stored as drawn and only the
    copy handed to the env is clipped, so stored log-probabilities are those of the stored actions.
    With `bound="tanh"` that copy is squashed by tanh instead of clipped. The policy gradient is the
    same either way: the stored draw u is what is scored, and tanh's log-det term depends on u alone,
    not on the weights; the entropy bonus is the unsquashed Gaussian's. A dimension with an
    infinite bound is acted in the env's own units, clipped to the finite bound if it has one."""

    serves = "Box of floats"
    # The mean action, as continuous control is reported (SB3's and rl-zoo's deterministic
    # evaluation); the draw's noise is exploration, which an evaluation of the policy leaves out.
    evaluated_at_mode = True
    action_dtype: type[np.generic] = np.float32

    def __init__(self, low: np.ndarray, high: np.ndarray, env_shape: tuple[int, ...], env_dtype: Any = np.float32,
                 std_source: str = "free", bound: str = "clip"):
        self.low = np.asarray(low, dtype=np.float64).ravel()
        self.high = np.asarray(high, dtype=np.float64).ravel()
        self.env_shape, self.env_dtype = tuple(env_shape), np.dtype(env_dtype)
        self.dims = int(self.low.size)
        self.action_shape: tuple[int, ...] = (self.dims,)
        self.param_size: int = 2 * self.dims
        self.std_source, self.bound = std_source, bound
        bounded = np.isfinite(self.low) & np.isfinite(self.high)
        low, high = np.where(bounded, self.low, -1.0), np.where(bounded, self.high, 1.0)
        self.centre, self.half_range = (high + low) / 2, (high - low) / 2
        self.clip_low = np.where(bounded, -1.0, self.low)
        self.clip_high = np.where(bounded, 1.0, self.high)
        self.squashed = bounded if bound == "tanh" else np.zeros_like(bounded)

    @staticmethod
    def takes(space: gym.Space) -> bool:
        return (isinstance(space, gym.spaces.Box) and np.issubdtype(space.dtype, np.floating)
                and (space.shape is not None and 0 < int(np.prod(space.shape))))

    @classmethod
    def of(cls, space: gym.Space) -> Gaussian:
        assert isinstance(space, gym.spaces.Box)
        return cls(space.low, space.high, space.shape, space.dtype)

    def for_settings(self, arch: Any) -> Gaussian:
        """With the head --action-std asks for: the log-std `free` (one learned number a
        dimension) or per `state` (a second linear output, as the A3C paper's variance head); and
        the bounding --action-bound asks for (clip or tanh)."""
        std_source, bound = getattr(arch, "action_std", "free"), getattr(arch, "action_bound", "clip")
        return Gaussian(self.low, self.high, self.env_shape, self.env_dtype, std_source, bound)

    def _key(self) -> tuple[Any, ...]:
        return (self.low.tobytes(), self.high.tobytes(), self.env_shape, self.env_dtype.str, self.std_source,
                self.bound)

    def __repr__(self) -> str:
        return f"Gaussian({self.dims}, std {self.std_source}, {self.bound})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Gaussian) and other._key() == self._key()

    def __hash__(self) -> int:
        return hash(("Gaussian", self._key()))

    def head(self, in_features: int) -> nn.Linear:
        if self.std_source == "state":
            return nn.Linear(in_features, 2 * self.dims)
        return FreeLogStdHead(in_features, self.dims)

    def split(self, params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, floored log-std), each [..., d]."""
        mean, raw_log_std = params.split(self.dims, dim=-1)
        return mean, _floored(raw_log_std)

    def sample(self, params: torch.Tensor, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        mean, log_std = (part.detach().numpy().astype(np.float64) for part in self.split(params))
        actions = (mean + np.exp(log_std) * rng.standard_normal(mean.shape)).astype(np.float32)
        # Scored by the learner's own formula, of the float32 actions as stored.
        return actions, self.log_prob(params.detach(), torch.from_numpy(actions)).numpy().astype(np.float32)

    def mode(self, params: torch.Tensor) -> np.ndarray:
        return self.split(params)[0].detach().numpy().astype(np.float32)

    def evaluate(self, params: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, log_std = self.split(params)
        scaled = (actions - mean) * torch.exp(-log_std)
        log_probs = (-0.5 * scaled.pow(2) - log_std).sum(-1) - 0.5 * self.dims * LOG_2PI
        return log_probs, self._entropy(log_std)

    def _entropy(self, log_std: torch.Tensor) -> torch.Tensor:
        return log_std.sum(-1) + 0.5 * self.dims * (1.0 + LOG_2PI)

    def log_prob(self, params: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return self.evaluate(params, actions)[0]

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        return self._entropy(self.split(params)[1])

    def env_action(self, action: np.ndarray) -> np.ndarray:
        action = np.asarray(action, dtype=np.float64)
        clipped = np.clip(np.where(self.squashed, np.tanh(action), action), self.clip_low, self.clip_high)
        return (clipped * self.half_range + self.centre).reshape(self.env_shape).astype(self.env_dtype)


def _inverse_cdf(probs: np.ndarray, draws: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's index drawn from `probs` [B, n] (float64) with a uniform `draws` [B] in [0, 1), and
    its probability as normalized."""
    cdf = np.cumsum(probs, axis=1)
    actions = np.minimum((cdf < draws[:, None] * cdf[:, -1:]).sum(axis=1), cdf.shape[1] - 1)
    return actions, probs[np.arange(len(actions)), actions] / cdf[:, -1]


@action_kind
class MultiCategorical:
    """`MultiDiscrete(nvec)`: one categorical a part (any shape of nvec, flattened), the head's
    logits concatenated; log-probabilities and entropies are summed over the parts."""

    serves = "MultiDiscrete"
    evaluated_at_mode = False
    action_dtype: type[np.generic] = np.int64

    def __init__(self, nvec: np.ndarray, start: np.ndarray | None = None, env_dtype: Any = np.int64):
        self.env_shape = tuple(np.shape(nvec))
        self.sizes = [int(n) for n in np.asarray(nvec).ravel()]
        self.start = np.zeros(len(self.sizes), np.int64) if start is None else np.asarray(start, np.int64).ravel()
        self.env_dtype = np.dtype(env_dtype)
        self.action_shape: tuple[int, ...] = (len(self.sizes),)
        self.param_size: int = sum(self.sizes)

    @staticmethod
    def takes(space: gym.Space) -> bool:
        return isinstance(space, gym.spaces.MultiDiscrete) and space.nvec.size > 0

    @classmethod
    def of(cls, space: gym.Space) -> MultiCategorical:
        assert isinstance(space, gym.spaces.MultiDiscrete)
        return cls(space.nvec, getattr(space, "start", None), space.dtype)

    def _key(self) -> tuple[Any, ...]:
        return (tuple(self.sizes), self.env_shape, self.start.tobytes(), self.env_dtype.str)

    def __repr__(self) -> str:
        return f"MultiCategorical({self.sizes})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MultiCategorical) and other._key() == self._key()

    def __hash__(self) -> int:
        return hash(("MultiCategorical", self._key()))

    def head(self, in_features: int) -> nn.Linear:
        return nn.Linear(in_features, self.param_size)

    def sample(self, params: torch.Tensor, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        draws = rng.random((len(params), len(self.sizes)))
        actions = np.empty((len(params), len(self.sizes)), np.int64)
        log_probs = np.zeros(len(params))
        for i, logits in enumerate(params.split(self.sizes, dim=-1)):
            probs = torch.softmax(logits.detach(), dim=-1).numpy().astype(np.float64)
            actions[:, i], chosen = _inverse_cdf(probs, draws[:, i])
            with np.errstate(divide="ignore"):
                log_probs += np.log(chosen)
        return actions, log_probs.astype(np.float32)

    def mode(self, params: torch.Tensor) -> np.ndarray:
        return torch.stack([logits.argmax(-1) for logits in params.detach().split(self.sizes, dim=-1)], -1).numpy()

    def evaluate(self, params: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        chosen, entropy = [], []
        for i, logits in enumerate(params.split(self.sizes, dim=-1)):
            log_probs = F.log_softmax(logits, dim=-1)
            chosen.append(log_probs.gather(-1, actions[..., i : i + 1]).squeeze(-1))
            entropy.append(-(log_probs.exp() * log_probs).sum(-1))
        return torch.stack(chosen, -1).sum(-1), torch.stack(entropy, -1).sum(-1)

    def log_prob(self, params: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return self.evaluate(params, actions)[0]

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        return self.evaluate(params, torch.zeros((*params.shape[:-1], len(self.sizes)), dtype=torch.int64))[1]

    def env_action(self, action: np.ndarray) -> np.ndarray:
        return (np.asarray(action) + self.start).reshape(self.env_shape).astype(self.env_dtype)

    def for_settings(self, arch: Any) -> MultiCategorical:
        return self


@action_kind
class Bernoulli:
    """`MultiBinary(n)`: an independent coin a part (any shape, flattened), the head's logits its
    log-odds; log-probabilities and entropies are summed over the parts."""

    serves = "MultiBinary"
    evaluated_at_mode = False
    action_dtype: type[np.generic] = np.int8

    def __init__(self, env_shape: tuple[int, ...]):
        self.env_shape = tuple(env_shape)
        self.param_size: int = int(np.prod(self.env_shape))
        self.action_shape: tuple[int, ...] = (self.param_size,)

    @staticmethod
    def takes(space: gym.Space) -> bool:
        return isinstance(space, gym.spaces.MultiBinary) and int(np.prod(space.shape)) > 0

    @classmethod
    def of(cls, space: gym.Space) -> Bernoulli:
        assert isinstance(space, gym.spaces.MultiBinary)
        return cls(tuple(space.shape))

    def __repr__(self) -> str:
        return f"Bernoulli({self.param_size})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Bernoulli) and other.env_shape == self.env_shape

    def __hash__(self) -> int:
        return hash(("Bernoulli", self.env_shape))

    def head(self, in_features: int) -> nn.Linear:
        return nn.Linear(in_features, self.param_size)

    def sample(self, params: torch.Tensor, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        ones = rng.random(params.shape) < torch.sigmoid(params.detach()).numpy().astype(np.float64)
        actions = ones.astype(np.int8)
        return actions, self.log_prob(params.detach(), torch.from_numpy(actions)).numpy().astype(np.float32)

    def mode(self, params: torch.Tensor) -> np.ndarray:
        return (params > 0).detach().numpy().astype(np.int8)

    def evaluate(self, params: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        targets = actions.to(params.dtype)
        log_probs = -F.binary_cross_entropy_with_logits(params, targets, reduction="none").sum(-1)
        return log_probs, self.entropy(params)

    def log_prob(self, params: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return self.evaluate(params, actions)[0]

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        p = torch.sigmoid(params)
        return (F.softplus(params) - p * params).sum(-1)  # -p log p - (1-p) log(1-p)

    def env_action(self, action: np.ndarray) -> np.ndarray:
        return np.asarray(action).reshape(self.env_shape).astype(np.int8)

    def for_settings(self, arch: Any) -> Bernoulli:
        return self


def choose(distribution: ActionDistribution, params: torch.Tensor, rng: np.random.Generator,
           greedy: bool = False) -> np.ndarray:
    """Each row's action: the most likely one when `greedy`, else a draw (what a player does)."""
    return distribution.mode(params) if greedy else distribution.sample(params, rng)[0]
