"""The actor-critic: universe-starter-agent's LSTMPolicy, with an MLP encoder for vector inputs.

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
import math
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from .encoder_grad import KeptActivations, conv_elu_chain, features_from_activations

State = tuple[torch.Tensor, torch.Tensor]  # (h, c), each [1, batch, lstm_size] as nn.LSTM wants


def _glorot_uniform_(weight: torch.Tensor, fan_in: int, fan_out: int) -> None:
    bound = math.sqrt(6.0 / (fan_in + fan_out))
    nn.init.uniform_(weight, -bound, bound)


@torch.no_grad()
def _normalized_columns_(weight: torch.Tensor, std: float) -> None:
    """Universe's `normalized_columns_initializer`: Gaussian rows rescaled to norm `std` per output."""
    if weight.is_meta:  # a size check (`model_size_problem`); torch's meta normal_ would import its compiler (1 s)
        return
    nn.init.normal_(weight)
    weight.mul_(std / weight.norm(dim=1, keepdim=True))


def _glorot_linear(in_features: int, out_features: int) -> nn.Linear:
    linear = nn.Linear(in_features, out_features)
    _glorot_uniform_(linear.weight, in_features, out_features)
    nn.init.zeros_(linear.bias)
    return linear


def _glorot_conv(in_channels: int, out_channels: int, stride: int) -> nn.Conv2d:
    conv = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1)
    _glorot_uniform_(conv.weight, in_channels * 9, out_channels * 9)
    assert conv.bias is not None  # typed Optional: bias=False would leave none
    nn.init.zeros_(conv.bias)
    return conv


class ConvEncoder(nn.Sequential):
    """4 x (3x3 conv, stride 2, 32 filters, ELU): 1x42x42 -> 32x3x3 = 288 features.

    The ELUs work in place on their conv's output, which nothing else reads (a conv's backward
    needs its input): autograd then takes the ELU's gradient from its output, exp(x) = y + 1,
    instead of recomputing it from the input: 4.50 -> 3.46 ms for a rollout's four ELUs in bf16
    (results README, "The ELUs, made cheap where they were dear")."""

    def __init__(self, channels: int, size: int, width: int | None = None):
        height, width = size, size if width is None else width
        layers: list[nn.Module] = []
        for i in range(4):
            layers += [_glorot_conv(channels if i == 0 else 32, 32, 2), nn.ELU(inplace=True)]
            height, width = (height + 1) // 2, (width + 1) // 2
        super().__init__(*layers, nn.Flatten())
        self.out_features = 32 * height * width


def _orthogonal_(weight: torch.Tensor, gain: float) -> None:
    """The orthogonal init of the DQN and IMPALA lines of work (baselines, SB3, CleanRL)."""
    if not weight.is_meta:  # a size check only: torch's meta QR would fail
        nn.init.orthogonal_(weight, gain)


def _relu_conv(in_channels: int, out_channels: int, kernel: int, stride: int, padding: int = 0) -> nn.Conv2d:
    conv = nn.Conv2d(in_channels, out_channels, kernel, stride=stride, padding=padding)
    _orthogonal_(conv.weight, math.sqrt(2.0))
    assert conv.bias is not None  # typed Optional: bias=False would leave none
    nn.init.zeros_(conv.bias)
    return conv


def _relu_linear(in_features: int, out_features: int) -> nn.Linear:
    linear = nn.Linear(in_features, out_features)
    _orthogonal_(linear.weight, math.sqrt(2.0))
    nn.init.zeros_(linear.bias)
    return linear


class NatureEncoder(nn.Sequential):
    """The DQN Nature paper's network before its head: 32 8x8 convs of stride 4, 64 4x4 of stride
    2, 64 3x3 of stride 1, then 512 units, all ReLU: 1x84x84 -> 64x7x7 -> 512 features. Made for
    84x84 frames (`--image-size 84`), where it costs ~3.8x universe's multiply-adds at 42x42.

    `feeds_lstm` adds a LayerNorm on the 512 features, as ImpalaEncoder has: its unbounded ReLU
    features saturated our LSTM's gates (a dead LSTM by 152k steps of SpaceInvaders at 84x84,
    results README, "The same recipe with our LSTM core"). The feed-forward core keeps the
    paper's network, as the PPO peers run it."""

    def __init__(self, channels: int, size: int, width: int | None = None, feeds_lstm: bool = False):
        height, width = size, size if width is None else width
        given = f"{height}x{width}"
        layers: list[nn.Module] = []
        for in_channels, filters, kernel, stride in ((channels, 32, 8, 4), (32, 64, 4, 2), (64, 64, 3, 1)):
            layers += [_relu_conv(in_channels, filters, kernel, stride), nn.ReLU()]
            height, width = (height - kernel) // stride + 1, (width - kernel) // stride + 1
        if min(height, width) < 1:
            raise ValueError(f"the nature encoder needs images of at least 36x36 (got {given})")
        bound = [nn.LayerNorm(512)] if feeds_lstm else []
        super().__init__(*layers, nn.Flatten(), _relu_linear(64 * height * width, 512), nn.ReLU(), *bound)
        self.out_features = 512


class _ResidualBlock(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.first = _glorot_conv(channels, channels, 1)
        self.second = _glorot_conv(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.second(F.relu(self.first(F.relu(x))))


class ImpalaEncoder(nn.Sequential):
    """IMPALA's deep encoder (Espeholt et al. 2018): three stacks of a 3x3 conv, a 3x3 max-pool of
    stride 2 and two residual blocks (16, 32, 32 channels), then 256 units, ReLU: 1x42x42 ->
    32x6x6 -> 256 features; ~9x universe's multiply-adds at the same frame size.

    Two changes from the paper, both because the features reach an LSTM here and its gates
    saturate when they are large (a dead LSTM, no gradient through it):
    - Glorot-uniform weights, as universe's encoder. With the orthogonal init of gain sqrt(2)
      that suits a plain ReLU stack, the stacks' convs (no ReLU before the max-pool) and the six
      residual sums each grew the signal: the features started at RMS 32 on unit-variance
      frames, ~100x the Nature encoder's 0.3.
    - A LayerNorm on the 256 features. Even from a small start, training grows the residual
      stacks' gain: after 180k steps of SpaceInvaders at Adam 4e-4 the features of real
      (normalized) frames had an RMS of ~450 with every weight's norm still within 2% of its
      init, and the LSTM was dead by 85k steps with either init
      (experiments/results/atari/screen-1m-impala-orthogonal-init.md, screen-1m-impala-glorot.md).
      Universe's ELU convs stay near 0.1 over a run."""

    def __init__(self, channels: int, size: int, width: int | None = None):
        height, width = size, size if width is None else width
        layers: list[nn.Module] = []
        for in_channels, filters in ((channels, 16), (16, 32), (32, 32)):
            layers += [_glorot_conv(in_channels, filters, 1), nn.MaxPool2d(3, stride=2, padding=1),
                       _ResidualBlock(filters), _ResidualBlock(filters)]
            height, width = (height + 1) // 2, (width + 1) // 2
        super().__init__(*layers, nn.ReLU(), nn.Flatten(), _glorot_linear(32 * height * width, 256), nn.ReLU(),
                         nn.LayerNorm(256))
        self.out_features = 256


# `--encoder`: what reads images that are not small grids (Atari frames included)
IMAGE_ENCODERS: dict[str, type[ConvEncoder] | type[NatureEncoder] | type[ImpalaEncoder]] = {
    "universe": ConvEncoder, "nature": NatureEncoder, "impala": ImpalaEncoder}


def image_encoder(name: str, channels: int, height: int, width: int | None,
                  feeds_lstm: bool) -> ConvEncoder | NatureEncoder | ImpalaEncoder:
    """`--encoder name` for CxHxW images; of the three, only the Nature CNN differs when it feeds an LSTM."""
    if name == "nature":
        return NatureEncoder(channels, height, width, feeds_lstm=feeds_lstm)
    return IMAGE_ENCODERS[name](channels, height, width)


class GridEncoder(nn.Sequential):
    """A small grid at full resolution (MiniGrid's 7x7 cells, each a few numbers): two 3x3 convs
    of stride 1 and one of stride 2 (16, 32, 32 filters, ELU): 3x7x7 -> 32x4x4 = 512 features.
    ConvEncoder's four halvings would leave a 7x7 grid one cell."""

    def __init__(self, channels: int, height: int, width: int):
        layers: list[nn.Module] = []
        for in_channels, filters, stride in ((channels, 16, 1), (16, 32, 1), (32, 32, 2)):
            layers += [_glorot_conv(in_channels, filters, stride), nn.ELU(inplace=True)]
        super().__init__(*layers, nn.Flatten())
        self.out_features = 32 * ((height + 1) // 2) * ((width + 1) // 2)


class MlpEncoder(nn.Sequential):
    """Two layers (ELU or tanh) for flat observations (classic control, custom envs)."""

    def __init__(self, in_features: int, hidden: int = 128, activation: str = "elu"):
        layers: list[nn.Module] = []
        for i in range(2):
            layers += [_glorot_linear(in_features if i == 0 else hidden, hidden),
                       nn.ELU() if activation == "elu" else nn.Tanh()]
        super().__init__(*layers)
        self.out_features = hidden
        self._act = F.elu if activation == "elu" else torch.tanh
        self._linears = [m for m in self if isinstance(m, nn.Linear)]  # a plain list: no new registration

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The layers' functions called directly: a module call costs several microseconds of
        # Python, more than a 64-unit layer's arithmetic on a batch of 8 (CartPole's hot loop).
        for linear in self._linears:
            x = self._act(F.linear(x, linear.weight, linear.bias))
        return x


class PartsEncoder(nn.Module):
    """An observation of several parts (observations.ObsLayout), packed in one vector: each image
    through a conv of its own, the vectors and one-hot values together through the MLP, their
    features side by side."""

    flat_columns: torch.Tensor

    def __init__(self, layout: Any, hidden_size: int, activation: str, encoder: str = "universe",
                 feeds_lstm: bool = True):
        super().__init__()
        self.image_parts = [(part.offset, part.offset + part.size, part.shape) for part in layout.images]
        encoders = [GridEncoder(*part.shape) if part.grid
                    else image_encoder(encoder, part.shape[0], part.shape[1], part.shape[2], feeds_lstm)
                    for part in layout.images]
        self.image_encoders = nn.ModuleList(encoders)
        columns = [i for part in layout.parts if part.kind != "image"
                   for i in range(part.offset, part.offset + part.size)]
        # Not in the state dict: the layout, rebuilt from the env, says where the columns are.
        self.register_buffer("flat_columns", torch.tensor(columns, dtype=torch.long), persistent=False)
        self.flat = MlpEncoder(len(columns), hidden_size, activation) if columns else None
        self.out_features = (sum(encoder.out_features for encoder in encoders)
                             + (self.flat.out_features if self.flat is not None else 0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = [encoder(x[:, start:end].reshape(-1, *shape))
                    for (start, end, shape), encoder in zip(self.image_parts, self.image_encoders)]
        if self.flat is not None:
            features.append(self.flat(x.index_select(1, self.flat_columns)))
        return torch.cat(features, dim=1) if len(features) > 1 else features[0]


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
        self, obs_shape: tuple[int, ...], num_actions: int, lstm_size: int = 256, core: str = "lstm",
        hidden_size: int = 128, activation: str = "elu", normalize_obs: bool = False, normalize_reward: bool = False,
        value_net: str = "shared", lstm_forget_bias: float = 1.0, layout: Any = None, encoder: str = "universe",
    ):
        super().__init__()
        self.obs_shape = tuple(obs_shape)
        self.core = core
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
        # does not shape the policy's features: "separate" with the mlp core only (the LSTM's state
        # is then shared, as before the choice "mlp" existed), "mlp" with either core, the value
        # then feed-forward from the observation (an unbiased baseline without memory).
        separate = len(obs_shape) == 1 and (value_net == "mlp" or (value_net == "separate" and core == "mlp"))
        self.value_encoder = MlpEncoder(obs_shape[0], hidden_size, activation) if separate else None
        self.policy = nn.Linear(head_in, num_actions)
        self.value = nn.Linear(self.encoder.out_features if separate and core == "lstm" else head_in, 1)
        _normalized_columns_(self.policy.weight, 0.01)
        _normalized_columns_(self.value.weight, 1.0)
        nn.init.zeros_(self.policy.bias)
        nn.init.zeros_(self.value.bias)

    @property
    def lstm_size(self) -> int:
        return self.lstm.hidden_size if self.lstm is not None else 0

    def initial_state(self, batch: int = 1) -> State:
        """Zeros [1, batch, lstm_size]; with the mlp core, empty [1, batch, 0] placeholders."""
        zeros = torch.zeros(1, batch, self.lstm_size)
        return zeros, zeros.clone()

    def _normalized(self, obs: torch.Tensor) -> torch.Tensor:
        """What every encoder sees: the observation, normalized once when asked for."""
        return obs if self.obs_norm is None else self.obs_norm.normalize(obs)

    def _feedforward(
        self, obs: torch.Tensor, encoder_context: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The mlp core: logits and values of a batch of observations."""
        obs = self._normalized(obs)
        with encoder_context():
            out = self.encoder(obs).float()
        value_in = out if self.value_encoder is None else self.value_encoder(obs)
        logits = F.linear(out, self.policy.weight, self.policy.bias)
        return logits, F.linear(value_in, self.value.weight, self.value.bias).squeeze(-1)

    def step(self, obs: torch.Tensor, state: State) -> tuple[torch.Tensor, torch.Tensor, State]:
        """One step for a batch: obs [B, *obs_shape] -> logits [B, A], value [B], next state.

        The cell is written out with the LSTM's own weights because `nn.LSTM` called on a
        sequence of length 1 costs about four times as much as the arithmetic (measured:
        0.47 ms against 0.12 ms); `replay` uses the fused `nn.LSTM`, and tests check that
        both give the same numbers.
        """
        lstm = self.lstm
        if lstm is None:
            logits, value = self._feedforward(obs)
            return logits, value, state
        h, c = state[0][0], state[1][0]
        obs = self._normalized(obs)
        # nn.LSTM sets its per-layer weights by name, so they type as Tensor | Module; get_parameter
        # would cost a lookup per step.
        gates = F.linear(self.encoder(obs), lstm.weight_ih_l0, lstm.bias_ih_l0)  # type: ignore[arg-type]
        gates = gates + F.linear(h, lstm.weight_hh_l0, lstm.bias_hh_l0)  # type: ignore[arg-type]
        in_gate, forget_gate, cell_gate, out_gate = gates.chunk(4, dim=1)
        c = torch.sigmoid(forget_gate) * c + torch.sigmoid(in_gate) * torch.tanh(cell_gate)
        h = torch.sigmoid(out_gate) * torch.tanh(c)
        logits = F.linear(h, self.policy.weight, self.policy.bias)
        value_in = h if self.value_encoder is None else self.value_encoder(obs)
        value = F.linear(value_in, self.value.weight, self.value.bias).squeeze(-1)
        return logits, value, (h.unsqueeze(0), c.unsqueeze(0))

    def replay(
        self, obs: torch.Tensor, state: State, resets: torch.Tensor | None = None,
        encoder_context: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext,
        kept: KeptActivations | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Re-run a rollout: obs [T, B, *obs_shape] from `state` -> logits [T, B, A], values [T, B].

        `resets[t, b]` is True when env b started a new episode at step t, so its LSTM state is
        zeroed there. The encoder sees all T*B frames in one batch, under `encoder_context` (bf16
        autocast: `precision`), and hands the core float32; the LSTM runs fused over each
        stretch between resets. With `kept`, the ELU outputs acting computed for these frames with
        the current weights (a conv + ELU encoder only: `encoder_grad`), the encoder is not run
        again: its features are acting's, and its gradient is taken from them in `kept.dtype`.
        """
        steps, batch = obs.shape[:2]
        if self.lstm is None:
            logits, values = self._feedforward(obs.reshape(steps * batch, *obs.shape[2:]), encoder_context)
            return logits.reshape(steps, batch, -1), values.reshape(steps, batch)
        flat = self._normalized(obs.reshape(steps * batch, *obs.shape[2:]))
        if kept is not None:
            convs = conv_elu_chain(self.encoder)
            if convs is None:
                raise ValueError("kept activations are for an encoder of conv + ELU layers only")
            features = features_from_activations(convs, flat, kept).reshape(steps, batch, -1)
        else:
            with encoder_context():
                features = self.encoder(flat).float().reshape(steps, batch, -1)
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
            return self.policy(out), self.value(out).squeeze(-1)
        return self.policy(out), self.value(self.value_encoder(flat).reshape(steps, batch, -1)).squeeze(-1)


def has_conv_encoder(model: ActorCritic) -> bool:
    return any(isinstance(module, nn.Conv2d) for module in model.encoder.modules())


def build_model(obs_shape: tuple[int, ...], num_actions: int, arch: Any, layout: Any = None) -> ActorCritic:
    """The model for a run. `arch` is the run's Config (or anything with its model fields:
    lstm_size, lstm_forget_bias, core, hidden_size, activation, normalize_obs, normalize_reward,
    encoder), or a bare int, the LSTM size of universe's model. `layout`: the env's
    `EnvInfo.layout`, for packed observations."""
    if isinstance(arch, int):
        model = ActorCritic(obs_shape, num_actions, arch, layout=layout)
    else:
        model = ActorCritic(
            obs_shape, num_actions, arch.lstm_size, core=arch.core, hidden_size=arch.hidden_size,
            activation=arch.activation, normalize_obs=arch.normalize_obs, normalize_reward=arch.normalize_reward,
            value_net=arch.value_net, lstm_forget_bias=arch.lstm_forget_bias, layout=layout,
            encoder=getattr(arch, "encoder", "universe"),  # objects made before the field existed
        )
    # Channels-last conv weights run the CPU (oneDNN) kernels ~25% faster here, forward and
    # backward (measured: 7.2 -> 5.5 ms for a 20-frame replay); every copy of the model, shared
    # or local, gets the same layout so weight copies and gradient hand-off stay plain copies.
    return model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # torch's stub lacks it


def sample_actions(logits: torch.Tensor, rng: np.random.Generator) -> np.ndarray:
    """One categorical sample per row, by inverting the CDF with a uniform draw."""
    probs = torch.softmax(logits, dim=-1).numpy().astype(np.float64)
    cdf = np.cumsum(probs, axis=1)
    draws = rng.random((len(cdf), 1)) * cdf[:, -1:]
    return np.minimum((cdf < draws).sum(axis=1), cdf.shape[1] - 1)


# Every worker holds its own copy of the model and its optimizer's statistics beside the shared
# one: 50M float32 parameters are ~0.2 GB a copy, 1.6 GB for two workers; far more than any
# model here needs (the universe model has 0.6M), and a size typo then fails in one line instead
# of in an allocation that takes the machine's memory first.
MAX_PARAMETERS = 50_000_000


def model_size_problem(obs_shape: tuple[int, ...], num_actions: int, arch: Any, layout: Any = None) -> str | None:
    """Why the model of these settings is too large to build, or None; it is built on torch's
    meta device first, so nothing is allocated to find out."""
    with torch.device("meta"):
        count = sum(p.numel() for p in build_model(obs_shape, num_actions, arch, layout).parameters())
    if count <= MAX_PARAMETERS:
        return None
    return (f"lstm_size {arch.lstm_size} and hidden_size {arch.hidden_size} make a model of {count:,} parameters; "
            f"at most {MAX_PARAMETERS:,} fit (each worker holds a copy and its optimizer statistics)")
