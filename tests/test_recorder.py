"""The recorder: CSV rows, meta.json sessions, train.log and errors.log; and the CSV checks it
makes before writing anything."""
import json
from pathlib import Path

import pandas as pd
import pytest

from hogwild_a3c.children.messages import PidsChanged
from hogwild_a3c.config import Config
from hogwild_a3c.files.logs import PROGRESS_COLUMNS, CsvSchemaError, complete_length
from hogwild_a3c.run.callbacks import Evaluation
from hogwild_a3c.run.recorder import Recorder


def test_a_session_is_recorded_in_every_file(tmp_path):
    cfg = Config(env="CartPole-v1", num_workers=1)
    recorder = Recorder(tmp_path, cfg, None, ["--env", "CartPole-v1"], session=0, global_step=0)
    recorder.on_episode(dict(time_s=1.5, global_step=100, worker=0, episode_return=20.0, episode_length=20))
    recorder.on_evaluation(Evaluation(120, (10.0, 12.0), 11.0, lengths=(10, 12), time_s=2.0))
    recorder.on_progress(dict(time_s=3.0, global_step=200, steps_per_s=50.0, policy_loss=0.1, value_loss=0.2,
                              entropy=0.6, grad_norm=1.0, updates=10, skipped_updates=0, env_errors=0,
                              worker_restarts=0, worker_rss_mb=100.0, eval_cpu_share=0.1))
    recorder.on_pids_changed(PidsChanged({"worker 0": 1234}))
    recorder.log("worker 0 was killed by signal 9; restarting it (1/1)")
    recorder.error("worker 0 stalled: no progress for 130 s")
    recorder.end_session("max_steps", 0, 200, 3.5)
    recorder.close()
    assert pd.read_csv(tmp_path / "episodes.csv").iloc[0].to_dict()["episode_return"] == 20.0
    assert list(pd.read_csv(tmp_path / "eval.csv")["episode_return"]) == [10.0, 12.0]
    assert pd.read_csv(tmp_path / "progress.csv")["global_step"].tolist() == [200]
    session = json.loads((tmp_path / "meta.json").read_text())["sessions"][0]
    assert session["ended"] == "max_steps" and session["pids"] == {"worker 0": 1234}
    assert_cpu_is_this_machines(session["cpu"])
    log = (tmp_path / "train.log").read_text()
    assert "restarting it (1/1)" in log and "stalled" in log
    assert "stalled" in (tmp_path / "errors.log").read_text()
    assert json.loads((tmp_path / "config.json").read_text())["env"] == "CartPole-v1"


def assert_cpu_is_this_machines(recorded):
    """The session's CPU record against /proc/cpuinfo read here, not through the code under test."""
    text = Path("/proc/cpuinfo").read_text()
    model = next(line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name"))
    flags = set(next(line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")))
    assert recorded["model"] == model
    assert recorded["torch_capability"] in {"DEFAULT", "VSX", "Z VECTOR", "NO AVX", "AVX2", "AVX512", "SVE256"}
    assert recorded["avx512_bf16"] == ("avx512_bf16" in flags)
    assert recorded["amx"] == ("amx_tile" in flags)
    if recorded["torch_capability"] == "AVX512":
        assert "avx512f" in flags


def test_csv_checks_read_only_and_find_the_last_complete_line(tmp_path):
    path = tmp_path / "eval.csv"
    columns = ("time_s", "global_step", "episode_return", "episode_length")
    assert complete_length(path, columns) == (0, 0)
    path.write_bytes(b"time_s,global_step,episode_return,episode_length\n1,2,3,4\n5,6")
    assert complete_length(path, columns) == (57, 3)
    assert path.read_bytes().endswith(b"5,6")  # nothing changed yet
    path.write_bytes(b"step,loss\n1,2\n")
    with pytest.raises(CsvSchemaError):
        complete_length(path, columns)


def test_a_foreign_csv_stops_the_recorder_before_it_writes_anything(tmp_path):
    (tmp_path / "progress.csv").write_text("step,loss\n1,2\n")
    with pytest.raises(CsvSchemaError):
        Recorder(tmp_path, Config(env="CartPole-v1", num_workers=1), None, [], session=0, global_step=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["progress.csv"]


def test_a_progress_csv_of_an_earlier_version_gets_the_new_columns_and_keeps_its_rows(tmp_path):
    from hogwild_a3c.files.logs import EARLIER_SCHEMAS

    earlier = EARLIER_SCHEMAS["progress.csv"][-1]
    old_row = ",".join(str(i) for i in range(len(earlier)))
    # A run of the earlier version, killed while writing its last row.
    (tmp_path / "progress.csv").write_text(",".join(earlier) + "\n" + old_row + "\n" + "99,1")
    recorder = Recorder(tmp_path, Config(env="CartPole-v1", num_workers=1), None, [], session=1, global_step=10)
    recorder.on_progress({name: 7.0 for name in PROGRESS_COLUMNS})
    recorder.close()
    table = pd.read_csv(tmp_path / "progress.csv")
    assert tuple(table.columns) == PROGRESS_COLUMNS
    assert table.iloc[0, : len(earlier)].tolist() == list(range(len(earlier)))  # the old row, as it was
    assert table.iloc[0, len(earlier):].isna().all()  # with the new columns empty
    assert (table.iloc[1] == 7.0).all() and len(table) == 2  # the cut line dropped, the new row after
    added = ", ".join(PROGRESS_COLUMNS[len(earlier):])
    assert f"added the column(s) {added}" in (tmp_path / "train.log").read_text()
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_an_earlier_progress_csv_as_csv_writer_wrote_it_or_with_no_rows_is_upgraded(tmp_path):
    import csv

    from hogwild_a3c.files.logs import EARLIER_SCHEMAS

    earlier = EARLIER_SCHEMAS["progress.csv"][-1]
    for rows in ([], [[str(i) for i in range(len(earlier))], ["0.5"] * len(earlier)]):
        run_dir = tmp_path / f"rows{len(rows)}"
        run_dir.mkdir()
        with open(run_dir / "progress.csv", "w", newline="") as f:  # \r\n line ends, as the trainer writes
            csv.writer(f).writerows([earlier, *rows])
        Recorder(run_dir, Config(env="CartPole-v1", num_workers=1), None, [], session=1, global_step=0).close()
        table = pd.read_csv(run_dir / "progress.csv")
        assert tuple(table.columns) == PROGRESS_COLUMNS and len(table) == len(rows)
        assert table.iloc[:, : len(earlier)].astype(float).values.tolist() == [[float(v) for v in r] for r in rows]


def test_an_earlier_progress_csv_with_a_ragged_row_is_refused_before_anything_is_written(tmp_path):
    from hogwild_a3c.files.logs import EARLIER_SCHEMAS

    text = ",".join(EARLIER_SCHEMAS["progress.csv"][-1]) + "\n1,2,3\n"
    (tmp_path / "progress.csv").write_text(text)
    with pytest.raises(CsvSchemaError, match="line 2 has 3 fields"):
        Recorder(tmp_path, Config(env="CartPole-v1", num_workers=1), None, [], session=1, global_step=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["progress.csv"]
    assert (tmp_path / "progress.csv").read_text() == text


def test_an_earlier_progress_csv_is_left_alone_when_another_file_is_foreign(tmp_path):
    from hogwild_a3c.files.logs import EARLIER_SCHEMAS

    text = ",".join(EARLIER_SCHEMAS["progress.csv"][-1]) + "\n"
    (tmp_path / "progress.csv").write_text(text)
    (tmp_path / "eval.csv").write_text("step,loss\n1,2\n")
    with pytest.raises(CsvSchemaError):
        Recorder(tmp_path, Config(env="CartPole-v1", num_workers=1), None, [], session=1, global_step=0)
    assert (tmp_path / "progress.csv").read_text() == text


def test_last_time_s_reads_the_last_complete_row(tmp_path):
    from hogwild_a3c.files.logs import last_time_s

    path = tmp_path / "progress.csv"
    assert last_time_s(path) == 0.0  # no file: a clock that starts at 0
    path.write_text("time_s,global_step\n")
    assert last_time_s(path) == 0.0
    path.write_text("time_s,global_step\n" + "".join(f"{t}.5,{t * 100}\n" for t in range(2000)) + "19")
    assert last_time_s(path) == 1999.5  # a row cut by a kill ("19") is skipped, as resume cuts it


class ListWriter:
    """A sink of the user's kind: whatever the writer protocol hands it, kept in a list."""

    def __init__(self, folder):
        self.folder, self.seen, self.closed = folder, [], False

    def target(self, table):
        return self.folder / f"{table}.list"

    def write(self, table, rows):
        self.seen.append((table, [dict(row) for row in rows]))

    def close(self):
        self.closed = True


def test_every_writer_gets_every_table_and_the_scalar_sinks_show_their_series(tmp_path):
    from hogwild_a3c.files.writers import scalars

    recorder = Recorder(tmp_path, Config(env="CartPole-v1", num_workers=1), None, [], session=0, global_step=0)
    sink = ListWriter(tmp_path)
    recorder.writers.append(sink)
    recorder.on_episode(dict(time_s=1.0, global_step=10, worker=1, episode_return=3.0, episode_length=3))
    recorder.on_evaluation(Evaluation(20, (4.0, 8.0), 6.0, lengths=(4, 8), time_s=2.0))
    recorder.close()
    assert [table for table, _ in sink.seen] == ["episodes", "eval"] and sink.closed
    assert [row["episode_return"] for row in sink.seen[1][1]] == [4.0, 8.0]
    assert pd.read_csv(tmp_path / "eval.csv")["episode_length"].tolist() == [4, 8]  # the CSV sink, beside it
    assert scalars("eval", sink.seen[1][1]) == [("eval/mean_return", 6.0, 20)]
    assert scalars("episodes", sink.seen[0][1]) == [("train/episode_return", 3.0, 10)]
    progress = scalars("progress", [{name: 1.0 for name in PROGRESS_COLUMNS}])
    assert {tag for tag, _, _ in progress} == {"train/steps_per_s", "train/policy_loss", "train/value_loss",
                                               "train/entropy", "train/grad_norm"}


def test_a_sink_whose_write_fails_is_the_runs_first_failed_write_and_the_others_still_write(tmp_path):
    class FullDisk(ListWriter):
        def write(self, table, rows):
            raise OSError(28, "No space left on device")

    recorder = Recorder(tmp_path, Config(env="CartPole-v1", num_workers=1), None, [], session=0, global_step=0)
    recorder.writers.insert(0, FullDisk(tmp_path))
    recorder.on_episode(dict(time_s=1.0, global_step=10, worker=0, episode_return=3.0, episode_length=3))
    recorder.close()
    assert recorder.write_failure == f"no space left on device while writing {tmp_path / 'episodes.list'}"
    assert pd.read_csv(tmp_path / "episodes.csv")["episode_return"].tolist() == [3.0]
