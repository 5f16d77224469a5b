"""The run directory's CSV files: a fixed schema, one row per line, flushed as written, appended
on resume; and `load_run`, the one loader the plot command and the notebook share."""
from __future__ import annotations

import csv
import io
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .atomic import link_problem, open_text_no_follow, read_json_data, write_atomically, writing
from .plain_data import shown

EPISODES_COLUMNS = ("time_s", "global_step", "worker", "episode_return", "episode_length")
EVAL_COLUMNS = ("time_s", "global_step", "episode_return", "episode_length")
PROGRESS_COLUMNS = (
    "time_s", "global_step", "steps_per_s", "policy_loss", "value_loss", "entropy", "grad_norm",
    "updates", "skipped_updates", "env_errors", "worker_restarts", "worker_rss_mb", "eval_cpu_share",
)
# Headers that earlier versions wrote, each a prefix of this version's: resuming such a run adds
# the new columns to the file (`upgrade_schema`), empty in the rows already there.
EARLIER_SCHEMAS = {"progress.csv": (
    ("time_s", "global_step", "steps_per_s", "policy_loss", "value_loss", "entropy", "grad_norm",
     "updates", "skipped_updates", "env_errors", "worker_restarts", "worker_rss_mb"),  # before eval_cpu_share
)}
SCHEMAS = {"episodes.csv": EPISODES_COLUMNS, "eval.csv": EVAL_COLUMNS, "progress.csv": PROGRESS_COLUMNS}


def last_time_s(path: str | os.PathLike) -> float:
    """The time_s of the last complete row of a CSV written here (0.0 if none can be read)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, os.path.getsize(path) - 4096))
            text = handle.read().decode(errors="replace")
    except OSError:
        return 0.0
    lines = text[: text.rfind("\n") + 1].splitlines()  # a last line without its newline was cut by a kill
    for line in reversed(lines[1:] if len(lines) > 1 else []):
        try:
            return max(0.0, float(line.split(",", 1)[0]))
        except ValueError:
            continue
    return 0.0


class CsvSchemaError(ValueError):
    """An existing CSV file whose header is not the one this version writes."""


def complete_length(path: str | os.PathLike, columns: Iterable[str], earlier: Iterable[tuple[str, ...]] = ()
                    ) -> tuple[int, int]:
    """(bytes up to the end of the last complete line, bytes after it) of an existing CSV, after
    checking its header (this version's, or one of `earlier` ones, which `upgrade_schema` turns into
    this version's); (0, 0) for a missing or empty file. Reads only; raises CsvSchemaError.

    A line cut by a crash (power loss, `kill -9` mid-write) has no newline: appending to it
    would glue the next row onto it and break every reader of the file for good."""
    path = Path(path)
    columns = tuple(columns)
    if not path.exists() or path.stat().st_size == 0:
        return 0, 0
    data = path.read_bytes()
    keep = data.rfind(b"\n") + 1
    if keep == 0:  # not even the header is whole: start the file again
        return 0, len(data)
    header = tuple(next(csv.reader([data[:keep].split(b"\n", 1)[0].decode(errors="replace")]), ()))
    if header != columns and header not in tuple(earlier):
        raise CsvSchemaError(
            f"{path}: its header {','.join(header)} is not this version's {','.join(columns)}; "
            "appending would mix schemas, so the file was left as it is"
        )
    return keep, len(data) - keep


def rows_to_upgrade(path: str | os.PathLike, columns: Iterable[str], keep_bytes: int
                    ) -> tuple[tuple[str, ...], list[list[str]]] | None:
    """(its header, its complete rows padded with empty new columns) for a CSV written under an
    earlier header, a prefix of `columns`, whose complete lines end at `keep_bytes`
    (`complete_length`); None if it has this version's header or nothing whole. Reads only; a row
    whose field count is not its header's raises CsvSchemaError."""
    path = Path(path)
    columns = tuple(columns)
    if keep_bytes == 0:
        return None
    with open(path, "rb") as handle:
        lines = handle.read(keep_bytes).decode(errors="replace").splitlines()
    first, *rows = list(csv.reader(lines))
    header = tuple(first)
    if header == columns:
        return None
    if columns[: len(header)] != header:
        raise CsvSchemaError(f"{path}: its header {','.join(header)} does not begin this version's {','.join(columns)}")
    ragged = next((n for n, row in enumerate(rows, start=2) if len(row) != len(header)), None)
    if ragged is not None:
        raise CsvSchemaError(f"{path}: line {ragged} has {len(rows[ragged - 2])} fields where its header has "
                             f"{len(header)}; the file was left as it is")
    padding = [""] * (len(columns) - len(header))
    return header, [row + padding for row in rows]


def upgrade_schema(path: str | os.PathLike, columns: Iterable[str], rows: list[list[str]]) -> int:
    """Rewrite a CSV as `columns` and `rows` (from `rows_to_upgrade`). Atomic (a temp file,
    fsynced, renamed over it): a crash leaves the old file whole. Returns its length in bytes,
    all of it complete lines."""
    text = io.StringIO(newline="")
    writer = csv.writer(text)
    writer.writerow(tuple(columns))
    writer.writerows(rows)
    write_atomically(path, text.getvalue())
    return len(text.getvalue().encode())


class CsvLog:
    """Append-only CSV with a fixed header. Check every file with `complete_length` before
    opening any, so that a bad one stops the run before anything is written."""

    def __init__(self, path: str | os.PathLike, columns: Iterable[str], keep_bytes: int):
        self.path = Path(path)
        self.columns = tuple(columns)
        self._file = open_text_no_follow(self.path)
        if self._file.tell() != keep_bytes:
            self._file.truncate(keep_bytes)
        self._writer = csv.writer(self._file)
        if keep_bytes == 0:
            self._writer.writerow(self.columns)
            self._file.flush()

    def write(self, **row: Any) -> None:
        with writing(self.path):
            self._writer.writerow([_format(row[c]) for c in self.columns])
            self._file.flush()

    def close(self) -> None:
        if self._file.closed:
            return
        try:
            with writing(self.path):
                self._file.flush()
                os.fsync(self._file.fileno())
        finally:
            try:
                self._file.close()  # the descriptor is closed even when the last flush fails
            except OSError:
                pass


def _format(value: Any) -> Any:
    if isinstance(value, float):
        return f"{value:.6g}"
    return value


def load_run(run_dir: str | os.PathLike) -> dict[str, Any]:
    """A run as plain data: {'run_dir', 'name', 'config', 'meta', 'episodes', 'eval', 'progress'};
    the three tables are pandas DataFrames (empty, with the right columns, if the file is missing)."""
    import pandas as pd

    run_dir = Path(run_dir)
    linked = link_problem(run_dir)
    if linked:
        raise RunReadError(linked)
    if not (run_dir / "config.json").is_file() and (run_dir / "nodes").is_dir():
        return _load_nodes(run_dir)
    if not (run_dir / "config.json").is_file():
        raise FileNotFoundError(f"{run_dir}: not a run directory (no config.json)")
    run: dict[str, Any] = {"run_dir": run_dir, "name": run_dir.name}
    for name in ("config", "meta"):
        path = run_dir / f"{name}.json"
        run[name] = _read_object(path) if path.is_file() else {}
    for file, columns in SCHEMAS.items():
        path = run_dir / file
        key = file[: -len(".csv")]
        run[key] = _read_table(path, columns) if path.is_file() and path.stat().st_size else \
            pd.DataFrame(columns=columns)
    return run


class RunReadError(ValueError):
    """A run directory's file that cannot be read as this trainer writes it; one line naming it."""


def _read_object(path: Path) -> dict[str, Any]:
    try:
        data = read_json_data(path)
    except (OSError, ValueError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise RunReadError(f"{path}: not readable JSON ({reason})") from None
    if not isinstance(data, dict):
        raise RunReadError(f"{path}: holds {type(data).__name__}, not the JSON object this trainer writes")
    return data


def _read_table(path: Path, columns: tuple[str, ...]) -> Any:
    import pandas as pd

    try:
        table = pd.read_csv(path)
    except (OSError, ValueError, UnicodeDecodeError) as exc:  # pandas' parser errors are ValueErrors
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RunReadError(f"{path}: not a readable CSV ({reason[:160]})") from None
    missing = [column for column in columns[:2] if column not in table.columns]  # time_s, global_step: what plots use
    if missing:
        raise RunReadError(f"{path}: has no {', '.join(missing)} column; it is not this trainer's CSV "
                           f"(its header: {shown(','.join(map(str, table.columns)))})")
    for column in [c for c in (*columns[:2], "episode_return") if c in table.columns]:  # what plots draw
        values = table[column].dropna()
        text = values[pd.to_numeric(values, errors="coerce").isna()]
        if len(text):
            raise RunReadError(f"{path}: column {shown(column)} holds text where numbers belong "
                               f"({shown(text.iloc[0])}); the file was damaged or edited")
        table[column] = pd.to_numeric(table[column])
    return table


def _load_nodes(run_dir: Path) -> dict[str, Any]:
    """A multi-node run as one: the config and progress of the node that ran the evaluator
    (its global_step already counts every node's steps), every node's episodes (with a `node`
    column) and the evaluations, in time order."""
    import pandas as pd

    nodes = [load_run(path) for path in sorted((run_dir / "nodes").iterdir()) if (path / "config.json").is_file()]
    if not nodes:
        raise FileNotFoundError(f"{run_dir}: not a run directory (no config.json, and no node under nodes/)")
    head = max(nodes, key=lambda node: len(node["eval"]))
    episodes = pd.concat([node["episodes"].assign(node=node["name"]) for node in nodes], ignore_index=True)
    evals = pd.concat([node["eval"] for node in nodes], ignore_index=True)
    return {
        "run_dir": run_dir, "name": run_dir.name, "config": head["config"],
        "meta": {**head["meta"], "nodes": {node["name"]: node["meta"] for node in nodes}},
        "episodes": episodes.sort_values("time_s", kind="stable", ignore_index=True),
        "eval": evals.sort_values("time_s", kind="stable", ignore_index=True),
        "progress": head["progress"],
    }
