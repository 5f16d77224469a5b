"""The recorder: everything the main process writes about a run except checkpoints, and the
rules for a write that fails.

An observer of the session's events: training and evaluation episodes and progress rows go to
every writer (writers.py: the CSVs, TensorBoard, W&B); what the children and the supervisor say
goes to `train.log`, errors (tracebacks, stalls, failures) to `errors.log` as well; `config.json`
once; `meta.json` (meta.py) at the start, as children start and at the end. Messages go to the
terminal through `tqdm.write`, so they never land on the progress bar's line.
"""
from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..children.messages import ChildRaised, PidsChanged, Said
from ..config import Config
from ..files.atomic import Reserve, WriteError, describe_failure, open_text_no_follow, write_json, writing
from ..files.meta import MetaJson, now_iso
from ..files.writers import CsvWriter, TensorBoardWriter, WandbWriter, Writer
from .callbacks import Evaluation


class _TerminalHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        from tqdm import tqdm

        tqdm.write(self.format(record), file=sys.stderr)


class _RunLogHandler(logging.FileHandler):
    """train.log, whose failed writes go to the recorder instead of logging's own traceback."""

    def __init__(self, path: Path, on_failure: Callable[[str], None]):
        super().__init__(path)
        self._on_failure = on_failure

    def _open(self) -> Any:
        return open_text_no_follow(self.baseFilename)  # a train.log link planted in the run dir is refused

    def handleError(self, record: logging.LogRecord) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):
            self._on_failure(describe_failure(self.baseFilename, exc))
        else:
            super().handleError(record)

    def close(self) -> None:
        try:
            super().close()
        except OSError:  # its last flush: already reported, or too late to matter
            pass


def _append(path: Path, text: str) -> None:
    with open_text_no_follow(path) as f:
        f.write(text)


class Recorder:
    """Writes the run's files; a write that fails is never raised to the caller: the first one
    is kept as `write_failure` (the session stops the run on it), the rest are dropped, and
    errors.log lines that could not be written are tried again at the end."""

    def __init__(self, run_dir: Path, cfg: Config, meta: dict[str, Any] | None, argv: list[str],
                 session: int, global_step: int, node: dict[str, Any] | None = None):
        self.run_dir = run_dir
        self.write_failure: str | None = None
        self.detached: str | None = None
        self._unwritten_errors: list[str] = []
        self.writers: list[Writer] = []
        self.reserve = None
        plans, upgrades = CsvWriter.check(run_dir)  # a foreign CSV stops the run with nothing written
        self.logger = logging.getLogger(f"hogwild_a3c.run.{id(self)}")
        self.logger.setLevel(logging.INFO)
        self.logger.propagate = False
        try:
            # Before the run starts a write that fails is raised (WriteError): nothing to stop yet.
            with writing(run_dir / "train.log"):
                file_handler = _RunLogHandler(run_dir / "train.log", self._failed)
            file_handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
            self.logger.addHandler(file_handler)
            self.logger.addHandler(_TerminalHandler())
            self.writers.append(CsvWriter(run_dir, plans, upgrades, self.log))
            write_json(run_dir / "config.json", cfg.to_dict())
            self.reserve = Reserve(run_dir)
            self.meta = MetaJson(run_dir, meta, argv, session, global_step, cfg.num_workers, node)
            self.meta.write()
            if self.write_failure is not None:  # train.log failed quietly, with nobody to tell yet
                raise WriteError(self.write_failure)
        except BaseException:
            self.close()
            raise
        if cfg.tensorboard:
            self.writers.append(TensorBoardWriter(run_dir))
        if cfg.wandb:
            self.writers.append(WandbWriter(run_dir, cfg.to_dict()))

    # -- failing writes -----------------------------------------------------------------------

    def _attempt(self, path: Path, action: Callable[[], None]) -> str | None:
        """Run one write; None when done, else its one-line failure (also passed on, the first time)."""
        if self.detached:
            return self.detached
        try:
            with writing(path):
                action()
        except WriteError as exc:
            self._failed(str(exc))
            return str(exc)
        return None

    def _failed(self, message: str) -> None:
        if self.write_failure is None:  # the first is the one the session stops on (it reads it each period)
            self.write_failure = message

    def detach(self, reason: str) -> None:
        """The run directory went away: write nothing more there (writing would recreate parts of it)."""
        self.detached = reason
        for handler in list(self.logger.handlers):
            if isinstance(handler, _RunLogHandler):
                handler.close()
                self.logger.removeHandler(handler)

    # -- messages -----------------------------------------------------------------------------

    def log(self, message: str) -> None:
        self.logger.info(message)

    def error(self, text: str) -> None:
        stamped = f"[{now_iso()}] {text.rstrip()}\n"
        path = self.run_dir / "errors.log"
        if self._attempt(path, lambda: _append(path, stamped)) is not None and not self.detached:
            self._unwritten_errors.append(stamped)
        self.log(stamped.rstrip())

    def on_said(self, event: Said) -> None:
        (self.error if event.error else self.log)(event.text)

    def on_child_raised(self, message: ChildRaised) -> None:
        self.error(f"{message.role} {message.rank} raised {message.summary}\n{message.traceback}")

    # -- rows ---------------------------------------------------------------------------------

    def write(self, table: str, rows: list[dict[str, Any]]) -> None:
        for writer in self.writers:
            self._attempt(writer.target(table), functools.partial(writer.write, table, rows))

    def on_episode(self, row: dict[str, Any]) -> None:
        self.write("episodes", [row])

    def on_evaluation(self, evaluation: Evaluation) -> None:
        self.write("eval", [{"time_s": evaluation.time_s, "global_step": evaluation.global_step,
                             "episode_return": episode_return, "episode_length": length}
                            for episode_return, length in zip(evaluation.returns, evaluation.lengths, strict=True)])

    def on_progress(self, row: dict[str, Any]) -> None:
        self.write("progress", [row])

    # -- meta.json ----------------------------------------------------------------------------

    def on_pids_changed(self, event: PidsChanged) -> None:
        """One meta.json write for a batch of started children, not one fsynced write each."""
        self.meta.child_pids(event.pids)
        self._write_meta()

    def sync_start(self, agreed: int, restored: int) -> None:
        self.meta.sync_start(agreed, restored)
        self._write_meta()

    def end_session(self, ended: str, exit_code: int, global_step: int, time_s: float) -> None:
        """The session's last meta.json, by every means there is: on a full disk the space held
        back since the start is given up for it; where no new file can be made (a read-only
        folder, no free block) the old file is overwritten in place. errors.log lines that could
        not be written before are written after it."""
        self.meta.end(ended, exit_code, global_step, time_s)
        if self.detached:
            return
        failure = self._write_meta()
        if failure is not None and self.reserve is not None and self.reserve.release():
            failure = self._write_meta()
        if failure is not None:
            failure = self._attempt(self.meta.path, self.meta.rewrite_in_place)
        if failure is not None:
            self.log(f"{self.meta.path} still says this session is running: {failure}")
        pending, self._unwritten_errors = self._unwritten_errors, []
        errors_log = self.run_dir / "errors.log"
        for stamped in pending:
            self._attempt(errors_log, functools.partial(_append, errors_log, stamped))

    def _write_meta(self) -> str | None:
        return self._attempt(self.meta.path, self.meta.write)

    def close(self) -> None:
        for writer in self.writers:
            writer.close()
        for handler in list(self.logger.handlers):
            handler.close()
            self.logger.removeHandler(handler)
        if self.reserve is not None and not self.detached:
            self.reserve.release()
