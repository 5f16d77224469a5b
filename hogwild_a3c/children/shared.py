"""Shared training state, and the seam through which children reach it.

The worker talks to the training state only through a `WorkerLink`, and the evaluator only
through an `EvaluatorLink`; both are Protocols. `HogwildLink` and `HogwildEvaluatorLink`
implement them over one machine's shared memory, lock-free. Another backend implements the same
methods (the tests drive a real `Worker` through an in-memory link that records its calls).

Nothing a child can leave locked stands between the main process and its shutdown: the stop
request is a flag in shared memory that children poll, liveness is a heartbeat each child
writes into its own slot, and reports travel on one pipe per child (`reports.py`).
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch
from torch import nn

from ..learning.lstm_watch import LstmHealth
from ..learning.optim import LrSchedule, build_optimizer, is_shared_kind, new_optimizer_state
from .messages import EpisodeEnded, Evaluated, WriteFailed

if TYPE_CHECKING:
    from ..learning.model import RunningMoments

# Columns of the per-worker statistics table (float64, one row per worker slot). Each worker
# writes only its own row, so no lock is needed; the main process reads every row.
STAT_NAMES = (
    "policy_loss",
    "value_loss",
    "entropy",
    "grad_norm",
    "updates",
    "skipped_updates",
    "skipped_in_a_row",
    "env_errors",
)
STAT = {name: i for i, name in enumerate(STAT_NAMES)}
NOT_READY = 0.0  # a heartbeat slot's value until its child says it is ready


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
    for d_buffer, s_buffer in zip(dst.buffers(), src.buffers()):
        d_buffer.copy_(s_buffer)


@dataclass
class SharedState:
    """Every tensor the main process shares with its children, handed over when each starts."""

    model: nn.Module
    optimizer_states: list[dict[str, Any]]
    worker_steps: torch.Tensor  # int64 [slots], agent steps done by each worker slot
    worker_stats: torch.Tensor  # float64 [slots, len(STAT_NAMES)]
    heartbeats: torch.Tensor  # float64 [slots + 1]: each worker's slot, then the evaluator's
    base_step: torch.Tensor  # int64 [1], steps done before this session (resume)
    control: torch.Tensor  # int64 [1]: non-zero once the main process (or, multi-node, any node) asks children to stop
    optimizer: str  # one of optim.OPTIMIZER_KINDS
    lr_schedule: LrSchedule
    sync: Any = None  # multi-node: the syncer's `SyncStatus` (the global step over every node)

    @classmethod
    def create(cls, model: nn.Module, slots: int, optimizer: str, lr_schedule: LrSchedule) -> SharedState:
        model.share_memory()
        states = [new_optimizer_state(model, optimizer) for _ in range(1 if is_shared_kind(optimizer) else slots)]
        return cls(
            model=model,
            optimizer_states=states,
            worker_steps=torch.zeros(slots, dtype=torch.int64).share_memory_(),
            worker_stats=torch.zeros(slots, len(STAT_NAMES), dtype=torch.float64).share_memory_(),
            heartbeats=torch.zeros(slots + 1, dtype=torch.float64).share_memory_(),
            base_step=torch.zeros(1, dtype=torch.int64).share_memory_(),
            control=torch.zeros(1, dtype=torch.int64).share_memory_(),
            optimizer=optimizer,
            lr_schedule=lr_schedule,
        )

    @property
    def evaluator_slot(self) -> int:
        return len(self.heartbeats) - 1

    def global_step(self) -> int:
        local = int(self.worker_steps.sum())
        # Multi-node, once the nodes agreed on the start (a syncer that failed before that agreed nothing).
        if self.sync is not None and int(self.sync.state[0]) != 0 and int(self.sync.source_rank[0]) >= 0:
            return self.sync.node_global_step(local)
        return int(self.base_step[0]) + local

    def request_stop(self) -> None:
        self.control[0] = 1

    def stop_requested(self) -> bool:
        return bool(self.control[0])

    def optimizer_state_for(self, rank: int) -> dict[str, Any]:
        return self.optimizer_states[0 if len(self.optimizer_states) == 1 else rank]

    def for_child(self, rank: int | None) -> SharedState:
        """What one child needs: a worker gets only its own optimizer statistics, the evaluator
        none, so each process maps only the shared memory it uses."""
        states = [] if rank is None else [self.optimizer_state_for(rank)]
        return dataclasses.replace(self, optimizer_states=states)

    def snapshot_weights(self) -> dict[str, torch.Tensor]:
        """A private copy of the shared weights, to inspect or save.

        Never test the live tensors: `torch.isfinite` reads an element more than once, and an
        element a worker rewrites in between looks non-finite. Measured here: a third process
        watching one Adam writer saw 16-33 false NaNs in 20 s on the live tensor and none on a
        copy; a Pong run was once stopped at 1.6M steps by exactly that.
        """
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}


class Reports(Protocol):
    def send(self, message: Any) -> None: ...


class WorkerLink(Protocol):
    """Everything a worker does to the training state, and nothing else:

    - `pull(local_model)`: copy the current weights into the local model;
    - `push(local_model)`: apply the local model's gradients (the link owns the optimizer);
    - `add_steps(n)` / `global_step()`: count agent steps, read the total over all workers;
    - `record_update(...)` / `count(stat)`: update statistics and fault counters;
    - `merge_statistics(obs, returns)`: fold a rollout into the running observation/return
      statistics of models that normalize (either may be None);
    - `report_episode(return, length)`: an episode ended;
    - `heartbeat()`: alive and making progress (the first call also says "ready");
    - `should_stop()`: whether the run is stopping.
    """

    def pull(self, local_model: nn.Module) -> None: ...
    def push(self, local_model: nn.Module) -> None: ...
    def add_steps(self, steps: int) -> None: ...
    def global_step(self) -> int: ...
    def record_update(self, policy_loss: float, value_loss: float, entropy: float, grad_norm: float) -> None: ...
    def count(self, stat: str) -> None: ...
    def merge_statistics(self, obs: Any, returns: Any) -> None: ...
    def report_episode(self, episode_return: float, length: int) -> None: ...
    def heartbeat(self) -> None: ...
    def should_stop(self) -> bool: ...


class HogwildLink:
    """`WorkerLink` over one machine's shared memory: lock-free, each worker writing its own slots."""

    def __init__(self, shared: SharedState, rank: int, reports: Reports):
        self.shared = shared
        self.rank = rank
        self.reports = reports
        self.stats = shared.worker_stats[rank]
        params = list(shared.model.parameters())
        self.optimizer = build_optimizer(shared.optimizer, params, shared.optimizer_state_for(rank))
        self.schedule = shared.lr_schedule

    def pull(self, local_model: nn.Module) -> None:
        copy_weights(local_model, self.shared.model)

    def push(self, local_model: nn.Module) -> None:
        hand_over_gradients(local_model, self.shared.model)
        schedule = self.schedule
        if schedule.constant:  # the usual case: no shared counters read per update
            self.optimizer.step(schedule.lr)
        else:
            self.optimizer.step(schedule.at(self.optimizer.next_update(), self.global_step(), time.time()))

    def add_steps(self, steps: int) -> None:
        self.shared.worker_steps[self.rank] += steps

    def global_step(self) -> int:
        return self.shared.global_step()

    def record_update(self, policy_loss: float, value_loss: float, entropy: float, grad_norm: float) -> None:
        row = self.stats
        row[STAT["policy_loss"]] = policy_loss
        row[STAT["value_loss"]] = value_loss
        row[STAT["entropy"]] = entropy
        row[STAT["grad_norm"]] = grad_norm
        row[STAT["updates"]] += 1
        row[STAT["skipped_in_a_row"]] = 0
        self.heartbeat()

    def count(self, stat: str) -> None:
        self.stats[STAT[stat]] += 1
        if stat == "skipped_updates":
            self.stats[STAT["skipped_in_a_row"]] += 1
        self.heartbeat()

    def merge_statistics(self, obs: Any, returns: Any) -> None:
        # Into the shared model's buffers, lock-free like the weights: workers pull them with them.
        # A model that reports statistics has the norms (typed only as submodules of nn.Module).
        if obs is not None:
            cast("RunningMoments", self.shared.model.obs_norm).merge_(obs)
        if returns is not None:
            cast("RunningMoments", self.shared.model.return_norm).merge_(returns)

    def report_episode(self, episode_return: float, length: int) -> None:
        self.reports.send(EpisodeEnded(self.rank, self.global_step(), float(episode_return), int(length), time.time()))

    def heartbeat(self) -> None:
        self.shared.heartbeats[self.rank] = time.time()

    def should_stop(self) -> bool:
        return self.shared.stop_requested()


class EvaluatorLink(Protocol):
    """What the evaluator does to the training state: `snapshot(model)` copies the current
    weights into its own model, `global_step()`, `report_evaluation(...)`,
    `report_write_failure(message)` (best.pt could not be written), `heartbeat()` and
    `should_stop()` as for workers."""

    def snapshot(self, model: nn.Module) -> None: ...
    def global_step(self) -> int: ...
    def report_evaluation(
        self, global_step: int, episodes: list[tuple[float, int]], lstm: LstmHealth | None = None
    ) -> None: ...
    def report_write_failure(self, message: str) -> None: ...
    def heartbeat(self) -> None: ...
    def should_stop(self) -> bool: ...


class HogwildEvaluatorLink:
    """`EvaluatorLink` over one machine's shared memory."""

    def __init__(self, shared: SharedState, reports: Reports):
        self.shared = shared
        self.reports = reports

    def snapshot(self, model: nn.Module) -> None:
        copy_weights(model, self.shared.model)

    def global_step(self) -> int:
        return self.shared.global_step()

    def report_evaluation(
        self, global_step: int, episodes: list[tuple[float, int]], lstm: LstmHealth | None = None
    ) -> None:
        self.reports.send(Evaluated(global_step, time.time(), tuple(episodes), lstm))

    def report_write_failure(self, message: str) -> None:
        self.reports.send(WriteFailed("evaluator", message))

    def heartbeat(self) -> None:
        self.shared.heartbeats[self.shared.evaluator_slot] = time.time()

    def should_stop(self) -> bool:
        return self.shared.stop_requested()


@dataclass
class HogwildLinkFactory:
    """Builds a child's link inside the child (a link holds an optimizer and an open pipe, which
    are not sent across processes). `connection` is the child's end of its report pipe."""

    shared: SharedState
    connection: Any

    def _reports(self) -> Reports:
        if "_writer" not in self.__dict__:
            from .reports import ReportWriter

            self._writer = ReportWriter(self.connection)
        return self._writer

    def worker_link(self, rank: int) -> HogwildLink:
        return HogwildLink(self.shared, rank, self._reports())

    def evaluator_link(self) -> HogwildEvaluatorLink:
        return HogwildEvaluatorLink(self.shared, self._reports())

    def report(self, message: Any) -> None:
        self._reports().send(message)


@dataclass
class InProcessLinkFactory:
    """The same links for children that run inside the main process (serial mode)."""

    shared: SharedState
    reports: Reports

    def worker_link(self, rank: int) -> HogwildLink:
        return HogwildLink(self.shared, rank, self.reports)

    def evaluator_link(self) -> HogwildEvaluatorLink:
        return HogwildEvaluatorLink(self.shared, self.reports)

    def report(self, message: Any) -> None:
        self.reports.send(message)
