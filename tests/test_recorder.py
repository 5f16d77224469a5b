"""The recorder: CSV rows, meta.json sessions, train.log and errors.log; and the CSV checks it
makes before writing anything."""
import json

import pandas as pd
import pytest

from hogwild_a3c.config import Config
from hogwild_a3c.logs import CsvSchemaError, complete_length
from hogwild_a3c.recorder import Recorder


def test_a_session_is_recorded_in_every_file(tmp_path):
    cfg = Config(env="CartPole-v1", num_workers=1)
    recorder = Recorder(tmp_path, cfg, None, ["--env", "CartPole-v1"], session=0, global_step=0)
    recorder.episode(1.5, 100, 0, 20.0, 20)
    recorder.evaluation(2.0, 120, ((10.0, 10), (12.0, 12)), 11.0)
    recorder.progress(time_s=3.0, global_step=200, steps_per_s=50.0, policy_loss=0.1, value_loss=0.2, entropy=0.6,
                      grad_norm=1.0, updates=10, skipped_updates=0, env_errors=0, worker_restarts=0,
                      worker_rss_mb=100.0)
    recorder.child_pids({"worker 0": 1234})
    recorder.log("worker 0 was killed by signal 9; restarting it (1/1)")
    recorder.error("worker 0 stalled: no progress for 130 s")
    recorder.end_session("max_steps", 0, 200, 3.5)
    recorder.close()
    assert pd.read_csv(tmp_path / "episodes.csv").iloc[0].to_dict()["episode_return"] == 20.0
    assert list(pd.read_csv(tmp_path / "eval.csv")["episode_return"]) == [10.0, 12.0]
    assert pd.read_csv(tmp_path / "progress.csv")["global_step"].tolist() == [200]
    session = json.loads((tmp_path / "meta.json").read_text())["sessions"][0]
    assert session["ended"] == "max_steps" and session["pids"] == {"worker 0": 1234}
    log = (tmp_path / "train.log").read_text()
    assert "restarting it (1/1)" in log and "stalled" in log
    assert "stalled" in (tmp_path / "errors.log").read_text()
    assert json.loads((tmp_path / "config.json").read_text())["env"] == "CartPole-v1"


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


def test_last_time_s_reads_the_last_complete_row(tmp_path):
    from hogwild_a3c.logs import last_time_s

    path = tmp_path / "progress.csv"
    assert last_time_s(path) == 0.0  # no file: a clock that starts at 0
    path.write_text("time_s,global_step\n")
    assert last_time_s(path) == 0.0
    path.write_text("time_s,global_step\n" + "".join(f"{t}.5,{t * 100}\n" for t in range(2000)) + "19")
    assert last_time_s(path) == 1999.5  # a row cut by a kill ("19") is skipped, as resume cuts it
