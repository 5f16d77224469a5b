"""The supervisor: starts the children, reads their reports, notices deaths and stalls, applies
the restart rules, and stops them.

`ProcessChildren` runs the workers and the evaluator as processes; `InProcessChildren` runs one
worker and the evaluator inside the main process (serial mode: exactly repeatable, debuggable
with pdb). The session's loop (`run_loop.py`) drives either through the same methods: `start`,
`advance`, `events`, `check`, `stop`, `worker_pids`, `evaluator_pid`. What the supervisor has to
say (a restart, a stall, a child that died for good) it reports as events (`Said`, `MustStop`,
`PidsChanged`) beside the children's own reports; it holds no reference to the session.

Restart rules: a dead worker stops the run, unless `--max-worker-restarts` allows restarting it
(it keeps its step counter and optimizer statistics, which live in shared memory). A dead evaluator
holds no training state: it is restarted, `--max-evaluator-restarts` times in all; once more
stops the run. A child that makes no progress for `--stall-timeout` seconds, counted from when
it said it was ready, is reported (and again when it recovers).
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Union, cast

from ..config import Config
from ..envs.make import EnvInfo
from ..learning.model import RunningMoments
from .evaluator import Evaluator, evaluator_main, evaluator_seed
from .messages import Event, MustStop, PidsChanged, Said
from .process import one_thread_per_child
from .reports import InProcessReports, ReportReader, report_pipe
from .shared import NOT_READY, HogwildLinkFactory, InProcessLinkFactory, SharedState
from .worker import Worker, worker_main, worker_seed

SUPERVISE_PERIOD_S = 0.25
JOIN_GRACE_S = 10.0
KILL_WAIT_S = 2.0


class Role(Enum):
    WORKER = "worker"
    EVALUATOR = "evaluator"
    SYNCER = "syncer"


@dataclass
class Child:
    role: Role
    rank: int
    process: Any
    reports: ReportReader
    heartbeat_slot: int
    stalled: bool = False

    @property
    def name(self) -> str:
        return f"worker {self.rank}" if self.role is Role.WORKER else self.role.value


@dataclass
class RestartBudget:
    allowed: int
    used: int = 0

    def take(self) -> bool:
        if self.used >= self.allowed:
            return False
        self.used += 1
        return True




@dataclass
class _Children:
    """What both kinds of children are started from. The supervisor never calls back into the
    session: what it has to say queues up as events, which `events()` hands over, after the
    children's own reports of the same period."""

    cfg: Config
    env_info: EnvInfo
    shared: SharedState
    run_dir: str
    session: int
    node: Any = None  # multi-node: this node (`nodes.Node`), else None
    progress: int = 0  # the global step this session starts from (the syncer's start offer)
    best_return: float = float("-inf")  # for a (re)started evaluator: the best so far, given by `start`/`check`
    _queued: list[Event] = field(default_factory=list, init=False, repr=False)

    def _say(self, event: Event) -> None:
        self._queued.append(event)

    def _drain(self) -> list[Event]:
        events, self._queued = self._queued, []
        return events


@dataclass
class ProcessChildren(_Children):
    children: list[Child] = field(default_factory=list)
    worker_restarts: RestartBudget = field(init=False)
    evaluator_restarts: RestartBudget = field(init=False)
    stopping: bool = False

    def __post_init__(self) -> None:
        import multiprocessing as mp

        self.ctx = mp.get_context(self.cfg.start_method)
        self.worker_restarts = RestartBudget(self.cfg.max_worker_restarts)
        self.evaluator_restarts = RestartBudget(self.cfg.max_evaluator_restarts)

    # -- starting -----------------------------------------------------------------------------

    def start(self, best_return: float = float("-inf")) -> None:
        self.best_return = best_return
        one_thread_per_child()
        if self.node is not None and not self._start_syncer():
            return
        if self.cfg.eval_episodes > 0 and (self.node is None or self.node.runs_evaluator):
            self.children.append(self._spawn(Role.EVALUATOR, 0))
        assert self.cfg.num_workers is not None  # resolved before any process starts
        for rank in range(self.cfg.num_workers):
            self.children.append(self._spawn(Role.WORKER, rank))
        self._publish_pids()

    def _start_syncer(self) -> bool:
        """Start the syncer and wait until the nodes agree on the start: it may overwrite this
        node's weights with those of the node with the most progress, so workers start after."""
        from ..nodes.node import syncer_main
        from ..nodes.syncer import FAILED, REFUSED, STARTING

        reader, child_end = report_pipe(self.ctx)
        links = HogwildLinkFactory(self.shared.for_child(None), child_end)
        model = self.shared.model
        norms = [cast(RunningMoments, norm) for norm in (model.obs_norm, model.return_norm) if norm is not None]
        moments = [(norm.mean, norm.var, norm.count) for norm in norms]
        args = (list(model.parameters()), moments, self.shared.worker_steps, self.shared.control, self.shared.sync,
                self.node, self.cfg, self.progress, links, os.getpid())
        # typeshed's BaseContext lacks Process; every concrete context has it
        process = self.ctx.Process(target=syncer_main, args=args, name="syncer", daemon=True)  # type: ignore[attr-defined]
        process.start()
        child_end.close()
        self.children.append(Child(Role.SYNCER, self.node.rank, process, reader, heartbeat_slot=-1))
        self._publish_pids()
        # The start waits for every node (a rendezvous); give up with the sync timeout, or at once if it dies.
        deadline = time.monotonic() + self.cfg.sync_timeout + 30
        while int(self.shared.sync.state[0]) == STARTING and process.is_alive() and time.monotonic() < deadline:
            if self.shared.stop_requested():
                return False
            time.sleep(0.05)
        state = int(self.shared.sync.state[0])
        if state in (FAILED, REFUSED):
            # The syncer says why in its last report as it exits: read it now, so the run records
            # the refusal or the failure itself and not a start that timed out.
            process.join(10)
            self._queued.extend(self.children[-1].reports.read())
            return False  # a refusal stopped the run through its report; a failure is reported by `check`
        if state == STARTING:
            if process.is_alive() and not self.shared.stop_requested():
                self._say(MustStop(f"the nodes did not agree on a start within {self.cfg.sync_timeout + 30:g} s "
                                   "(are all of them started, with the same rendezvous?)"))
            return False  # a dead syncer is reported by `check`
        self._say(Said(f"node {self.node.name} (rank {self.node.rank} of {self.node.world_size}) synced: starting "
                       f"from rank {int(self.shared.sync.source_rank[0])}'s weights "
                       f"at global step {self.shared.global_step()}"))
        return True

    def _spawn(self, role: Role, rank: int) -> Child:
        reader, child_end = report_pipe(self.ctx)
        links = HogwildLinkFactory(self.shared.for_child(rank if role is Role.WORKER else None), child_end)
        parent = os.getpid()
        target: Callable[..., None]
        args: tuple[Any, ...]
        if role is Role.WORKER:
            seed = worker_seed(self.cfg.seed, rank, self.session, 0 if self.node is None else self.node.rank)
            target, args = worker_main, (rank, self.cfg, self.env_info, links, seed, parent)
            slot = rank
        else:
            seed = evaluator_seed(self.cfg.seed, self.session)
            target = evaluator_main
            args = (self.cfg, self.env_info, links, self.run_dir, self.best_return, seed, parent)
            slot = self.shared.evaluator_slot
        # The stall clock of this slot starts only when the child says it is ready.
        self.shared.heartbeats[slot] = NOT_READY
        process = self.ctx.Process(  # type: ignore[attr-defined]
            target=target, args=args, name=f"{role.value}-{rank}", daemon=True
        )
        process.start()
        child_end.close()  # the child holds its own copy; ours would hide its end-of-file
        return Child(role, rank, process, reader, slot)

    def _publish_pids(self) -> None:
        self._say(PidsChanged({child.name: child.process.pid for child in self.children}))

    # -- each period --------------------------------------------------------------------------

    def advance(self) -> None:
        time.sleep(SUPERVISE_PERIOD_S)

    def events(self) -> list[Event]:
        """The children's reports, then what the supervisor queued since the last call."""
        reports: list[Event] = [message for child in self.children for message in child.reports.read()]
        return reports + self._drain()

    def worker_pids(self) -> list[int]:
        if self.stopping:  # stopped children are released; their Process objects are closed
            return []
        return [c.process.pid for c in self.children if c.role is Role.WORKER and c.process.is_alive()]

    def evaluator_pid(self) -> int | None:
        if self.stopping:
            return None
        return next((c.process.pid for c in self.children if c.role is Role.EVALUATOR and c.process.is_alive()), None)

    def check(self, best_return: float = float("-inf")) -> None:
        """Deaths first (a dead child's last reports are read before it is judged), then stalls."""
        self.best_return = best_return
        if self.stopping:  # children exiting now are doing what they were told, not failing
            return
        for i, child in enumerate(self.children):
            code = child.process.exitcode
            if code is None:
                continue
            self._queued.extend(child.reports.read())  # its traceback, if it sent one before dying
            how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
            budget = self.worker_restarts if child.role is Role.WORKER else self.evaluator_restarts
            if child.role is Role.SYNCER:
                if code == 0:  # a stop vote ended it: the run is stopping everywhere
                    continue
                # No restart here: the other nodes see the failure too, and torchrun restarts
                # every node's trainer into a new rendezvous (each resumes its own directory).
                self._say(MustStop(f"syncer {how}: the sync between nodes failed"))
                return
            if budget.take():
                self._say(Said(f"{child.name} {how}; restarting it ({budget.used}/{budget.allowed})"))
                self._release(child)
                self.children[i] = self._spawn(child.role, child.rank)
                self._publish_pids()
            else:
                self._say(MustStop(f"{child.name} {how}"))
                return
        self._check_stalls()

    def _check_stalls(self) -> None:
        now = time.time()
        timeout = self.cfg.stall_timeout
        for child in self.children:
            if child.role is Role.SYNCER:  # a frozen peer makes its collective fail at --sync-timeout
                continue
            beat = float(self.shared.heartbeats[child.heartbeat_slot])
            if beat == NOT_READY:
                continue
            silent = now - beat
            if silent > timeout and not child.stalled:
                child.stalled = True
                self._say(Said(f"{child.name} stalled: no progress for {silent:.0f} s (--stall-timeout {timeout:g})",
                               error=True))
            elif silent <= timeout and child.stalled:
                child.stalled = False
                self._say(Said(f"{child.name} is making progress again"))

    @property
    def restarts(self) -> int:
        return self.worker_restarts.used

    # -- stopping -----------------------------------------------------------------------------

    def stop(self, fast: Callable[[], bool]) -> None:
        """Ask every child to stop and wait for them; then kill (children ignore SIGTERM, see
        `process.setup_child`). Nothing here can block on a dead child: the stop request is a
        flag, reports are read without blocking (and queued for `events()`), and joins have
        timeouts. `fast()`: a second signal came, kill at once."""
        if self.stopping:
            return
        self.stopping = True
        self.shared.request_stop()
        for child in self.children:
            # Still making its envs (which may take minutes): it has not touched the weights, so
            # there is nothing of its to wait for.
            if child.heartbeat_slot >= 0 and float(self.shared.heartbeats[child.heartbeat_slot]) == NOT_READY:
                child.process.kill()
        deadline = time.monotonic() + JOIN_GRACE_S
        # Keep reading while waiting: a child blocked on a full report pipe cannot exit.
        while any(c.process.is_alive() for c in self.children) and time.monotonic() < deadline and not fast():
            self._read_reports()
            for child in self.children:
                child.process.join(timeout=0.05)
        for child in self.children:
            if child.process.is_alive():
                if not fast():
                    self._say(Said(f"{child.name} did not stop within {JOIN_GRACE_S:g} s; killing it"))
                child.process.kill()
        for child in self.children:
            child.process.join(timeout=KILL_WAIT_S)
        self._read_reports()
        for child in self.children:
            self._release(child)

    def _read_reports(self) -> None:
        for child in self.children:
            self._queued.extend(child.reports.read())

    @staticmethod
    def _release(child: Child) -> None:
        child.reports.close()
        if child.process.exitcode is not None:
            child.process.close()


@dataclass
class InProcessChildren(_Children):
    """One worker and the evaluator inside the main process: slower, but exactly repeatable
    for a seed, and debuggable with pdb."""

    restarts: int = 0

    def start(self, best_return: float = float("-inf")) -> None:
        self.best_return = best_return
        self.reports = InProcessReports()
        links = InProcessLinkFactory(self.shared, self.reports)
        self.worker = Worker(0, self.cfg, self.env_info, links.worker_link(0),
                             worker_seed(self.cfg.seed, 0, self.session))
        self.evaluator = None
        if self.cfg.eval_episodes > 0:
            self.evaluator = Evaluator(self.cfg, self.env_info, links.evaluator_link(), self.run_dir,
                                       self.best_return, evaluator_seed(self.cfg.seed, self.session))
        self.next_eval = time.monotonic() + self.cfg.eval_interval
        self._say(PidsChanged({}))

    def advance(self) -> None:
        self.worker.run_rollout()
        if self.evaluator is not None and time.monotonic() >= self.next_eval:
            self.evaluator.evaluate()
            self.next_eval = time.monotonic() + self.cfg.eval_interval

    def events(self) -> list[Event]:
        reports: list[Event] = list(self.reports.read()) if hasattr(self, "reports") else []
        return reports + self._drain()

    def worker_pids(self) -> list[int]:
        return [os.getpid()]

    def evaluator_pid(self) -> int | None:
        return None  # it plays in this process, between rollouts: no share of its own to measure

    def check(self, best_return: float = float("-inf")) -> None:
        pass  # an exception in this process reaches the training loop directly

    def stop(self, fast: Callable[[], bool]) -> None:
        self.shared.request_stop()
        if not hasattr(self, "worker"):
            return
        self.worker.close()
        if self.evaluator is not None:
            self.evaluator.close()


Children = Union["ProcessChildren", "InProcessChildren"]


def make_children(cfg: Config, env_info: EnvInfo, shared: SharedState, run_dir: str, session: int,
                  node: Any = None, progress: int = 0) -> Children:
    if cfg.num_workers == 0:
        return InProcessChildren(cfg, env_info, shared, run_dir, session)
    return ProcessChildren(cfg, env_info, shared, run_dir, session, node=node, progress=progress)
