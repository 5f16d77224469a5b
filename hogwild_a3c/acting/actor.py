"""The acting seam: what runs the model's acting forward (`ActorCritic.step`) for a worker or the
evaluator.

`--act-backend torch` calls the model itself. `--act-backend onnxruntime` runs the same step as a
compiled graph (`onnx_backend`); nothing outside that module knows about ONNX. The learn step
stays in torch either way.

Hogwild's semantics fix which weights a worker acts with (those it pulled at the start of its
rollout), not how the forward runs: so `refresh()` is called right after each pull, and an actor
acts with what the model held then until the next one.

`auto`, the default, takes ONNX Runtime for models with a conv encoder and an LSTM core when it
is installed, and torch otherwise: small MLPs gain nothing from it. Its speed against torch's is
measured in the results README, "The acting forward in a compiled runtime".

A worker's actor may keep what its learner asks for (`keep_activations`): the encoder's ELU
outputs, which a learner can take the encoder's gradient from instead of running its forward again
(learning/learner.py). An actor that cannot keep them says so (`keeps_activations` False), and the
learner then replays the encoder.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch

from ..learning.model import ActorCritic, State, has_conv_encoder
from . import onnx_backend


class Actor(Protocol):
    name: str
    keeps_activations: bool  # whether `step` writes the encoder's ELU outputs where it is told
    activation_shapes: list[tuple[int, ...]]  # of each, for one frame; empty when none are kept
    activations_nhwc: list[bool]  # whether each is written channels-last (NHWC) rather than NCHW

    def refresh(self) -> None:
        """Take the model's current weights (after a pull); until the next call, `step` uses them."""

    def step(self, obs: torch.Tensor, state: State, into: Sequence[np.ndarray] = ()
             ) -> tuple[torch.Tensor, torch.Tensor, State]:
        """What `ActorCritic.step` returns (the action distribution's parameters, the value, the
        next state), for the weights of the last `refresh`; an actor that keeps activations writes
        them into `into` when given (arrays [B, *activation_shapes[i]])."""


class TorchActor:
    name = "torch"
    keeps_activations = False

    def __init__(self, model: ActorCritic):
        self.model = model
        self.activation_shapes: list[tuple[int, ...]] = []
        self.activations_nhwc: list[bool] = []

    def refresh(self) -> None:
        pass  # the model is the weights

    def step(self, obs: torch.Tensor, state: State, into: Sequence[np.ndarray] = ()
             ) -> tuple[torch.Tensor, torch.Tensor, State]:
        return self.model.step(obs, state)


def chosen_backend(requested: str, model: ActorCritic) -> tuple[str, str]:
    """The backend `requested` resolves to for this model, and why, in words for train.log."""
    if requested == "torch":
        return "torch", "--act-backend torch"
    if requested == "onnxruntime":
        return "onnxruntime", "--act-backend onnxruntime"
    if onnx_backend.unsupported(model) is not None or not has_conv_encoder(model):
        return "torch", "--act-backend auto: the model has no conv encoder with an LSTM core, where ONNX Runtime gains"
    if not onnx_backend.installed():
        return "torch", ("--act-backend auto: onnxruntime is not installed, so acting runs in torch, slower a forward "
                         "on Atari frames (pip install 'hogwild-a3c[onnx]')")
    return "onnxruntime", "--act-backend auto: a conv encoder with an LSTM core, and onnxruntime is installed"


def request_problem(requested: str, model: ActorCritic) -> str | None:
    """A one-line error for a backend asked for by name that cannot act for this run, or None."""
    if requested != "onnxruntime":
        return None
    if not onnx_backend.installed():
        return ("--act-backend onnxruntime: onnxruntime is not installed (pip install 'hogwild-a3c[onnx]'); "
                "or use --act-backend torch or auto")
    problem = onnx_backend.unsupported(model)
    return None if problem is None else f"--act-backend onnxruntime: {problem}; use --act-backend torch or auto"


# The trial forward at start-up must agree with torch's this closely, or acting stays in torch.
TRIAL_TOLERANCE = 1e-4


def resolve(requested: str, model: ActorCritic) -> tuple[str, str]:
    """The backend every child of this run acts with, and the train.log line that says why. A
    compiled backend is tried once here, on a fresh model of the run's shape and random inputs,
    against torch: a model it cannot run, or computes differently, falls back to torch."""
    name, why = chosen_backend(requested, model)
    if name == "torch":
        return name, f"acting in torch ({why})"
    try:
        difference = onnx_backend.trial_difference(model)
    except Exception as exc:  # noqa: BLE001 - any export or runtime failure means: act in torch
        return "torch", f"acting in torch: ONNX Runtime could not run this model's step ({type(exc).__name__}: {exc})"
    if not difference <= TRIAL_TOLERANCE:
        return "torch", (f"acting in torch: ONNX Runtime's step differs from torch's by {difference:.2g} "
                         f"(more than {TRIAL_TOLERANCE:g})")
    return name, f"acting in {onnx_backend.version()} ({why})"


def make_actor(requested: str, model: ActorCritic, keep_activations: bool = False) -> Actor:
    """The actor for `model` (a worker's or the evaluator's local copy). Children get the name
    `resolve` chose in the main process, so "auto" is resolved here only when called directly.
    `keep_activations`: what a worker's learner asks for; ONNX Runtime's actor keeps them, torch's
    (the fallback) does not, and the learner then replays the encoder."""
    name = chosen_backend(requested, model)[0] if requested == "auto" else requested
    if name == "onnxruntime":
        return onnx_backend.OnnxRuntimeActor(model, keep_activations)
    return TorchActor(model)
