"""Where a run's rows go: one small protocol, `Writer`, and a sink for each output, as SB3's
`KVWriter` has: the CSV files (always), TensorBoard (`--tensorboard`), Weights & Biases
(`--wandb`). The recorder hands each writer every table's rows; the rules for a write that
fails are the recorder's, not theirs.

The tables are the CSVs': `episodes` (one row a training episode), `eval` (one row an evaluation
episode, a batch at a time) and `progress` (one row each --progress-interval). The scalar
sinks show a few series of them (`scalars`).
"""
from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from .atomic import WriteError, writing
from .logs import (
    EARLIER_SCHEMAS,
    EPISODES_COLUMNS,
    EVAL_COLUMNS,
    PROGRESS_COLUMNS,
    CsvLog,
    complete_length,
    rows_to_upgrade,
    upgrade_schema,
)

TABLES = {"episodes": EPISODES_COLUMNS, "eval": EVAL_COLUMNS, "progress": PROGRESS_COLUMNS}
PROGRESS_SCALARS = ("steps_per_s", "policy_loss", "value_loss", "entropy", "grad_norm")

Row = dict[str, Any]


class Writer(Protocol):
    def target(self, table: str) -> Path:
        """The file a failed write of `table` is reported against."""

    def write(self, table: str, rows: list[Row]) -> None: ...

    def close(self) -> None: ...


def scalars(table: str, rows: list[Row]) -> list[tuple[str, float, int]]:
    """(tag, value, global step) of the series the scalar sinks show for these rows."""
    if table == "episodes":
        return [("train/episode_return", row["episode_return"], row["global_step"]) for row in rows]
    if table == "eval" and rows:  # one evaluation: its mean
        mean = sum(row["episode_return"] for row in rows) / len(rows)
        return [("eval/mean_return", mean, rows[0]["global_step"])]
    if table == "progress":
        return [(f"train/{name}", row[name], row["global_step"]) for row in rows for name in PROGRESS_SCALARS]
    return []


class CsvWriter:
    """The three CSVs, appended to across sessions. `check` reads every file before any is
    opened, so a foreign header stops the run with nothing written."""

    def __init__(self, run_dir: Path, plans: dict[str, tuple[int, int]], upgrades: dict[str, tuple[tuple[str, ...],
                 list[list[str]]]], log: Callable[[str], None]):
        self.run_dir = run_dir
        self.files: dict[str, CsvLog] = {}
        for table, (_, cut) in plans.items():
            if cut:
                log(f"{table}.csv: its last line was cut ({cut} bytes, no newline); dropped it before appending")
        for table, (before, rows) in upgrades.items():
            plans[table] = (upgrade_schema(self.target(table), TABLES[table], rows), 0)
            log(f"{table}.csv: written by an earlier version; added the column(s) "
                f"{', '.join(TABLES[table][len(before):])}, empty in the rows already there")
        for table, (keep, _) in plans.items():
            with writing(self.target(table)):
                self.files[table] = CsvLog(self.target(table), TABLES[table], keep)

    @staticmethod
    def check(run_dir: Path) -> tuple[dict[str, tuple[int, int]], dict[str, tuple[tuple[str, ...], list[list[str]]]]]:
        """Each CSV's (bytes to keep, bytes of a cut last line), and the rows of those an earlier
        version wrote; reads only. Raises CsvSchemaError for a file that is not this trainer's."""
        plans = {table: complete_length(run_dir / f"{table}.csv", columns, EARLIER_SCHEMAS.get(f"{table}.csv", ()))
                 for table, columns in TABLES.items()}
        upgrades = {table: found for table, columns in TABLES.items()
                    if (found := rows_to_upgrade(run_dir / f"{table}.csv", columns, plans[table][0])) is not None}
        return plans, upgrades

    def target(self, table: str) -> Path:
        return self.run_dir / f"{table}.csv"

    def write(self, table: str, rows: list[Row]) -> None:
        for row in rows:
            self.files[table].write(**row)

    def close(self) -> None:
        for csv_log in self.files.values():
            try:
                csv_log.close()
            except WriteError:  # its rows were flushed as written; only the last fsync failed
                pass


class TensorBoardWriter:
    def __init__(self, run_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.folder = run_dir / "tensorboard"
        self.summary = SummaryWriter(str(self.folder))

    def target(self, table: str) -> Path:
        return self.folder

    def write(self, table: str, rows: list[Row]) -> None:
        for tag, value, step in scalars(table, rows):
            self.summary.add_scalar(tag, value, step)

    def close(self) -> None:
        self.summary.close()


class WandbWriter:
    def __init__(self, run_dir: Path, config: dict[str, Any]):
        import wandb

        self.folder = run_dir / "wandb"
        # A run of the user's own (a notebook's) stays active beside this one (reinit) and shares
        # wandb's service process; only a service that this run alone uses is shut down at the end.
        self.owns_service = wandb.run is None
        # Offline unless the user asked otherwise: training must never wait on a network.
        self.run = wandb.init(project="hogwild_a3c", name=run_dir.name, dir=str(run_dir), config=config,
                              # wandb checks the mode it is given; its stub wants one of its literals
                              mode=os.environ.get("WANDB_MODE", "offline"),  # type: ignore[arg-type]
                              resume="allow", reinit="create_new",
                              id=re.sub(r"[^A-Za-z0-9_-]", "-", run_dir.resolve().name)[:64])
        # Rows arrive out of step order (workers report at different moments): plot by global_step.
        self.run.define_metric("*", step_metric="global_step")

    def target(self, table: str) -> Path:
        return self.folder

    def write(self, table: str, rows: list[Row]) -> None:
        for tag, value, step in scalars(table, rows):
            self.run.log({tag: value, "global_step": step})

    def close(self) -> None:
        self.run.finish()
        if self.owns_service:
            import wandb

            # finish() only tells wandb's service process that the run is over; the service
            # writes the run's records to disk after that, so they can still be missing when
            # the run has ended. teardown() waits for the service to flush and exit.
            wandb.teardown()
