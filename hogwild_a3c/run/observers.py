"""The session's own rules, each an observer of the events the session hands on.

An observer has any of the methods the session calls (`run_loop.ROUTES` lists them): `on_episode`
and `on_progress` get a row of episodes.csv or progress.csv as a dict, `on_evaluation` an
`Evaluation`, the others the supervisor's or the children's message itself. The recorder
(recorder.py) writes what they say, the stop rules (stop_rules.py) take the stops that the
supervisor and the syncer ask for, the user's callbacks (callbacks.py) see the public ones; the
rules here are the rest:

- `TargetReturn`: the run is done when the mean of the last --eval-episodes evaluation returns
  reaches --target-return.
- `DeadLstmWarning`: one train.log line when the evaluator finds the rules's LSTM dead.
- `LearningWatch`: at each progress row, non-finite shared weights, or a worker that skipped
  --max-skipped-updates updates in a row, fail the run.
- `FileFailures`: the first run file that cannot be written, or the run directory deleted or
  moved away, stops the run.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..children.messages import WriteFailed
from ..files.atomic import DirectoryWatch
from .callbacks import Evaluation

if TYPE_CHECKING:
    from ..children.shared import SharedState
    from ..config import Config
    from .recorder import Recorder
    from .stop_rules import StopRules


class TargetReturn:
    def __init__(self, cfg: Config, rules: StopRules):
        self.target, self.episodes, self.rules = cfg.target_return, cfg.eval_episodes, rules
        self.window: list[float] = []

    def on_evaluation(self, evaluation: Evaluation) -> None:
        self.window = (self.window + list(evaluation.returns))[-self.episodes:]
        if self.target is not None and len(self.window) >= self.episodes and np.mean(self.window) >= self.target:
            self.rules.stop("target_return")


class DeadLstmWarning:
    def __init__(self, log: Callable[[str], None]):
        self.log = log
        self.warned = False

    def on_evaluation(self, evaluation: Evaluation) -> None:
        health = evaluation.lstm
        if health is not None and health.dead and not self.warned:
            self.warned = True  # once: the run goes on, the user decides
            self.log(health.warning(evaluation.global_step))


class LearningWatch:
    def __init__(self, shared: SharedState, rules: StopRules):
        self.shared, self.rules = shared, rules

    def on_progress(self, row: dict[str, Any]) -> None:
        if not self.rules.stopping:
            self.rules.check_weights(self.shared.snapshot_weights())
            self.rules.check_learning(self.shared.worker_stats)


class FileFailures:
    """Stops on the first failed write, whoever reports it: the recorder (`check_writes`), a
    child (`on_write_failed`: best.pt), the checkpoint (`failed`); the rest say nothing new."""

    def __init__(self, run_dir: Path, recorder: Recorder, rules: StopRules):
        self.recorder, self.rules = recorder, rules
        self.watch = DirectoryWatch(run_dir)
        self.failure: str | None = None

    def on_write_failed(self, message: WriteFailed) -> None:
        self.failed(message.message)

    def check_writes(self) -> None:
        if self.recorder.write_failure is not None:
            self.failed(self.recorder.write_failure)

    def failed(self, message: str) -> None:
        if self.failure is not None:
            return
        # A write into a deleted run directory often fails before the periodic check looks.
        problem = None if self.recorder.detached else self.watch.problem()
        if problem is not None:
            self.recorder.detach(problem)
            message = _gone(problem)
        self.failure = message
        self.rules.fail(message)

    def check_run_dir(self) -> None:
        problem = None if self.recorder.detached else self.watch.problem()
        if problem is not None:
            self.recorder.detach(problem)
            self.failed(_gone(problem))

    def close(self) -> None:
        self.watch.close()


def _gone(problem: str) -> str:
    return f"{problem}; stopping without writing anything more there"
