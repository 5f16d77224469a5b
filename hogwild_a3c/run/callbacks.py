"""User callbacks: code of the user's own, called by the session in the main process (never in a
worker) at its events. Subclass `Callback` and override what you need, or pass any object with
some of these methods:

    on_start(info)         the run begins: {"run_dir", "config", "session", "global_step"}
    on_progress(row)       each progress.csv row, as a dict of its columns
    on_evaluation(result)  an `Evaluation`: global_step, returns, mean_return (and lengths, time_s)
    on_checkpoint(path)    a training checkpoint was saved at `path`
    on_end(result)         the run ended: its `TrainResult`

A method that returns False stops the run cleanly: saved, exit 0, `ended == "callback"` in
meta.json and in the TrainResult. One that raises stops it the same way, with one line naming
the callback and its error (in train.log and errors.log): a user's bug never loses a run. After
a callback asked to stop, only `on_end` is called (the shutdown's last row and save are not news).

A callback runs in the main process, between the steps that supervise the children and write the
run's files, which wait for it: keep it to well under a second. One that blocks cannot hold a run
hostage: a second Ctrl-C (or SIGTERM) cuts it short, the run stops saved, and no callback is called
again but `on_end`, once everything is saved (where Ctrl-C ends it as any Python code).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

ENDED = "callback"
METHODS = ("on_start", "on_progress", "on_evaluation", "on_checkpoint", "on_end")


@dataclass(frozen=True)
class Evaluation:
    global_step: int
    returns: tuple[float, ...]
    mean_return: float
    lengths: tuple[int, ...] = ()  # each episode's steps, as returns
    time_s: float = float("nan")  # the run's clock when the evaluation ended, as in eval.csv
    lstm: Any = None  # the evaluator's LstmHealth of the policy's LSTM (None without one)


class Callback:
    """A base with every method, each doing nothing; override the ones you need."""

    def on_start(self, info: dict[str, Any]) -> bool | None:
        return None

    def on_progress(self, row: dict[str, Any]) -> bool | None:
        return None

    def on_evaluation(self, result: Evaluation) -> bool | None:
        return None

    def on_checkpoint(self, path: Any) -> bool | None:
        return None

    def on_end(self, result: Any) -> bool | None:
        return None


def check_callbacks(callbacks: Any) -> list[Any]:
    """The callbacks as a list; ValueError naming what is not one (before anything is written)."""
    if callbacks is None:
        return []
    if not isinstance(callbacks, Sequence) or isinstance(callbacks, (str, bytes)):
        raise ValueError(f"callbacks must be a list of callback objects (got {type(callbacks).__name__})")
    for callback in callbacks:
        if isinstance(callback, type):
            raise ValueError(f"callbacks: {callback.__name__} is a class; pass an instance, {callback.__name__}()")
        if not any(callable(getattr(callback, name, None)) for name in METHODS):
            raise ValueError(f"callbacks: {type(callback).__name__} has none of {', '.join(METHODS)}")
    return list(callbacks)


class CutShort(BaseException):
    """Raised into a callback that was running when the run was told to stop twice."""


class Callbacks:
    """Calls every callback's method for an event. The first False or exception asks the run to
    stop (`stop`, with the line that says why); `failed` records a raising callback's line."""

    def __init__(self, callbacks: list[Any], stop: Callable[[str], None], failed: Callable[[str], None]):
        self.callbacks = callbacks
        self._stop = stop
        self._failed = failed
        self.stopped_by: str | None = None
        self.running: str | None = None  # the callback being called now, for `cut_short`
        self.cut: str | None = None  # the callback cut short; none is called after it

    def cut_short(self) -> None:
        """From a signal handler, the run told to stop a second time: end the callback that is
        running now (one that sleeps or waits would otherwise keep the run from saving)."""
        if self.running is not None:
            raise CutShort(self.running)

    def call(self, method: str, argument: Any) -> None:
        if self.cut is not None or (self.stopped_by is not None and method != "on_end"):
            return  # cut short: never again; asked to stop: the shutdown's rows are not news
        try:
            self._call_each(method, argument)
        except CutShort as cut:  # also when the signal came just after the callback returned
            self.running, self.cut = None, str(cut)
            line = f"callback {self.cut} was cut short by a second signal; no callback is called again but on_end"
            self._failed(line)
            self._ask_stop(line)

    def _call_each(self, method: str, argument: Any) -> None:
        for callback in self.callbacks:
            function = getattr(callback, method, None)
            if not callable(function):
                continue
            name = f"{type(callback).__name__}.{method}"
            try:
                self.running = name
                answer = function(argument)
                self.running = None
            except CutShort:
                raise
            except (SystemExit, KeyboardInterrupt) as exc:
                # `sys.exit()` in a callback is a common way to say "stop": the run stops saved, as for
                # False. Let through, either would cut the shutdown short and lose the session.
                self.running = None
                self._ask_stop(f"callback {name} raised {type(exc).__name__}")
                continue
            except BaseException as exc:  # noqa: BLE001 - a user's bug stops the run saved, in one line
                self.running = None
                text = (str(exc).strip().splitlines() or [""])[0][:200]
                line = f"callback {name} raised {type(exc).__name__}" + (f": {text}" if text else "")
                self._failed(line)
                self._ask_stop(line)
                continue
            # numpy's False too (`return np.mean(x) < t`); None, 0 and other values go on.
            if answer is False or (isinstance(answer, np.bool_) and not answer):
                self._ask_stop(f"callback {name} returned False")

    def _ask_stop(self, line: str) -> None:
        if self.stopped_by is None:
            self.stopped_by = line
            self._stop(line)
