"""The encoders: what turns an observation into the features the core reads. Universe's four
ELU convs for frames, the DQN Nature and IMPALA networks (`--encoder`), a small-grid conv, an MLP
for flat vectors, and `PartsEncoder` for observations of several parts (observations.py).

Weights start as universe's (Glorot-uniform, zero biases) unless an encoder says otherwise.
"""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F


def _glorot_uniform_(weight: torch.Tensor, fan_in: int, fan_out: int) -> None:
    bound = math.sqrt(6.0 / (fan_in + fan_out))
    nn.init.uniform_(weight, -bound, bound)


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
    instead of recomputing it from the input (results README, "The ELUs, made cheap where they
    were dear")."""

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
