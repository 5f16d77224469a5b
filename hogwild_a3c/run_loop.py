"""The main process's jobs while a run is on, as one object: hand on what the children and the
supervisor report, write progress rows, checkpoint, watch the run directory, call the user's
callbacks, and shut down in order.

`session.Session` builds the pieces (shared state, recorder, stop policy, children, callbacks)
and hands them to a `RunLoop`; the loop holds no process of its own, so each job can be tested
with a real `SharedState` and `Recorder` and stand-in children (tests/test_run_loop.py). Nothing
calls back into it: the children's reports and the supervisor's events are read each period,
and so is the recorder's first failed write.
"""
from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .callbacks import Callbacks, Evaluation
from .checkpoint import CheckpointError, Progress, save_checkpoint, training_payload
from .config import Config
from .files import DirectoryWatch
from .messages import ChildRaised, EpisodeEnded, Evaluated, SyncRefused, WriteFailed
from .process import CpuShare, rss_mb
from .recorder import Recorder
from .shared import STAT, SharedState
from .stop_policy import EXIT_FAILED, StopPolicy
from .supervisor import Children, Event, MustStop, PidsChanged, Said

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


# Each kind of event, the children's reports and the supervisor's own, and the method that takes
# it: names, not bound methods, so that the loop holds no reference to itself and is freed (its
# shared memory and pipes with it) as soon as its session ends.
HANDLERS: dict[type, str] = {
    EpisodeEnded: "_episode", Evaluated: "_evaluated", ChildRaised: "_raised", WriteFailed: "_write_failed",
    SyncRefused: "_refused", Said: "_said", MustStop: "_must_stop", PidsChanged: "_pids_changed",
}


class RunLoop:
    """One session of a run, from the first child started to the last file closed."""

    def __init__(self, cfg: Config, run_dir: Path, shared: SharedState, recorder: Recorder, policy: StopPolicy,
                 before: Progress, session: int, children: Children, callbacks: Callbacks | None = None):
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
        self.children = children
        self.callbacks = callbacks or Callbacks([], stop=lambda line: None, failed=lambda line: None)
        self.watch = DirectoryWatch(run_dir)
        self.bar: Any = None

    # -- the jobs -------------------------------------------------------------------------------

    def handle(self, events: list[Event]) -> None:
        for event in events:
            getattr(self, HANDLERS[type(event)])(event)
        self.check_writes()

    def _raised(self, message: ChildRaised) -> None:
        self.recorder.error(f"{message.role} {message.rank} raised {message.summary}\n{message.traceback}")

    def _write_failed(self, message: WriteFailed) -> None:
        self.files_failed(message.message)

    def _refused(self, message: SyncRefused) -> None:
        self.policy.refuse(message.message)

    def _said(self, event: Said) -> None:
        (self.recorder.error if event.error else self.recorder.log)(event.text)

    def _must_stop(self, event: MustStop) -> None:
        self.policy.fail(event.reason)

    def _pids_changed(self, event: PidsChanged) -> None:
        self.recorder.child_pids(event.pids)

    def _episode(self, message: EpisodeEnded) -> None:
        self.recorder.episode(self.clock.time_s(message.wall_time), message.global_step, message.rank,
                              message.episode_return, message.length)

    def _evaluated(self, message: Evaluated) -> None:
        self.recorder.evaluation(self.clock.time_s(message.wall_time), message.global_step, message.episodes,
                                 message.mean_return)
        self.latest_eval = message.mean_return
        self.best = max(self.best, message.mean_return)
        self.policy.on_evaluation([r for r, _ in message.episodes])
        if message.lstm is not None and message.lstm.dead and not self.warned_dead_lstm:
            self.warned_dead_lstm = True  # once: the run goes on, the user decides
            self.recorder.log(message.lstm.warning(message.global_step))
        self.callbacks.call("on_evaluation", Evaluation(message.global_step, tuple(r for r, _ in message.episodes),
                                                        message.mean_return))

    def check_writes(self) -> None:
        """The recorder keeps its first failed write; the run stops on it."""
        if self.recorder.write_failure is not None:
            self.files_failed(self.recorder.write_failure)

    def counters(self) -> dict[str, int]:
        stats = self.shared.worker_stats
        found = {name: int(stats[:, STAT[name]].sum()) for name in COUNTERS if name in STAT}
        found["worker_restarts"] = self.children.restarts
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
        workers = self.children.worker_pids()
        rss = [rss_mb(pid) for pid in workers]
        eval_share = self.cpu_share.sample(workers, self.children.evaluator_pid())
        row = dict(time_s=self.clock.time_s(), global_step=step, steps_per_s=self.rate, **means, **self.counters(),
                   worker_rss_mb=float(np.mean(rss)) if rss else float("nan"), eval_cpu_share=eval_share)
        self.recorder.progress(**row)
        self.callbacks.call("on_progress", row)
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
            path = save_checkpoint(self.run_dir / "checkpoints", payload, progress.global_step,
                                   self.cfg.keep_checkpoints)
        except CheckpointError as exc:
            self.files_failed(str(exc))
            return None
        self.callbacks.call("on_checkpoint", path)
        return path

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
        if cfg.progress:
            from tqdm import tqdm

            self.bar = tqdm(total=cfg.max_steps, initial=shared.global_step(), unit="step", unit_scale=True,
                            dynamic_ncols=True)
        periodic = [Periodic(RUN_DIR_CHECK_S, self.check_run_dir), Periodic(cfg.progress_interval, self.write_progress),
                    Periodic(cfg.checkpoint_interval, self.checkpoint)]
        self.recorder.log(f"run directory: {self.run_dir}")
        policy.check_budgets(shared.global_step(), self.clock.time_s())
        if not policy.stopping:
            restored = shared.global_step()
            children.start(self.best)
            if shared.sync is not None and shared.global_step() != restored:  # the nodes agreed on another start
                self.recorder.sync_start(shared.global_step(), restored)
            self.handle(children.events())
        while not policy.stopping:
            children.advance()
            children.check(self.best)
            self.handle(children.events())
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
        steps: list[Callable[[], None]] = [
            lambda: self.children.stop(lambda: policy.fast), lambda: self.handle(self.children.events()),
            self.check_run_dir, self.write_progress, self._final_checkpoint,
            lambda: recorder.end_session(policy.reason or "stopped", policy.exit_code, self.shared.global_step(),
                                         self.clock.time_s()),
            recorder.close]
        for step in steps:
            try:
                step()
                self.check_writes()
            except Exception as exc:  # noqa: BLE001
                policy.exit_code = policy.exit_code or EXIT_FAILED
                message = f"during shutdown: {type(exc).__name__}: {exc}"
                try:
                    recorder.error(message)
                except Exception:  # noqa: BLE001 - the recorder itself may be what failed
                    print(message, file=sys.stderr)
        self.watch.close()
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

