"""The stop rules: when a run ends, why, and with which exit status.

A run stops at the first of: a budget (`--max-steps`, `--max-seconds`), the target
(`--target-return`, observers.TargetReturn), a user's callback, a signal, or a failure
(a child that died beyond the restart rules, non-finite shared weights, a worker that skipped
`--max-skipped-updates` updates in a row, a run file that cannot be written: a checkpoint,
best.pt, meta.json, a CSV row, a log line; a run directory deleted during the run). The first
reason given is the one recorded, except that a failure outranks a budget or target reached.
Exit status: 0 budget or target, 1 failure, 130 SIGINT, 143 SIGTERM (2, bad input, never gets
this far). A node of a multi-node run (`under_torchrun`) exits 0 after a signal: to torchrun any
other status is a failure, and its agent would restart a trainer that was told to stop; so does a
node whose sync refused a peer (`refuse`), which a restart would only meet again.
"""
from __future__ import annotations

import signal
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from ..children.shared import STAT
from ..config import Config
from .exit_codes import EXIT_FAILED, EXIT_OK, EXIT_SIGINT, EXIT_SIGTERM

if TYPE_CHECKING:
    from ..children.messages import MustStop, SyncRefused


class StopRules:
    def __init__(self, cfg: Config, on_stop: Callable[[], None], record_error: Callable[[str], None],
                 log: Callable[[str], None], under_torchrun: bool = False):
        self.cfg = cfg
        self.under_torchrun = under_torchrun
        self._on_stop = on_stop  # tells the children
        self._record_error = record_error
        self._log = log
        self.reason: str | None = None
        self.exit_code = EXIT_OK
        self.signals_seen = 0  # a signal's stop is never outranked, whatever its exit status
        self._failures_said: set[str] = set()  # each failure told once, however many checks find it

    @property
    def stopping(self) -> bool:
        return self.reason is not None

    @property
    def fast(self) -> bool:
        """A second signal: kill the children at once (still save and flush)."""
        return self.signals_seen > 1

    def stop(self, reason: str, exit_code: int = EXIT_OK) -> None:
        if self.reason is None:
            self.reason = reason
            self.exit_code = exit_code
        self._on_stop()

    def fail(self, message: str) -> None:
        """A failure outranks a reached budget or target (a final checkpoint that cannot be
        written must not end in exit 0), never a signal or an earlier failure."""
        if message not in self._failures_said:
            self._failures_said.add(message)
            self._record_error(f"run stopping: {message}")
        if self.reason is not None and self.exit_code == EXIT_OK and not self.signals_seen:
            self.reason = None
        self.stop(f"failed: {message}", EXIT_FAILED)

    def stop_by_callback(self, line: str, ended: str) -> None:
        """A user's callback asked to stop (returned False, or raised): a clean stop, exit 0."""
        if not self.stopping:
            self._log(f"stopping: {line}")
        self.stop(ended, EXIT_OK)

    def refuse(self, message: str) -> None:
        """A multi-node start refused (a peer without the token, other settings, a forged claim):
        stop saved with exit 0. It is not a failure that a restart mends, and any other status
        would make torchrun restart every node into the same refusal, again and again."""
        self._record_error(f"run stopping: {message}")
        self.stop(f"refused: {message}", EXIT_OK)

    # The supervisor's and the syncer's stops, as events of the session.
    def on_must_stop(self, event: MustStop) -> None:
        self.fail(event.reason)

    def on_refused(self, message: SyncRefused) -> None:
        self.refuse(message.message)

    def on_signal(self, signum: int) -> None:
        self.signals_seen += 1
        name = signal.Signals(signum).name
        if self.signals_seen == 1:
            self._log(f"{name} received: stopping workers, saving a final checkpoint (again to force)"
                      + ("; every node stops with this one, by the stop vote" if self.under_torchrun else ""))
            code = EXIT_SIGINT if signum == signal.SIGINT else EXIT_SIGTERM
            self.stop(f"interrupted ({name})", EXIT_OK if self.under_torchrun else code)
        else:
            self._log(f"{name} received again: killing children now")

    def check_budgets(self, global_step: int, time_s: float) -> None:
        cfg = self.cfg
        if cfg.max_steps is not None and global_step >= cfg.max_steps:
            self.stop("max_steps")
        elif cfg.max_seconds is not None and time_s >= cfg.max_seconds:
            self.stop("max_seconds")

    def check_weights(self, weights: dict[str, torch.Tensor]) -> bool:
        """True when every weight is finite; else the run fails (check a copy, never live tensors)."""
        if all(bool(torch.isfinite(t).all()) for t in weights.values()):
            return True
        self.fail("the shared weights became non-finite (NaN or inf); the run stops instead of training on garbage")
        return False

    def check_some_update(self, worker_stats: torch.Tensor) -> None:
        """At the end: a session that reached its budget having skipped every update it tried
        learned nothing, however short it was (fewer skips than --max-skipped-updates), so it
        does not end "ok"."""
        applied = int(worker_stats[:, STAT["updates"]].sum())
        skipped = int(worker_stats[:, STAT["skipped_updates"]].sum())
        if applied == 0 and skipped > 0 and self.exit_code == EXIT_OK and not self.signals_seen:
            self.fail(f"no update was applied: all {skipped} updates of this session were skipped (non-finite loss or "
                      "gradient: NaN or inf in observations or rewards?)")

    def check_learning(self, worker_stats: torch.Tensor) -> None:
        """A run whose updates are all skipped learns nothing: say so instead of 'succeeding'."""
        in_a_row = worker_stats[:, STAT["skipped_in_a_row"]]
        worst = int(in_a_row.argmax())
        if int(in_a_row[worst]) >= self.cfg.max_skipped_updates:
            self.fail(
                f"worker {worst} skipped {int(in_a_row[worst])} updates in a row (non-finite loss or gradient: "
                f"NaN or inf in observations or rewards?); see --max-skipped-updates"
            )
