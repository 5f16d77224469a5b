"""The learn step's encoder, taken from the activations acting already computed.

A worker acts on a rollout's frames with the weights it pulled at the rollout's start, and its
learner's first pass takes the gradient at those same weights (learner.py is the one reader of
this module). The replay's encoder forward would
therefore compute again what the acting forward (ONNX Runtime) already did, and it is dear (results
README, "The learn step's encoder from acting's activations").
For an encoder that is a chain of conv + ELU layers, the gradient needs no forward at all: each
conv's backward reads its input (the previous ELU's output) and each ELU's backward its own output
(d ELU = y + 1 below zero), and acting kept both.

`features_from_activations` returns the encoder's features from the kept activations, with a
backward that runs each layer's ELU and conv backward as autograd would, in the learn precision
(bf16 on CPUs that multiply it natively: the same kernels as the bf16 autocast replay). The features
the LSTM reads are the acting forward's own float32 ones, so the loss is the one of the policy that
acted. Tests check the gradients against autograd's through the encoder (`tests/test_encoder_grad.py`).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn


@dataclass
class KeptActivations:
    """What acting kept of a rollout for the learn step, the T*B frames in [t, b] order:
    `activations`, each ELU's output [T*B, C_i, H_i, W_i] in the learn precision `dtype`,
    channels-last; `features`, the last one flattened in float32, as the LSTM read it."""

    activations: list[torch.Tensor]
    features: torch.Tensor
    dtype: torch.dtype

    @classmethod
    def of_rollout(cls, arrays: Sequence[np.ndarray], nhwc: Sequence[bool], dtype: torch.dtype) -> KeptActivations:
        """From the arrays acting wrote (`OnnxRuntimeActor.step` given arrays), [T, B, C, H, W] float32, or
        [T, B, H, W, C] where `nhwc`: one copy a layer in bf16, which is the cast; none in float32."""
        activations = []
        for array, channels_last in zip(arrays, nhwc):
            frames = torch.from_numpy(array).flatten(0, 1)
            activations.append(frames.permute(0, 3, 1, 2) if channels_last else frames)
        features = activations[-1].reshape(len(activations[-1]), -1)
        return cls([tensor.to(dtype=dtype, memory_format=torch.channels_last) for tensor in activations],
                   features, dtype)


def conv_elu_chain(encoder: nn.Module) -> list[nn.Conv2d] | None:
    """The convs of an encoder made only of (Conv2d, ELU with alpha 1) pairs and a final Flatten,
    in order; None for any other encoder, whose learn step replays its forward."""
    layers = list(encoder.children()) if isinstance(encoder, nn.Sequential) else []
    if len(layers) < 3 or len(layers) % 2 == 0 or not isinstance(layers[-1], nn.Flatten):
        return None
    convs, elus = layers[:-1:2], layers[1:-1:2]
    if not all(isinstance(conv, nn.Conv2d) and conv.bias is not None and conv.padding_mode == "zeros"
               and isinstance(conv.padding, tuple) for conv in convs):
        return None
    if not all(isinstance(elu, nn.ELU) and elu.alpha == 1.0 for elu in elus):
        return None
    return convs  # type: ignore[return-value]  # checked just above


class _ConvEluChain(torch.autograd.Function):
    """Forward: the last activation, flattened (it is already computed). Backward: through each
    layer's ELU and conv, from the last to the first, giving every conv's weight and bias gradient."""

    @staticmethod
    def forward(ctx: Any, features: torch.Tensor, convs: list[nn.Conv2d], inputs: list[torch.Tensor],
                dtype: torch.dtype, *params: torch.Tensor) -> torch.Tensor:
        # Saved so that autograd refuses a backward after any of them changed in place (the
        # rollout's arrays, the weights): the gradient would silently be another one.
        ctx.save_for_backward(*inputs, *params)
        ctx.convs, ctx.dtype, ctx.layers = convs, dtype, len(inputs)
        return features.clone()

    @staticmethod
    def backward(ctx: Any, grad_features: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        convs, dtype = ctx.convs, ctx.dtype
        inputs, weights = list(ctx.saved_tensors[:ctx.layers]), ctx.saved_tensors[ctx.layers::2]
        grads: list[torch.Tensor | None] = [None] * (2 * len(convs))
        # inputs[i] is conv i's input; inputs[i + 1] its ELU's output, and inputs[-1] the last one's.
        grad = grad_features.reshape(inputs[-1].shape).to(dtype)
        for i in reversed(range(len(convs))):
            conv = convs[i]
            grad = torch.ops.aten.elu_backward(grad, 1.0, 1, 1, True, inputs[i + 1])
            grad_input, grad_weight, grad_bias = torch.ops.aten.convolution_backward(
                grad, inputs[i], weights[i].to(dtype), [conv.out_channels], list(conv.stride),
                list(conv.padding), list(conv.dilation), False, [0, 0], conv.groups, [i > 0, True, True])
            grads[2 * i] = grad_weight.to(weights[i].dtype)
            grads[2 * i + 1] = grad_bias.to(weights[i].dtype)
            grad = grad_input
        return (None, None, None, None, *grads)


def features_from_activations(convs: list[nn.Conv2d], encoder_input: torch.Tensor,
                              kept: KeptActivations) -> torch.Tensor:
    """The encoder's features [N, F] for `encoder_input` [N, C, H, W] (what the first conv reads,
    normalized), given each ELU's output as acting computed it with the convs' current weights.
    The gradient reaches every conv's weight and bias, computed in `kept.dtype` (float32, or
    bfloat16 as the learn step's encoder precision)."""
    if len(kept.activations) != len(convs):
        raise ValueError(f"{len(kept.activations)} activations for an encoder of {len(convs)} convs")
    dtype = kept.dtype
    # Channels-last in the learn precision: what oneDNN's conv backward reads fastest, and the
    # layout of the convs' weights (`model.build_model`). No copy when they are so already.
    inputs = [tensor.to(dtype=dtype, memory_format=torch.channels_last)
              for tensor in (encoder_input, *kept.activations)]
    params = [tensor for conv in convs for tensor in (conv.weight, conv.bias)]
    return _ConvEluChain.apply(kept.features, convs, inputs, dtype, *params)
