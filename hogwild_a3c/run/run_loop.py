"""The main process's jobs while a run is on, as one object: hand what the children and the
supervisor report to the session's observers (the recorder, the stop rules, the rules in
observers.py, the user's callbacks), make the progress rows, checkpoint, and shut down in order.

`session.Session` builds the pieces (shared state, recorder, stop rules, children, callbacks)
and hands them to a `RunLoop`; the loop holds no process of its own, so each job can be tested
with a real `SharedState` and `Recorder` and stand-in children (tests/test_run_loop.py). Nothing
calls back into it: the children's reports and the supervisor's events are read each period,
and so is the recorder's first failed write.
"""
from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..children.messages import (
    ChildRaised,
    EpisodeEnded,
    Evaluated,
    Event,
    MustStop,
    PidsChanged,
    Said,
    SyncRefused,
    WriteFailed,
)
from ..children.process import CpuShare, rss_mb
from ..children.shared import STAT, SharedState
from ..children.supervisor import Children
from ..config import Config
from ..files.checkpoint import CheckpointError, Progress, save_checkpoint, training_payload
from .callbacks import METHODS, Callbacks, Evaluation
from .observers import DeadLstmWarning, FileFailures, LearningWatch, TargetReturn
from .recorder import Recorder
from .stop_rules import EXIT_FAILED, StopRules

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


RECENT_EPISODES = 20


def bar_postfix(recent_returns: Sequence[float], latest_eval: float | None, time_s: float,
                max_seconds: float | None) -> dict[str, str]:
    """What the progress bar shows beside steps and steps/s: the mean return of the last training
    episodes from the first one on (as SB3, Sample Factory and rl_games show), the last evaluation's
    mean once there is one, and the minutes against a time budget (a step budget is the bar's total)."""
    shown = {}
    if recent_returns:
        shown["return"] = f"{float(np.mean(recent_returns)):.1f}"
    if latest_eval is not None:
        shown["eval"] = f"{latest_eval:.1f}"
    if max_seconds is not None:
        shown["min"] = f"{time_s / 60:.1f}/{max_seconds / 60:.1f}"
    return shown


class Clock:
    """Run time in seconds, continued across resumes."""

    def __init__(self, elapsed_before: float):
        self.origin = time.time() - elapsed_before

    def time_s(self, wall_time: float | None = None) -> float:
        return (time.time() if wall_time is None else wall_time) - self.origin


# Each kind of event, the children's reports and the supervisor's own: the observers' method that
# takes it, and the loop's method (a name, or None for the event itself) that makes what they get.
# Names, not bound methods, so that the loop holds no reference to itself and is freed (its
# shared memory and pipes with it) as soon as its session ends.
ROUTES: dict[type, tuple[str, str | None]] = {
    EpisodeEnded: ("on_episode", "_episode_row"), Evaluated: ("on_evaluation", "_evaluation"),
    ChildRaised: ("on_child_raised", None), WriteFailed: ("on_write_failed", None),
    SyncRefused: ("on_refused", None), Said: ("on_said", None), MustStop: ("on_must_stop", None),
    PidsChanged: ("on_pids_changed", None),
}


class RunLoop:
    """One session of a run, from the first child started to the last file closed."""

    def __init__(self, cfg: Config, run_dir: Path, shared: SharedState, recorder: Recorder, rules: StopRules,
                 before: Progress, session: int, children: Children, callbacks: Callbacks | None = None):
        self.cfg, self.run_dir, self.shared, self.recorder, self.rules = cfg, run_dir, shared, recorder, rules
        self.session = session
        self.clock = Clock(before.elapsed_s)
        self.base_counters = {name: int((before.counters or {}).get(name, 0)) for name in COUNTERS}
        self.best = before.best_eval_return
        self.latest_eval: float | None = None
        self.recent_returns: deque[float] = deque(maxlen=RECENT_EPISODES)  # the bar's training return
        self.rate = 0.0
        self.rate_from = (time.monotonic(), shared.global_step())
        self.cpu_share = CpuShare()
        self.children = children
        self.callbacks = callbacks or Callbacks([], stop=lambda line: None, failed=lambda line: None)
        self.files = FileFailures(run_dir, recorder, rules)
        self.observers: list[Any] = [recorder, rules, TargetReturn(cfg, rules), DeadLstmWarning(recorder.log),
                                     LearningWatch(shared, rules), self.files]
        self.bar: Any = None

    # -- the events -----------------------------------------------------------------------------

    def handle(self, events: list[Event]) -> None:
        for event in events:
            method, convert = ROUTES[type(event)]
            self.notify(method, event if convert is None else getattr(self, convert)(event))
        self.files.check_writes()

    def notify(self, method: str, event: Any) -> None:
        """Every observer that has `method`, in order, then the user's callbacks (the public events only)."""
        for observer in self.observers:
            function = getattr(observer, method, None)
            if function is not None:
                function(event)
        if method in METHODS:
            self.callbacks.call(method, event)

    def _episode_row(self, message: EpisodeEnded) -> dict[str, Any]:
        self.recent_returns.append(message.episode_return)
        return {"time_s": self.clock.time_s(message.wall_time), "global_step": message.global_step,
                "worker": message.rank, "episode_return": message.episode_return, "episode_length": message.length}

    def _evaluation(self, message: Evaluated) -> Evaluation:
        self.latest_eval = message.mean_return  # the bar shows it; the checkpoint keeps the best
        self.best = max(self.best, message.mean_return)
        return Evaluation(message.global_step, tuple(r for r, _ in message.episodes), message.mean_return,
                          lengths=tuple(length for _, length in message.episodes),
                          time_s=self.clock.time_s(message.wall_time), lstm=message.lstm)

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
        self.notify("on_progress", row)

    def checkpoint(self) -> Path | None:
        """Save a training checkpoint; never of non-finite weights, so latest.pt stays the last good one."""
        weights = self.shared.snapshot_weights()
        if not all(bool(torch.isfinite(t).all()) for t in weights.values()):
            self.recorder.error("not saving a checkpoint of non-finite weights; latest.pt stays the last good one")
            self.rules.check_weights(weights)
            return None
        progress = Progress(self.shared.global_step(), self.clock.time_s(), self.session, self.best, self.counters())
        try:
            payload = training_payload(weights, self.shared, self.cfg, progress)
            path = save_checkpoint(self.run_dir / "checkpoints", payload, progress.global_step,
                                   self.cfg.keep_checkpoints)
        except CheckpointError as exc:
            self.files.failed(str(exc))
            return None
        self.notify("on_checkpoint", path)
        return path

    def update_bar(self) -> None:
        if self.bar is None:
            return
        self.bar.n = self.shared.global_step()  # tqdm shows the rate itself (step/s)
        self.bar.set_postfix(bar_postfix(self.recent_returns, self.latest_eval, self.clock.time_s(),
                                         None if self.cfg.max_steps is not None else self.cfg.max_seconds),
                             refresh=False)
        self.bar.refresh()

    # -- the session ----------------------------------------------------------------------------

    def run(self) -> None:
        """Start the children and supervise them until the stop rules say the run is over."""
        cfg, shared, rules, children = self.cfg, self.shared, self.rules, self.children
        if cfg.progress:
            from tqdm import tqdm

            self.bar = tqdm(total=cfg.max_steps, initial=shared.global_step(), unit="step", unit_scale=True,
                            dynamic_ncols=True)
        periodic = [Periodic(RUN_DIR_CHECK_S, self.files.check_run_dir),
                    Periodic(cfg.progress_interval, self.write_progress),
                    Periodic(cfg.checkpoint_interval, self.checkpoint)]
        self.recorder.log(f"run directory: {self.run_dir}")
        rules.check_budgets(shared.global_step(), self.clock.time_s())
        if not rules.stopping:
            restored = shared.global_step()
            children.start(self.best)
            if shared.sync is not None and shared.global_step() != restored:  # the nodes agreed on another start
                self.recorder.sync_start(shared.global_step(), restored)
            self.handle(children.events())
        while not rules.stopping:
            children.advance()
            children.check(self.best)
            self.handle(children.events())
            if shared.stop_requested() and not rules.stopping:  # multi-node: another node's stop vote
                rules.stop("stopped with the other nodes (a budget, target or stop on one of them)")
            for task in periodic:
                task()
            rules.check_budgets(shared.global_step(), self.clock.time_s())
            self.update_bar()

    def shut_down(self) -> None:
        """Stop the children, write the last rows and checkpoint, close the session. Each step runs
        even if one before it failed: a failing save must not skip the flush."""
        rules, recorder = self.rules, self.recorder
        if not rules.stopping:
            rules.stop("stopped")
        steps: list[Callable[[], None]] = [
            lambda: self.children.stop(lambda: rules.fast), lambda: self.handle(self.children.events()),
            lambda: rules.check_some_update(self.shared.worker_stats), self.files.check_run_dir, self.write_progress,
            self._final_checkpoint,
            lambda: recorder.end_session(rules.reason or "stopped", rules.exit_code, self.shared.global_step(),
                                         self.clock.time_s()),
            recorder.close]
        for step in steps:
            try:
                step()
                self.files.check_writes()
            except Exception as exc:  # noqa: BLE001
                rules.exit_code = rules.exit_code or EXIT_FAILED
                message = f"during shutdown: {type(exc).__name__}: {exc}"
                try:
                    recorder.error(message)
                except Exception:  # noqa: BLE001 - the recorder itself may be what failed
                    print(message, file=sys.stderr)
        self.files.close()
        if self.bar is not None:
            self.bar.close()

    def _final_checkpoint(self) -> None:
        if self.files.failure:
            # The previous checkpoint stays latest.pt: on a full disk a save would only take the
            # room kept for meta.json, and where nothing can be written it adds a second line.
            return
        path = self.checkpoint()
        if path is not None:
            self.recorder.log(f"saved {path}")

