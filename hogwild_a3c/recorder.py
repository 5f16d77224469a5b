"""The recorder: everything the main process writes about a run except checkpoints.

CSV files (progress, training episodes, evaluation episodes), `config.json`, `meta.json` (one
entry per session: start, end, how it ended, exit code, child pids), `errors.log` (tracebacks,
stalls, failures), `train.log` (every message the run prints: starts, restarts, recoveries,
saves), and TensorBoard events when asked for. Messages go to the terminal through
`tqdm.write`, so they never land on the progress bar's line.
"""
from __future__ import annotations

import functools
import logging
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .config import MAX_STEPS, Config
from .files import Reserve, WriteError, describe_failure, open_text_no_follow, writing
from .logs import (
    EARLIER_SCHEMAS,
    EPISODES_COLUMNS,
    EVAL_COLUMNS,
    PROGRESS_COLUMNS,
    CsvLog,
    complete_length,
    rewrite_json_in_place,
    rows_to_upgrade,
    upgrade_schema,
    write_json,
)
from .rundir import cpu, new_meta, now_iso, versions


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


KILLED = "killed or crashed (no clean end recorded)"


def close_dead_sessions(
    meta: dict[str, Any], run_dir: Path, checkpoint: tuple[int, Path] | None
) -> list[dict[str, Any]]:
    """Mark the sessions that meta.json still says are running as ended by a kill or a crash.

    Only a process that holds the run's lock gets here, so none of them is running. Each gets
    its last known global step and where that comes from: for a session followed by another,
    the step that one resumed from; for the last, the largest of the newest checkpoint's step
    (`checkpoint`: step and file), progress.csv's last row and the step it started from."""
    sessions = [s for s in meta.get("sessions", []) if isinstance(s, dict)]
    closed = []
    step: int | None
    for i, session in enumerate(sessions):
        if session.get("ended") != "running":
            continue
        following = sessions[i + 1].get("global_step_start") if i + 1 < len(sessions) else None
        if _is_step(following):
            step, source = following, "the step the next session resumed from"
        else:
            step, source = _last_known_step(run_dir, checkpoint, session.get("global_step_start"))
        session.update(ended=KILLED, exit_code=None, global_step_end=step, global_step_end_from=source)
        closed.append(session)
    return closed


def _is_step(value: Any) -> bool:  # read from meta.json: a crafted one may hold anything
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_STEPS


def _last_known_step(run_dir: Path, checkpoint: tuple[int, Path] | None, start: Any) -> tuple[int | None, str]:
    found = []  # (step, rank on a tie, source): a checkpoint is the surest record of a step
    if checkpoint is not None:
        found.append((checkpoint[0], 2, f"the newest checkpoint, {checkpoint[1].name}"))
    row = _last_progress_step(run_dir / "progress.csv")
    if row is not None:
        found.append((row, 1, "progress.csv's last row"))
    if _is_step(start):
        found.append((start, 0, "the step it started from (no later checkpoint or progress row)"))
    if not found:
        return None, "nothing recorded"
    step, _, source = max(found)
    return step, source


def _last_progress_step(path: Path) -> int | None:
    try:
        lines = path.read_bytes().decode(errors="replace").split("\n")
    except OSError:
        return None
    complete = lines[:-1]  # a line without its newline was cut by the kill
    if len(complete) < 2:
        return None
    header, last = complete[0].split(","), complete[-1].split(",")
    try:
        return int(float(last[header.index("global_step")]))
    except (ValueError, IndexError):
        return None


def _append(path: Path, text: str) -> None:
    with open_text_no_follow(path) as f:
        f.write(text)


class Recorder:
    """Writes the run's files; a write that fails is never raised to the caller: the first one
    is kept as `write_failure` (the session's loop stops the run on it), the rest are dropped,
    and errors.log lines that could not be written are tried again at the end."""

    def __init__(self, run_dir: Path, cfg: Config, meta: dict[str, Any] | None, argv: list[str],
                 session: int, global_step: int, node: dict[str, Any] | None = None):
        self.run_dir = run_dir
        self.write_failure: str | None = None
        self.detached: str | None = None
        self._unwritten_errors: list[str] = []
        self.csv: dict[str, CsvLog] = {}
        self.tensorboard = None
        self.wandb = None
        self._wandb_owns_service = False
        self.reserve = None
        # Check every CSV before touching any: a foreign header stops the run with nothing written.
        files = {"episodes": EPISODES_COLUMNS, "eval": EVAL_COLUMNS, "progress": PROGRESS_COLUMNS}
        plans = {name: complete_length(run_dir / f"{name}.csv", columns, EARLIER_SCHEMAS.get(f"{name}.csv", ()))
                 for name, columns in files.items()}
        upgrades = {name: found for name, columns in files.items()
                    if (found := rows_to_upgrade(run_dir / f"{name}.csv", columns, plans[name][0])) is not None}
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
            for name, (_, cut) in plans.items():
                if cut:
                    self.log(f"{name}.csv: its last line was cut ({cut} bytes, no newline); "
                             "dropped it before appending")
            for name, (before, rows) in upgrades.items():
                plans[name] = (upgrade_schema(run_dir / f"{name}.csv", files[name], rows), 0)
                self.log(f"{name}.csv: written by an earlier version; added the column(s) "
                         f"{', '.join(files[name][len(before):])}, empty in the rows already there")
            for name, (keep, _) in plans.items():
                with writing(run_dir / f"{name}.csv"):
                    self.csv[name] = CsvLog(run_dir / f"{name}.csv", files[name], keep)
            write_json(run_dir / "config.json", cfg.to_dict())
            self.reserve = Reserve(run_dir)
            self.meta = meta if meta is not None else new_meta(argv)
            self.session: dict[str, Any] = {
                "session": session, "pid": os.getpid(), "start": now_iso(), "end": None, "ended": "running",
                "exit_code": None, "global_step_start": global_step, "argv": argv,
                "versions": versions(), "cpu": cpu(), "num_workers": cfg.num_workers,
            }
            if node is not None:
                self.session["node"] = node  # rank, world size, host: the multi-node layout of this session
            self.meta["sessions"].append(self.session)
            write_json(run_dir / "meta.json", self.meta)
            if self.write_failure is not None:  # train.log failed quietly, with nobody to tell yet
                raise WriteError(self.write_failure)
        except BaseException:
            self.close()
            raise
        if cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tensorboard = SummaryWriter(str(run_dir / "tensorboard"))
        if cfg.wandb:
            import wandb

            # A run of the user's own (a notebook's) stays active beside this one (reinit) and shares
            # wandb's service process; only a service that this run alone uses is shut down at the end.
            self._wandb_owns_service = wandb.run is None
            # Offline unless the user asked otherwise: training must never wait on a network.
            self.wandb = wandb.init(project="hogwild_a3c", name=run_dir.name, dir=str(run_dir), config=cfg.to_dict(),
                                    # wandb checks the mode it is given; its stub wants one of its literals
                                    mode=os.environ.get("WANDB_MODE", "offline"),  # type: ignore[arg-type]
                                    resume="allow", reinit="create_new",
                                    id=re.sub(r"[^A-Za-z0-9_-]", "-", run_dir.resolve().name)[:64])
            # Rows arrive out of step order (workers report at different moments): plot by global_step.
            self.wandb.define_metric("*", step_metric="global_step")

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

    # -- rows ---------------------------------------------------------------------------------

    def _row(self, name: str, **row: Any) -> None:
        self._attempt(self.csv[name].path, lambda: self.csv[name].write(**row))

    def episode(self, time_s: float, global_step: int, rank: int, episode_return: float, length: int) -> None:
        self._row("episodes", time_s=time_s, global_step=global_step, worker=rank,
                  episode_return=episode_return, episode_length=length)
        self._scalar("train/episode_return", episode_return, global_step)

    def evaluation(self, time_s: float, global_step: int, episodes: tuple[tuple[float, int], ...], mean: float) -> None:
        for episode_return, length in episodes:
            self._row("eval", time_s=time_s, global_step=global_step, episode_return=episode_return,
                      episode_length=length)
        self._scalar("eval/mean_return", mean, global_step)

    def progress(self, **row: Any) -> None:
        self._row("progress", **row)
        for name in ("steps_per_s", "policy_loss", "value_loss", "entropy", "grad_norm"):
            self._scalar(f"train/{name}", row[name], row["global_step"])

    def _scalar(self, tag: str, value: float, step: int) -> None:
        if self.tensorboard is not None:
            self.tensorboard.add_scalar(tag, value, step)
        if self.wandb is not None:
            self.wandb.log({tag: value, "global_step": step})

    # -- meta.json ----------------------------------------------------------------------------

    def child_pids(self, pids: dict[str, int]) -> None:
        """One meta.json write for a batch of started children, not one fsynced write each."""
        self.session.setdefault("pids", {}).update(pids)
        self._write_meta()

    def sync_start(self, agreed: int, restored: int) -> None:
        """A node's session starts where the nodes agreed (the most progress of any), not at the
        step of its own checkpoint, which meta.json keeps beside it."""
        self.session.update(global_step_start=agreed, global_step_restored=restored)
        self._write_meta()

    def end_session(self, ended: str, exit_code: int, global_step: int, time_s: float) -> None:
        """The session's last meta.json, by every means there is: on a full disk the space held
        back since the start is given up for it; where no new file can be made (a read-only
        folder, no free block) the old file is overwritten in place. errors.log lines that could
        not be written before are written after it."""
        self.session.update(end=now_iso(), ended=ended, exit_code=exit_code, global_step_end=global_step,
                            time_s_end=round(time_s, 3))
        if self.detached:
            return
        path = self.run_dir / "meta.json"
        failure = self._write_meta()
        if failure is not None and self.reserve is not None and self.reserve.release():
            failure = self._write_meta()
        if failure is not None:
            failure = self._attempt(path, lambda: rewrite_json_in_place(path, self.meta))
        if failure is not None:
            self.log(f"{path} still says this session is running: {failure}")
        pending, self._unwritten_errors = self._unwritten_errors, []
        errors_log = self.run_dir / "errors.log"
        for stamped in pending:
            self._attempt(errors_log, functools.partial(_append, errors_log, stamped))

    def _write_meta(self) -> str | None:
        path = self.run_dir / "meta.json"
        return self._attempt(path, lambda: write_json(path, self.meta))

    def close(self) -> None:
        for csv_log in self.csv.values():
            try:
                csv_log.close()
            except WriteError:  # its rows were flushed as written; only the last fsync failed
                pass
        if self.tensorboard is not None:
            self.tensorboard.close()
        if self.wandb is not None:
            self.wandb.finish()
            if self._wandb_owns_service:
                import wandb

                # finish() only tells wandb's service process that the run is over; the service
                # writes the run's records to disk after that, so they can still be missing when
                # the run has ended. teardown() waits for the service to flush and exit.
                wandb.teardown()
        for handler in list(self.logger.handlers):
            handler.close()
            self.logger.removeHandler(handler)
        if self.reserve is not None and not self.detached:
            self.reserve.release()
