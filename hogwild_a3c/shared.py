"""Shared state and the worker's only doorway to it.

Workers touch shared state in exactly four ways: pull the latest weights, push gradients
(through an optimizer), count steps, and report episodes and update statistics. `HogwildLink`
implements those over shared memory; another backend (torch.distributed, Ray) could implement
the same methods without touching the worker loop.
"""
from __future__ import annotations

import dataclasses
import queue
import threading
import time
from types import SimpleNamespace
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

# Columns of the per-worker statistics table (float64, one row per worker slot). Each worker
# writes only its own row, so no lock is needed; the main process reads every row.
STAT_NAMES = (
    "policy_loss",
    "value_loss",
    "entropy",
    "grad_norm",
    "updates",
    "skipped_updates",
    "env_errors",
    "heartbeat",
)
STAT = {name: i for i, name in enumerate(STAT_NAMES)}


def hand_over_gradients(local_model: nn.Module, shared_model: nn.Module) -> None:
    """Point each shared parameter's `.grad` at the local gradient, so an optimizer built over
    the shared parameters applies this worker's gradient to shared memory.

    Why this is needed: `share_memory_()` shares a tensor's *data*, not its Python object. The
    `.grad` attribute of a shared parameter in a worker is that worker's own; a gradient computed
    on the local model never reaches the shared parameters unless it is attached here, in the
    worker, before every optimizer step. Aliasing (no copy) is safe because the next backward
    writes fresh gradients into the local model.
    """
    for local, shared in zip(local_model.parameters(), shared_model.parameters()):
        shared.grad = local.grad


@torch.no_grad()
def copy_weights(dst: nn.Module, src: nn.Module) -> None:
    """In-place copy of every parameter and buffer (cheaper than load_state_dict's dict build)."""
    for d, s in zip(dst.parameters(), src.parameters()):
        d.copy_(s)
    for d, s in zip(dst.buffers(), src.buffers()):
        d.copy_(s)


def new_adam_state(model: nn.Module) -> dict[str, Any]:
    """Adam's statistics for `model` in shared memory: one step counter per parameter (0-d views
    of one vector) and the two moment estimates."""
    params = list(model.parameters())
    steps = torch.zeros(len(params), dtype=torch.float32).share_memory_()
    return {
        "step": steps,
        "exp_avg": [torch.zeros_like(p).share_memory_() for p in params],
        "exp_avg_sq": [torch.zeros_like(p).share_memory_() for p in params],
    }


def adam_over(params: list[nn.Parameter], state: dict[str, Any], lr: float) -> torch.optim.Adam:
    """A torch Adam over `params` whose statistics live in the given (shared) tensors.

    Adam only initialises a parameter's state when it is empty, so filling it with tensors that
    live in shared memory makes every update land there: per worker for `--optimizer adam`
    (the seed: each worker has its own Adam), one for all for `--optimizer shared-adam`.
    """
    # The fused CPU kernel does the whole update in one pass per tensor: 0.7 ms against 1.9 ms
    # for the per-op loop on the universe model, measured here.
    optimizer = torch.optim.Adam(params, lr=lr, fused=True)
    for i, p in enumerate(params):
        optimizer.state[p] = {
            "step": state["step"][i],
            "exp_avg": state["exp_avg"][i],
            "exp_avg_sq": state["exp_avg_sq"][i],
        }
    return optimizer


def in_process_context() -> SimpleNamespace:
    """Stand-ins for a multiprocessing context when everything runs in one process (serial mode)."""
    return SimpleNamespace(Event=threading.Event, Queue=queue.Queue)


@dataclass
class SharedState:
    """Everything the main process hands to children at start (shared tensors and queues)."""

    model: nn.Module
    optimizer_states: list[dict[str, Any]]
    worker_steps: torch.Tensor  # int64 [slots], agent steps done by each worker slot
    worker_stats: torch.Tensor  # float64 [slots, len(STAT_NAMES)]
    base_step: torch.Tensor  # int64 [1], steps done before this session (resume)
    stop_event: Any
    queue: Any
    lr: float

    @classmethod
    def create(cls, model: nn.Module, slots: int, optimizer: str, lr: float, ctx: Any) -> "SharedState":
        model.share_memory()
        states = [new_adam_state(model) for _ in range(1 if optimizer == "shared-adam" else slots)]
        return cls(
            model=model,
            optimizer_states=states,
            worker_steps=torch.zeros(slots, dtype=torch.int64).share_memory_(),
            worker_stats=torch.zeros(slots, len(STAT_NAMES), dtype=torch.float64).share_memory_(),
            base_step=torch.zeros(1, dtype=torch.int64).share_memory_(),
            stop_event=ctx.Event(),
            queue=ctx.Queue(),
            lr=lr,
        )

    def global_step(self) -> int:
        return int(self.base_step[0]) + int(self.worker_steps.sum())

    def optimizer_state_for(self, rank: int) -> dict[str, Any]:
        return self.optimizer_states[0 if len(self.optimizer_states) == 1 else rank]

    def for_child(self, rank: int | None) -> "SharedState":
        """What one child needs: a worker gets only its own optimizer statistics, the evaluator
        none, so each process maps only the shared memory it uses."""
        states = [] if rank is None else [self.optimizer_state_for(rank)]
        return dataclasses.replace(self, optimizer_states=states)


class HogwildLink:
    """A worker's touch points with shared state, over shared memory (lock-free)."""

    def __init__(self, shared: SharedState, rank: int):
        self.shared = shared
        self.rank = rank
        self.stats = shared.worker_stats[rank]

    def make_optimizer(self) -> torch.optim.Optimizer:
        params = list(self.shared.model.parameters())
        return adam_over(params, self.shared.optimizer_state_for(self.rank), self.shared.lr)

    def pull(self, local_model: nn.Module) -> None:
        copy_weights(local_model, self.shared.model)

    def push(self, local_model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        hand_over_gradients(local_model, self.shared.model)
        optimizer.step()

    def add_steps(self, steps: int) -> None:
        self.shared.worker_steps[self.rank] += steps

    def global_step(self) -> int:
        return self.shared.global_step()

    def report_episode(self, episode_return: float, length: int) -> None:
        self.shared.queue.put(("episode", self.rank, self.global_step(), float(episode_return), int(length)))

    def report_update(self, policy_loss: float, value_loss: float, entropy: float, grad_norm: float) -> None:
        row = self.stats
        row[STAT["policy_loss"]] = policy_loss
        row[STAT["value_loss"]] = value_loss
        row[STAT["entropy"]] = entropy
        row[STAT["grad_norm"]] = grad_norm
        row[STAT["updates"]] += 1
        self.heartbeat()

    def count(self, stat: str) -> None:
        self.stats[STAT[stat]] += 1
        self.heartbeat()

    def heartbeat(self) -> None:
        self.stats[STAT["heartbeat"]] = time.time()

    def should_stop(self) -> bool:
        return self.shared.stop_event.is_set()
