"""The optimizers a worker applies to the shared weights, with their statistics in shared memory,
and the learning-rate schedule they follow.

`--optimizer adam` (universe) gives each worker its own Adam statistics; `shared-adam` one set
for all. `rmsprop` and `shared-rmsprop` are the A3C paper's RMSprop (decay 0.99, epsilon 0.1;
the paper found the shared statistics the more robust). Adam is torch's fused kernel and RMSprop
torch's `_foreach` operations, called directly, never through a `torch.optim` optimizer: building
one imports `torch._dynamo`, which was most of a worker's start-up on classic control. The
arithmetic is checked against `torch.optim.Adam` and `torch.optim.RMSprop`
in tests/test_hogwild.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn

ADAM_KINDS = ("adam", "shared-adam")
RMSPROP_KINDS = ("rmsprop", "shared-rmsprop")
OPTIMIZER_KINDS = ADAM_KINDS + RMSPROP_KINDS
# The A3C paper's RMSprop: decay 0.99 and an epsilon of 0.1, large against Adam's 1e-8, so a
# weight whose gradients have been small does not get a huge step.
RMSPROP_ALPHA = 0.99
RMSPROP_EPS = 0.1


def is_shared_kind(kind: str) -> bool:
    """Whether every worker updates through one set of statistics (else one set per worker)."""
    return kind.startswith("shared-")


def moment_keys(kind: str) -> tuple[str, ...]:
    """The per-parameter statistics an optimizer of this kind keeps, besides its step counters;
    the last one is a second moment (never negative)."""
    return ("exp_avg", "exp_avg_sq") if kind in ADAM_KINDS else ("square_avg",)


def new_optimizer_state(model: nn.Module, kind: str) -> dict[str, Any]:
    """An optimizer's statistics for `model` in shared memory: one step counter per parameter
    (0-d views of one vector) and the moment estimates."""
    params = list(model.parameters())
    state: dict[str, Any] = {"step": torch.zeros(len(params), dtype=torch.float32).share_memory_()}
    for key in moment_keys(kind):
        state[key] = [torch.zeros_like(p).share_memory_() for p in params]
    return state


@dataclass(frozen=True)
class LrSchedule:
    """The learning rate of an update: `lr`, raised linearly from 0 over an optimizer's first
    `warmup_updates` updates (counted by its own step counter, so a resumed run, whose counters
    are restored, does not warm up again), and lowered linearly to 0 at `decay_steps` global
    agent steps (the A3C paper anneals to 0 over the run) and at `decay_seconds` of run time,
    which began at the wall-clock time `time_origin` (so a resumed run goes on along its line).
    0 turns each off."""

    lr: float
    warmup_updates: int = 0
    decay_steps: int = 0
    decay_seconds: float = 0.0
    time_origin: float = 0.0

    @property
    def constant(self) -> bool:
        """No warm-up and no decay: every update's rate is `lr`, so the caller need not count anything."""
        return not (self.warmup_updates or self.decay_steps or self.decay_seconds)

    def at(self, update: float, global_step: int, wall_time: float = 0.0) -> float:
        """The learning rate of update number `update` (counted from 1) at `global_step` and at
        the wall-clock time `wall_time`."""
        lr = self.lr
        if 0 < self.warmup_updates and update < self.warmup_updates:
            lr *= update / self.warmup_updates
        if self.decay_steps > 0:
            lr *= max(0.0, 1.0 - global_step / self.decay_steps)
        if self.decay_seconds > 0:
            lr *= min(1.0, max(0.0, 1.0 - (wall_time - self.time_origin) / self.decay_seconds))
        return lr


class SharedOptimizer:
    """What both optimizers share: the step counters in shared memory and the choice of the
    parameters that got a gradient; each subclass's `_update` is its arithmetic."""

    def __init__(self, params: list[nn.Parameter], state: dict[str, Any]):
        self.params = params
        self.step_counts = state["step"]
        self.steps = [state["step"][i] for i in range(len(params))]  # 0-d views of one shared vector

    def next_update(self) -> float:
        """The number the next update will have, counted from 1 (for a warm-up); the most any
        parameter has had, as one the loss never reached keeps its count."""
        return float(self.step_counts.max()) + 1.0

    @torch.no_grad()
    def step(self, lr: float) -> None:
        # A parameter the loss did not reach keeps its statistics and its step count, as in torch.
        have = [i for i, p in enumerate(self.params) if p.grad is not None]
        if have:
            self._update(have, lr)

    def _update(self, have: list[int], lr: float) -> None:
        raise NotImplementedError


class SharedAdam(SharedOptimizer):
    """Adam whose statistics live in the given (shared) tensors. The update is torch's fused CPU
    Adam kernel (one pass per tensor, a third of the per-op loop's time on the universe model), the
    very call `torch.optim.Adam(fused=True)` makes.

    Why a warm-up can help Adam: its first updates divide by a second moment estimated from a
    handful of gradients, so they are close to lr * sign(gradient) for every weight at once. On
    Pong it did not stop the networks that died (results README); normalized frames did.
    """

    def __init__(self, params: list[nn.Parameter], state: dict[str, Any],
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        super().__init__(params, state)
        self.betas, self.eps = betas, eps
        self.exp_avgs = state["exp_avg"]
        self.exp_avg_sqs = state["exp_avg_sq"]

    def _update(self, have: list[int], lr: float) -> None:
        steps = [self.steps[i] for i in have]
        torch._foreach_add_(steps, 1)
        torch._fused_adam_(
            [self.params[i] for i in have], cast("list[torch.Tensor]", [self.params[i].grad for i in have]),
            [self.exp_avgs[i] for i in have], [self.exp_avg_sqs[i] for i in have], [], steps,
            lr=lr, beta1=self.betas[0], beta2=self.betas[1], weight_decay=0.0, eps=self.eps,
            amsgrad=False, maximize=False,
        )


class SharedRMSprop(SharedOptimizer):
    """RMSprop (no momentum, not centred) whose running mean of squared gradients lives in the
    given (shared) tensors: torch's form, epsilon added after the square root."""

    def __init__(self, params: list[nn.Parameter], state: dict[str, Any],
                 alpha: float = RMSPROP_ALPHA, eps: float = RMSPROP_EPS):
        super().__init__(params, state)
        self.alpha, self.eps = alpha, eps
        self.square_avgs = state["square_avg"]

    def _update(self, have: list[int], lr: float) -> None:
        params: list[torch.Tensor] = [self.params[i] for i in have]
        grads = cast("list[torch.Tensor]", [p.grad for p in params])
        square_avgs = [self.square_avgs[i] for i in have]
        torch._foreach_add_([self.steps[i] for i in have], 1)
        torch._foreach_mul_(square_avgs, self.alpha)
        torch._foreach_addcmul_(square_avgs, grads, grads, value=1.0 - self.alpha)
        denominators = torch._foreach_sqrt(square_avgs)
        torch._foreach_add_(denominators, self.eps)
        torch._foreach_addcdiv_(params, grads, denominators, value=-lr)


def build_optimizer(kind: str, params: list[nn.Parameter], state: dict[str, Any]) -> SharedOptimizer:
    return SharedAdam(params, state) if kind in ADAM_KINDS else SharedRMSprop(params, state)
