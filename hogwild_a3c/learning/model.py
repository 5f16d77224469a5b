"""The actor-critic: universe-starter-agent's LSTMPolicy, with an MLP encoder for vector inputs
(the encoders: `encoders.py`) and an action head whose outputs parametrize the env's action
distribution (`distributions.py`).

The LSTM state is an explicit value that callers hold: `initial_state` makes zeros, `step` acts
one step for a batch of environments, and `replay` re-runs a whole rollout with gradients, so
the acting loop can run without building an autograd graph. With `core="mlp"` there is no LSTM:
the encoder feeds the heads, and the state is an empty placeholder so callers need not care.

Running statistics (`RunningMoments`) for observation and return normalization are buffers of
the model: they live in shared memory with the weights, are copied on every pull, and are saved
in every checkpoint's `model` state dict, so workers, the evaluator and `evaluate` all see them.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from .distributions import ActionDistribution, Categorical
from .encoders import MlpEncoder, PartsEncoder, image_encoder

State = tuple[torch.Tensor, torch.Tensor]  # (h, c), each [1, batch, lstm_size] as nn.LSTM wants


@torch.no_grad()
def _normalized_columns_(weight: torch.Tensor, std: float) -> None:
    """Universe's `normalized_columns_initializer`: Gaussian rows rescaled to norm `std` per output."""
    if weight.is_meta:  # a size check (`model_size_problem`); torch's meta normal_ would import its compiler (1 s)
        return
    nn.init.normal_(weight)
    weight.mul_(std / weight.norm(dim=1, keepdim=True))


class RunningMoments(nn.Module):
    """Running mean and variance of a stream of vectors (or scalars), as buffers.

    Batches are merged with the parallel-variance formula (Chan et al.), so each worker can fold
    its rollout's moments into the shared buffers with `merge_`. Hogwild: two workers merging at
    the same instant may lose one batch's contribution, which only slows the estimate a little.
    """

    # Registered as buffers below; declared so that type checkers know them as tensors.
    mean: torch.Tensor
    var: torch.Tensor
    count: torch.Tensor

    def __init__(self, shape: tuple[int, ...], clip: float = 10.0, eps: float = 1e-8):
        super().__init__()
        self.clip, self.eps = clip, eps
        self.register_buffer("mean", torch.zeros(shape))
        self.register_buffer("var", torch.ones(shape))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """(x - mean) / std, clipped to +-clip; the identity until a first batch is merged."""
        return ((x - self.mean) * torch.rsqrt(self.var + self.eps)).clamp_(-self.clip, self.clip)

    def scale(self) -> float:
        """1 / std, for scaling rewards by the spread of the discounted return."""
        return float(torch.rsqrt(self.var + self.eps))

    @torch.no_grad()
    def merge_(self, batch: np.ndarray) -> None:
        """Fold a batch [N, *shape] into the running moments, in place."""
        batch = np.asarray(batch).reshape(-1, *self.mean.shape)
        # A NaN or inf (a broken env) must not poison the statistics of every process for good.
        finite = np.isfinite(batch.reshape(len(batch), -1)).all(axis=1)
        if not finite.all():
            batch = batch[finite]
        n = len(batch)
        if n == 0:
            return
        count = float(self.count)
        mean, var = self.mean.double().numpy(), self.var.double().numpy()
        # Summed in float64 without a float64 copy of the frames first: the same numbers, at a
        # quarter of the time (a rollout's 80 frames are 141k pixels, merged after every rollout).
        b_mean, b_var = batch.mean(axis=0, dtype=np.float64), batch.var(axis=0, dtype=np.float64)
        if count == 0:
            new_mean, new_var = b_mean, b_var
        else:
            total = count + n
            delta = b_mean - mean
            new_mean = mean + delta * n / total
            new_var = (var * count + b_var * n + delta**2 * count * n / total) / total
        self.mean.copy_(torch.as_tensor(new_mean))
        self.var.copy_(torch.as_tensor(new_var))
        self.count.fill_(count + n)


class ActorCritic(nn.Module):
    def __init__(
        self, obs_shape: tuple[int, ...], distribution: ActionDistribution | int, lstm_size: int = 256,
        core: str = "lstm",
        hidden_size: int = 128, activation: str = "elu", normalize_obs: bool = False, normalize_reward: bool = False,
        value_net: str = "shared", lstm_forget_bias: float = 1.0, layout: Any = None, encoder: str = "universe",
    ):
        super().__init__()
        self.obs_shape = tuple(obs_shape)
        self.core = core
        # An int n stands for Discrete(n)'s distribution.
        self.distribution = Categorical(distribution) if isinstance(distribution, int) else distribution
        self.encoder: nn.Module
        if layout is not None and layout.images:  # packed images (and maybe more): observations.py
            self.encoder = PartsEncoder(layout, hidden_size, activation, encoder, feeds_lstm=core == "lstm")
        elif len(obs_shape) == 3:
            self.encoder = image_encoder(encoder, obs_shape[0], obs_shape[1], None, feeds_lstm=core == "lstm")
        elif len(obs_shape) == 1:
            self.encoder = MlpEncoder(obs_shape[0], hidden_size, activation)
        else:
            raise ValueError(f"observation shape {obs_shape} is neither CxHxW nor a flat vector")
        # Registered only when asked for, so a model without them (universe's) keeps its state dict.
        self.obs_norm = RunningMoments(self.obs_shape) if normalize_obs else None
        self.return_norm = RunningMoments(()) if normalize_reward else None
        self.lstm: nn.LSTM | None
        if core == "lstm":
            self.lstm = nn.LSTM(self.encoder.out_features, lstm_size)
            # TF's BasicLSTMCell, which universe uses, starts its bias at zero and adds a constant
            # forget_bias (1.0) to the forget gate. A trainable bias that starts at 1.0 gets the same
            # gradients, so it trains the same; the forget gate then starts near 0.73, not 0.5.
            # get_parameter: nn.LSTM sets its per-layer weights by name, untyped.
            nn.init.zeros_(self.lstm.get_parameter("bias_ih_l0"))
            nn.init.zeros_(self.lstm.get_parameter("bias_hh_l0"))
            with torch.no_grad():
                # torch's gate order: i, f, g, o
                self.lstm.get_parameter("bias_ih_l0")[lstm_size : 2 * lstm_size] = lstm_forget_bias
            head_in = lstm_size
        else:
            self.lstm = None
            head_in = self.encoder.out_features
        # The value head may have an encoder of its own (SB3's MlpPolicy does), so the value loss
        # does not shape the action head's features: "separate" with the mlp core only (the LSTM's state
        # is then shared, as before the choice "mlp" existed), "mlp" with either core, the value
        # then feed-forward from the observation (an unbiased baseline without memory).
        separate = len(obs_shape) == 1 and (value_net == "mlp" or (value_net == "separate" and core == "mlp"))
        self.value_encoder = MlpEncoder(obs_shape[0], hidden_size, activation) if separate else None
        self.action_head = self.distribution.head(head_in)
        # The value head reads what feeds it: the value encoder's features when it has one (an
        # image model's own encoder may be wider: sizing from it crashed every worker).
        self.value = nn.Linear(self.value_encoder.out_features if self.value_encoder is not None else head_in, 1)
        _normalized_columns_(self.action_head.weight, 0.01)
        _normalized_columns_(self.value.weight, 1.0)
        nn.init.zeros_(self.action_head.bias)
        nn.init.zeros_(self.value.bias)

    @property
    def lstm_size(self) -> int:
        return self.lstm.hidden_size if self.lstm is not None else 0

    def initial_state(self, batch: int = 1) -> State:
        """Zeros [1, batch, lstm_size]; with the mlp core, empty [1, batch, 0] placeholders."""
        zeros = torch.zeros(1, batch, self.lstm_size)
        return zeros, zeros.clone()

    def normalized(self, obs: torch.Tensor) -> torch.Tensor:
        """What every encoder sees: the observation, normalized once when asked for."""
        return obs if self.obs_norm is None else self.obs_norm.normalize(obs)

    def _feedforward(
        self, obs: torch.Tensor, encoder_context: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The mlp core: action parameters and values of a batch of observations."""
        obs = self.normalized(obs)
        with encoder_context():
            out = self.encoder(obs).float()
        value_in = out if self.value_encoder is None else self.value_encoder(obs)
        return self.action_head(out), F.linear(value_in, self.value.weight, self.value.bias).squeeze(-1)

    def step(self, obs: torch.Tensor, state: State) -> tuple[torch.Tensor, torch.Tensor, State]:
        """One step for a batch: obs [B, *obs_shape] -> the action distribution's parameters
        [B, distribution.param_size], value [B], next state.

        The cell is written out with the LSTM's own weights because `nn.LSTM` called on a
        sequence of length 1 costs about four times as much as the arithmetic; `replay` uses the
        fused `nn.LSTM`, and tests check that both give the same numbers.
        """
        lstm = self.lstm
        if lstm is None:
            action_params, value = self._feedforward(obs)
            return action_params, value, state
        h, c = state[0][0], state[1][0]
        obs = self.normalized(obs)
        # nn.LSTM sets its per-layer weights by name, so they type as Tensor | Module; get_parameter
        # would cost a lookup per step.
        gates = F.linear(self.encoder(obs), lstm.weight_ih_l0, lstm.bias_ih_l0)  # type: ignore[arg-type]
        gates = gates + F.linear(h, lstm.weight_hh_l0, lstm.bias_hh_l0)  # type: ignore[arg-type]
        in_gate, forget_gate, cell_gate, out_gate = gates.chunk(4, dim=1)
        c = torch.sigmoid(forget_gate) * c + torch.sigmoid(in_gate) * torch.tanh(cell_gate)
        h = torch.sigmoid(out_gate) * torch.tanh(c)
        action_params = self.action_head(h)
        value_in = h if self.value_encoder is None else self.value_encoder(obs)
        value = F.linear(value_in, self.value.weight, self.value.bias).squeeze(-1)
        return action_params, value, (h.unsqueeze(0), c.unsqueeze(0))

    def replay(
        self, obs: torch.Tensor, state: State, resets: torch.Tensor | None = None,
        encoder_context: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext,
        features: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Re-run a rollout: obs [T, B, *obs_shape] from `state` -> action parameters [T, B, P],
        values [T, B].

        `resets[t, b]` is True when env b started a new episode at step t, so its LSTM state is
        zeroed there. The encoder sees all T*B frames in one batch, under `encoder_context` (bf16
        autocast: `precision`), and hands the core float32; the LSTM runs fused over each
        stretch between resets. `features` [T * B, F]: the encoder's output for these frames when
        the caller has it already (a learner that took it from acting's activations, with its own
        gradient path); the encoder is then not run.
        """
        steps, batch = obs.shape[:2]
        if self.lstm is None:
            action_params, values = self._feedforward(obs.reshape(steps * batch, *obs.shape[2:]), encoder_context)
            return action_params.reshape(steps, batch, -1), values.reshape(steps, batch)
        # Normalized only where something reads it: a caller that gives `features` normalized them.
        flat = (self.normalized(obs.reshape(steps * batch, *obs.shape[2:]))
                if features is None or self.value_encoder is not None else None)
        if features is None:
            with encoder_context():
                features = self.encoder(flat).float()
        return self._core(features.reshape(steps, batch, -1), state, resets, flat)

    def replay_features(self, features: torch.Tensor, state: State, resets: torch.Tensor | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        """`replay` from the encoder's output [T, B, F] as given: the LSTM and the heads only, so
        no gradient reaches the encoder. For a model whose value head reads the LSTM (no value net
        of its own)."""
        assert self.lstm is not None and self.value_encoder is None
        return self._core(features, state, resets, None)

    def _core(self, features: torch.Tensor, state: State, resets: torch.Tensor | None, flat: torch.Tensor | None
              ) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.lstm is not None
        steps, batch = features.shape[:2]
        cuts = [0]
        if resets is not None:
            cuts += [t for t in range(1, steps) if bool(resets[t].any())]
        cuts.append(steps)
        outputs = []
        h, c = state
        for start, end in zip(cuts[:-1], cuts[1:]):
            if start > 0:
                assert resets is not None  # cuts after 0 come from resets only
                keep = (~resets[start]).to(h.dtype).view(1, batch, 1)
                h, c = h * keep, c * keep
            out, (h, c) = self.lstm(features[start:end], (h, c))
            outputs.append(out)
        out = torch.cat(outputs) if len(outputs) > 1 else outputs[0]
        if self.value_encoder is None:
            return self.action_head(out), self.value(out).squeeze(-1)
        assert flat is not None  # normalized above whenever there is a value encoder
        return self.action_head(out), self.value(self.value_encoder(flat).reshape(steps, batch, -1)).squeeze(-1)


def has_conv_encoder(model: ActorCritic) -> bool:
    return any(isinstance(module, nn.Conv2d) for module in model.encoder.modules())


def build_model(obs_shape: tuple[int, ...], distribution: ActionDistribution | int, arch: Any,
                layout: Any = None) -> ActorCritic:
    """The model for a run. `distribution`: the env's action distribution (`EnvInfo.distribution`),
    or an int n for Discrete(n). `arch` is the run's Config (or anything with its model fields:
    lstm_size, lstm_forget_bias, core, hidden_size, activation, normalize_obs, normalize_reward,
    encoder, action_std), or a bare int, the LSTM size of universe's model. `layout`: the env's
    `EnvInfo.layout`, for packed observations."""
    if isinstance(arch, int):
        model = ActorCritic(obs_shape, distribution, arch, layout=layout)
    else:
        if not isinstance(distribution, int):
            distribution = distribution.for_settings(arch)
        model = ActorCritic(
            obs_shape, distribution, arch.lstm_size, core=arch.core, hidden_size=arch.hidden_size,
            activation=arch.activation, normalize_obs=arch.normalize_obs, normalize_reward=arch.normalize_reward,
            value_net=arch.value_net, lstm_forget_bias=arch.lstm_forget_bias, layout=layout,
            encoder=getattr(arch, "encoder", "universe"),  # objects made before the field existed
        )
    # Channels-last conv weights run the CPU (oneDNN) kernels faster, forward and backward
    # (results README, "Throughput"); every copy of the model, shared
    # or local, gets the same layout so weight copies and gradient hand-off stay plain copies.
    return model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # torch's stub lacks it


# Every worker holds its own copy of the model and its optimizer's statistics beside the shared
# one: 50M float32 parameters are ~0.2 GB a copy, 1.6 GB for two workers; far more than any
# model here needs (the universe model has 0.6M), and a size typo then fails in one line instead
# of in an allocation that takes the machine's memory first.
MAX_PARAMETERS = 50_000_000


def model_size_problem(obs_shape: tuple[int, ...], distribution: ActionDistribution | int, arch: Any,
                       layout: Any = None) -> str | None:
    """Why the model of these settings is too large to build, or None; it is built on torch's
    meta device first, so nothing is allocated to find out."""
    with torch.device("meta"):
        count = sum(p.numel() for p in build_model(obs_shape, distribution, arch, layout).parameters())
    if count <= MAX_PARAMETERS:
        return None
    return (f"lstm_size {arch.lstm_size} and hidden_size {arch.hidden_size} make a model of {count:,} parameters; "
            f"at most {MAX_PARAMETERS:,} fit (each worker holds a copy and its optimizer statistics)")


def model_for_env(info: Any, arch: Any) -> ActorCritic:
    """The model of `arch` (a Config) for an env as `describe_env` found it (an `EnvInfo`)."""
    return build_model(info.obs_shape, info.distribution, arch, info.layout)
