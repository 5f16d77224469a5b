"""The precision of the learn step's encoder: bfloat16 where the CPU multiplies it natively.

The learn step re-runs the rollout's frames through the encoder with autograd, or, where acting kept
the encoder's activations (`encoder_grad`), runs only its backward from them; either way the
encoder's work is most of a worker's compute after the env (a conv backward alone is a third of
the profile).
Under bf16 autocast the encoder's convolutions run at twice float32's rate on a CPU
with AVX-512 BF16 or AMX, while the LSTM, the heads, the loss, the gradients, the master weights
and the optimizer stay float32: the recurrence is where rounding would compound over a rollout,
and it is a small part of the cost. Without native bf16 the CPU emulates it, slower than float32,
so `auto` keeps float32 there.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager

import torch

from ..files.machine import cpu
from .model import ActorCritic, has_conv_encoder


def native_bf16() -> bool:
    """Whether this CPU has bf16 arithmetic (AVX-512 BF16 or AMX) for oneDNN's kernels."""
    found = cpu()
    return bool(found["avx512_bf16"] or found["amx"])


def resolve(requested: str, model: ActorCritic) -> tuple[str, str]:
    """The encoder precision of this machine's learn steps, and the train.log line that says why."""
    if requested != "auto":
        native = "" if requested != "bf16" or native_bf16() else (
            "; this CPU has no AVX-512 BF16 or AMX, so bf16 is emulated and slower than float32")
        return requested, f"learning with the encoder in {requested} (--learn-precision {requested}{native})"
    if not has_conv_encoder(model):
        return "float32", "learning in float32 (--learn-precision auto: no conv encoder, where bf16 gains)"
    if not native_bf16():
        return "float32", "learning in float32 (--learn-precision auto: this CPU has no AVX-512 BF16 or AMX)"
    return "bf16", ("learning with the encoder in bf16 (--learn-precision auto: a conv encoder, and this CPU has "
                    "AVX-512 BF16 or AMX; the LSTM, heads, gradients and optimizer stay float32)")


def encoder_context(precision: str) -> Callable[[], AbstractContextManager[object]]:
    """What the learn step's encoder forward runs under for `precision` (resolved: float32 or bf16)."""
    if precision == "bf16":
        return lambda: torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext


def learn_dtype(precision: str) -> torch.dtype:
    """The dtype of the encoder's gradient taken from kept activations (`encoder_grad`) for `precision`."""
    return torch.bfloat16 if precision == "bf16" else torch.float32
