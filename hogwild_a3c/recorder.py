"""The recorder: everything the main process writes about a run except checkpoints.

CSV files (progress, training episodes, evaluation episodes), `config.json`, `meta.json` (one
entry per session: start, end, how it ended, exit code, child pids), `errors.log` (tracebacks,
stalls, failures), `train.log` (every message the run prints: starts, restarts, recoveries,
saves), and TensorBoard events when asked for. Messages go to the terminal through
`tqdm.write`, so they never land on the progress bar's line.
"""
from __future__ import annotations

import logging
import os
import re
import sys
from pathlib import Path
from typing import Any

from .config import Config
from .logs import EPISODES_COLUMNS, EVAL_COLUMNS, PROGRESS_COLUMNS, CsvLog, complete_length, write_json
from .rundir import new_meta, now_iso, versions


class _TerminalHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        from tqdm import tqdm

        tqdm.write(self.format(record), file=sys.stderr)


class Recorder:
    def __init__(self, run_dir: Path, cfg: Config, meta: dict[str, Any] | None, argv: list[str],
                 session: int, global_step: int, node: dict[str, Any] | None = None):
        self.run_dir = run_dir
        # Check every CSV before touching any: a foreign header stops the run with nothing written.
        files = {"episodes": EPISODES_COLUMNS, "eval": EVAL_COLUMNS, "progress": PROGRESS_COLUMNS}
        plans = {name: complete_length(run_dir / f"{name}.csv", columns) for name, columns in files.items()}
        self.logger = logging.getLogger(f"hogwild_a3c.run.{id(self)}")
        self.logger.setLevel(logging.INFO)
        self.logger.propagate = False
        file_handler = logging.FileHandler(run_dir / "train.log")
        file_handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        self.logger.addHandler(file_handler)
        self.logger.addHandler(_TerminalHandler())
        for name, (_, cut) in plans.items():
            if cut:
                self.log(f"{name}.csv: its last line was cut ({cut} bytes, no newline); dropped it before appending")
        self.csv = {name: CsvLog(run_dir / f"{name}.csv", files[name], keep) for name, (keep, _) in plans.items()}
        write_json(run_dir / "config.json", cfg.to_dict())
        self.meta = meta if meta is not None else new_meta(argv)
        self.session = {
            "session": session, "pid": os.getpid(), "start": now_iso(), "end": None, "ended": "running",
            "exit_code": None, "global_step_start": global_step, "argv": argv,
            "versions": versions(), "num_workers": cfg.num_workers,
        }
        if node is not None:
            self.session["node"] = node  # rank, world size, host: the multi-node layout of this session
        self.meta["sessions"].append(self.session)
        self._write_meta()
        self.tensorboard = None
        if cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tensorboard = SummaryWriter(str(run_dir / "tensorboard"))
        self.wandb = None
        self._wandb_owns_service = False
        if cfg.wandb:
            import wandb

            # A run of the user's own (a notebook's) stays active beside this one (reinit) and shares
            # wandb's service process; only a service that this run alone uses is shut down at the end.
            self._wandb_owns_service = wandb.run is None
            # Offline unless the user asked otherwise: training must never wait on a network.
            self.wandb = wandb.init(project="hogwild_a3c", name=run_dir.name, dir=str(run_dir), config=cfg.to_dict(),
                                    mode=os.environ.get("WANDB_MODE", "offline"), resume="allow", reinit="create_new",
                                    id=re.sub(r"[^A-Za-z0-9_-]", "-", run_dir.resolve().name)[:64])
            # Rows arrive out of step order (workers report at different moments): plot by global_step.
            self.wandb.define_metric("*", step_metric="global_step")

    # -- messages -----------------------------------------------------------------------------

    def log(self, message: str) -> None:
        self.logger.info(message)

    def error(self, text: str) -> None:
        stamped = f"[{now_iso()}] {text.rstrip()}\n"
        with open(self.run_dir / "errors.log", "a") as f:
            f.write(stamped)
        self.log(stamped.rstrip())

    # -- rows ---------------------------------------------------------------------------------

    def episode(self, time_s: float, global_step: int, rank: int, episode_return: float, length: int) -> None:
        self.csv["episodes"].write(time_s=time_s, global_step=global_step, worker=rank,
                                   episode_return=episode_return, episode_length=length)
        self._scalar("train/episode_return", episode_return, global_step)

    def evaluation(self, time_s: float, global_step: int, episodes: tuple[tuple[float, int], ...], mean: float) -> None:
        for episode_return, length in episodes:
            self.csv["eval"].write(time_s=time_s, global_step=global_step, episode_return=episode_return,
                                   episode_length=length)
        self._scalar("eval/mean_return", mean, global_step)

    def progress(self, **row: Any) -> None:
        self.csv["progress"].write(**row)
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

    def end_session(self, ended: str, exit_code: int, global_step: int, time_s: float) -> None:
        self.session.update(end=now_iso(), ended=ended, exit_code=exit_code, global_step_end=global_step,
                            time_s_end=round(time_s, 3))
        self._write_meta()

    def _write_meta(self) -> None:
        write_json(self.run_dir / "meta.json", self.meta)

    def close(self) -> None:
        for csv_log in self.csv.values():
            csv_log.close()
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
