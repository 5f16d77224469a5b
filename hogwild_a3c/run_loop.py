"""The main process's jobs while a run is on, as one object: deliver what the children report,
write progress rows, checkpoint, watch the run directory, and shut down in order.

`training.run_training` builds the pieces (shared state, recorder, stop policy, children) and
hands them to a `RunLoop`; the loop holds no process of its own, so each job can be tested with
a real `SharedState` and `Recorder` and no child at all (tests/test_run_loop.py).
"""
from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .checkpoint import CheckpointError, Progress, save_checkpoint, training_payload
from .config import Config
from .files import DirectoryWatch
from .messages import ChildRaised, EpisodeEnded, Evaluated, Message, SyncRefused, WriteFailed
from .process import CpuShare, rss_mb
from .recorder import Recorder
from .shared import STAT, SharedState
from .stop_policy import EXIT_FAILED, StopPolicy
from .supervisor import Hooks

COUNTERS = ("updates", "skipped_updates", "env_errors", "worker_restarts")
RUN_DIR_CHECK_S = 1.0  # how often the loop makes sure the run directory is still there


class Periodic:
    """Call `callback` every `period` seconds, from a loop that asks often enough."""

    def __init__(self, period: float, callback: Callable[[], Any]):
        self.period = period
        self.callback = callback
        self.last = time.monotonic()

    def __call__(self) -> None:
        now = time.monotonic()
        if now - self.last >= self.period:
            self.last = now
            self.callback()


class Clock:
    """Run time in seconds, continued across resumes."""

    def __init__(self, elapsed_before: float):
        self.origin = time.time() - elapsed_before

    def time_s(self, wall_time: float | None = None) -> float:
        return (time.time() if wall_time is None else wall_time) - self.origin


class RunLoop:
    """One session of a run, from the first child started to the last file closed."""

    def __init__(self, cfg: Config, run_dir: Path, shared: SharedState, recorder: Recorder, policy: StopPolicy,
                 before: Progress, session: int):
        self.cfg, self.run_dir, self.shared, self.recorder, self.policy = cfg, run_dir, shared, recorder, policy
        self.session = session
        self.clock = Clock(before.elapsed_s)
        self.base_counters = {name: int((before.counters or {}).get(name, 0)) for name in COUNTERS}
        self.best = before.best_eval_return
        self.latest_eval: float | None = None
        self.rate = 0.0
        self.rate_from = (time.monotonic(), shared.global_step())
        self.cpu_share = CpuShare()
        self.warned_dead_lstm = False
        self.files_failure: str | None = None
        self.children: Any = None  # set by run_training once the supervisor has made them
        self.watch = DirectoryWatch(run_dir)
        self.bar: Any = None
        recorder.on_write_failure = self.files_failed

    def hooks(self) -> Hooks:
        """What the supervisor may call back."""
        return Hooks(log=self.recorder.log, error=self.recorder.error, fail=self.policy.fail,
                     pids_changed=self.recorder.child_pids, best_return=lambda: self.best, deliver=self.deliver)

    # -- the jobs -------------------------------------------------------------------------------

    def deliver(self, messages: list[Message]) -> None:
        recorder, clock = self.recorder, self.clock
        for message in messages:
            if isinstance(message, EpisodeEnded):
                recorder.episode(clock.time_s(message.wall_time), message.global_step, message.rank,
                                 message.episode_return, message.length)
            elif isinstance(message, Evaluated):
                recorder.evaluation(clock.time_s(message.wall_time), message.global_step, message.episodes,
                                    message.mean_return)
                self.latest_eval = message.mean_return
                self.best = max(self.best, message.mean_return)
                self.policy.on_evaluation([r for r, _ in message.episodes])
                if message.lstm is not None and message.lstm.dead and not self.warned_dead_lstm:
                    self.warned_dead_lstm = True  # once: the run goes on, the user decides
                    recorder.log(message.lstm.warning(message.global_step))
            elif isinstance(message, ChildRaised):
                recorder.error(f"{message.role} {message.rank} raised {message.summary}\n{message.traceback}")
            elif isinstance(message, WriteFailed):
                self.files_failed(message.message)
            elif isinstance(message, SyncRefused):
                self.policy.refuse(message.message)

    def counters(self) -> dict[str, int]:
        stats = self.shared.worker_stats
        found = {name: int(stats[:, STAT[name]].sum()) for name in COUNTERS if name in STAT}
        found["worker_restarts"] = 0 if self.children is None else self.children.restarts
        return {name: self.base_counters[name] + found[name] for name in COUNTERS}

    def write_progress(self) -> None:
        now, step = time.monotonic(), self.shared.global_step()
        then, step_then = self.rate_from
        self.rate = (step - step_then) / max(now - then, 1e-9)
        self.rate_from = (now, step)
        stats = self.shared.worker_stats
        active = stats[stats[:, STAT["updates"]] > 0]
        means = {name: float(active[:, STAT[name]].mean()) if len(active) else float("nan")
                 for name in ("policy_loss", "value_loss", "entropy", "grad_norm")}
        workers = self.children.worker_pids() if self.children is not None else []
        rss = [rss_mb(pid) for pid in workers]
        evaluator = self.children.evaluator_pid() if self.children is not None else None
        eval_share = self.cpu_share.sample(workers, evaluator)
        self.recorder.progress(time_s=self.clock.time_s(), global_step=step, steps_per_s=self.rate, **means,
                               **self.counters(), worker_rss_mb=float(np.mean(rss)) if rss else float("nan"),
                               eval_cpu_share=eval_share)
        if not self.policy.stopping:
            self.policy.check_weights(self.shared.snapshot_weights())
            self.policy.check_learning(self.shared.worker_stats)

    def checkpoint(self) -> Path | None:
        """Save a training checkpoint; never of non-finite weights, so latest.pt stays the last good one."""
        weights = self.shared.snapshot_weights()
        if not all(bool(torch.isfinite(t).all()) for t in weights.values()):
            self.recorder.error("not saving a checkpoint of non-finite weights; latest.pt stays the last good one")
            self.policy.check_weights(weights)
            return None
        progress = Progress(self.shared.global_step(), self.clock.time_s(), self.session, self.best, self.counters())
        try:
            payload = training_payload(weights, self.shared, self.cfg, progress)
            return save_checkpoint(self.run_dir / "checkpoints", payload, progress.global_step,
                                   self.cfg.keep_checkpoints)
        except CheckpointError as exc:
            self.files_failed(str(exc))
            return None

    def files_failed(self, message: str) -> None:
        """The run's files cannot be written (a full disk, a read-only or vanished run directory):
        stop on the first such line; the rest say nothing new."""
        if self.files_failure is not None:
            return
        # A write into a deleted run directory often fails before the periodic check looks.
        problem = None if self.recorder.detached else self.watch.problem()
        if problem is not None:
            self.recorder.detach(problem)
            message = _gone(problem)
        self.files_failure = message
        self.policy.fail(message)

    def check_run_dir(self) -> None:
        problem = None if self.recorder.detached else self.watch.problem()
        if problem is not None:
            self.recorder.detach(problem)
            self.files_failed(_gone(problem))

    def update_bar(self) -> None:
        if self.bar is None:
            return
        self.bar.n = self.shared.global_step()  # tqdm shows the rate itself (step/s)
        if self.latest_eval is not None:
            self.bar.set_postfix({"eval": f"{self.latest_eval:.1f}"}, refresh=False)
        self.bar.refresh()

    # -- the session ----------------------------------------------------------------------------

    def run(self) -> None:
        """Start the children and supervise them until the stop policy says the run is over."""
        cfg, shared, policy, children = self.cfg, self.shared, self.policy, self.children
        if not cfg.no_progress:
            from tqdm import tqdm

            self.bar = tqdm(total=cfg.max_steps, initial=shared.global_step(), unit="step", unit_scale=True,
                            dynamic_ncols=True)
        periodic = [Periodic(RUN_DIR_CHECK_S, self.check_run_dir), Periodic(cfg.progress_interval, self.write_progress),
                    Periodic(cfg.checkpoint_interval, self.checkpoint)]
        self.recorder.log(f"run directory: {self.run_dir}")
        policy.check_budgets(shared.global_step(), self.clock.time_s())
        if not policy.stopping:
            restored = shared.global_step()
            children.start()
            if shared.sync is not None and shared.global_step() != restored:  # the nodes agreed on another start
                self.recorder.sync_start(shared.global_step(), restored)
        while not policy.stopping:
            children.advance()
            self.deliver(children.messages())
            children.check()
            if shared.stop_requested() and not policy.stopping:  # multi-node: another node's stop vote
                policy.stop("stopped with the other nodes (a budget, target or stop on one of them)")
            for task in periodic:
                task()
            policy.check_budgets(shared.global_step(), self.clock.time_s())
            self.update_bar()

    def shut_down(self) -> None:
        """Stop the children, write the last rows and checkpoint, close the session. Each step runs
        even if one before it failed: a failing save must not skip the flush."""
        policy, recorder = self.policy, self.recorder
        if not policy.stopping:
            policy.stop("stopped")
        steps: list[Callable[[], None]] = [self.check_run_dir, self.write_progress, self._final_checkpoint,
                                           lambda: recorder.end_session(policy.reason or "stopped", policy.exit_code,
                                                                        self.shared.global_step(), self.clock.time_s()),
                                           recorder.close]
        if self.children is not None:
            steps.insert(0, lambda: self.children.stop(self.deliver, lambda: policy.fast))
        for step in steps:
            try:
                step()
            except Exception as exc:  # noqa: BLE001
                policy.exit_code = policy.exit_code or EXIT_FAILED
                message = f"during shutdown: {type(exc).__name__}: {exc}"
                try:
                    recorder.error(message)
                except Exception:  # noqa: BLE001 - the recorder itself may be what failed
                    print(message, file=sys.stderr)
        self.watch.close()
        # The recorder and the children point back at this loop (their callbacks): without
        # breaking both cycles the run's shared memory and pipes would live on until the garbage
        # collector finds them.
        recorder.on_write_failure = _ignore
        self.children = None
        if self.bar is not None:
            self.bar.close()

    def _final_checkpoint(self) -> None:
        if self.files_failure:
            # The previous checkpoint stays latest.pt: on a full disk a save would only take the
            # room kept for meta.json, and where nothing can be written it adds a second line.
            return
        path = self.checkpoint()
        if path is not None:
            self.recorder.log(f"saved {path}")


def _gone(problem: str) -> str:
    return f"{problem}; stopping without writing anything more there"


def _ignore(_message: str) -> None:
    pass
