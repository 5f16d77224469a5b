"""The main loop's jobs, each driven directly: no child process, a real SharedState, Recorder
and StopRules on tmp_path, and a stand-in for the supervisor's children."""
import json
import math

import pandas as pd
import torch

from hogwild_a3c.children.messages import ChildRaised, EpisodeEnded, Evaluated, MustStop, PidsChanged, Said, WriteFailed
from hogwild_a3c.children.shared import STAT, SharedState
from hogwild_a3c.config import Config
from hogwild_a3c.files.checkpoint import Progress, load_checkpoint
from hogwild_a3c.learning.lstm_watch import LstmHealth
from hogwild_a3c.learning.model import build_model
from hogwild_a3c.learning.optim import LrSchedule
from hogwild_a3c.run.recorder import Recorder
from hogwild_a3c.run.run_loop import RunLoop
from hogwild_a3c.run.stop_rules import EXIT_FAILED, StopRules


class Children:
    """What the loop asks of the supervisor's children; `inbox` is what they report."""

    def __init__(self, inbox=()):
        self.inbox, self.calls, self.restarts = list(inbox), [], 2

    def start(self, best_return):
        self.calls.append("start")

    def advance(self):
        pass

    def events(self):
        out, self.inbox = self.inbox, []
        return out

    def check(self, best_return):
        pass

    def worker_pids(self):
        return []

    def evaluator_pid(self):
        return None

    def stop(self, fast):
        self.calls.append("stop")


def make_loop(tmp_path, children=None, callbacks=None, **settings):
    cfg = Config(env="CartPole-v1", num_workers=1, lstm_size=8, progress=False, **settings)
    shared = SharedState.create(build_model((4,), 2, cfg), 1, cfg.optimizer, LrSchedule(cfg.lr))
    recorder = Recorder(tmp_path, cfg, None, [], session=0, global_step=0)
    rules = StopRules(cfg, on_stop=shared.request_stop, record_error=recorder.error, log=recorder.log)
    before = Progress(elapsed_s=10.0, best_eval_return=-math.inf, counters={"updates": 5})
    return RunLoop(cfg, tmp_path, shared, recorder, rules, before, 0, children or Children(), callbacks)


def test_delivered_reports_become_rows_the_best_return_and_one_dead_lstm_warning(tmp_path):
    loop = make_loop(tmp_path)
    dead = LstmHealth(cell=200.0, h_spread=0.0)
    at = loop.clock.origin
    loop.handle([EpisodeEnded(rank=0, global_step=40, episode_return=12.0, length=12, wall_time=at + 11),
                  Evaluated(global_step=50, wall_time=at + 12, episodes=((9.0, 9), (11.0, 11)), lstm=dead),
                  Evaluated(global_step=60, wall_time=at + 13, episodes=((7.0, 7),), lstm=dead),
                  ChildRaised("worker", 0, "ValueError: boom", "Traceback ...")])
    loop.shut_down()
    episodes = pd.read_csv(tmp_path / "episodes.csv")
    assert episodes["episode_return"].tolist() == [12.0] and episodes["time_s"].tolist() == [11.0]
    assert pd.read_csv(tmp_path / "eval.csv")["episode_return"].tolist() == [9.0, 11.0, 7.0]
    assert loop.best == 10.0 and loop.latest_eval == 7.0
    assert (tmp_path / "train.log").read_text().count("LSTM looks dead") == 1
    assert "worker 0 raised ValueError: boom" in (tmp_path / "errors.log").read_text()


def test_progress_rows_carry_the_rate_and_the_counters_of_every_session(tmp_path):
    loop = make_loop(tmp_path)
    loop.shared.worker_stats[0, STAT["updates"]] = 3
    loop.write_progress()
    loop.shut_down()
    rows = pd.read_csv(tmp_path / "progress.csv")
    assert rows["updates"].tolist() == [8, 8]  # 5 before this session + 3 now, at both rows
    assert rows["worker_restarts"].tolist() == [2, 2]


def test_a_checkpoint_holds_the_session_and_a_non_finite_model_is_never_saved(tmp_path):
    loop = make_loop(tmp_path)
    loop.best = 3.5
    path = loop.checkpoint()
    saved = load_checkpoint(path)
    assert saved["best_eval_return"] == 3.5 and saved["elapsed_s"] >= 10.0 and saved["counters"]["updates"] == 5
    with torch.no_grad():
        next(loop.shared.model.parameters()).fill_(float("nan"))
    assert loop.checkpoint() is None
    assert loop.rules.exit_code == EXIT_FAILED and "non-finite" in loop.rules.reason
    loop.shut_down()
    assert load_checkpoint(tmp_path / "checkpoints" / "latest.pt")["best_eval_return"] == 3.5


def test_a_failed_write_stops_the_run_once_and_skips_the_final_checkpoint(tmp_path):
    loop = make_loop(tmp_path)
    loop.handle([WriteFailed("evaluator", "no space left on device while writing best.pt"),
                  WriteFailed("evaluator", "no space left on device while writing best.pt")])
    assert loop.rules.exit_code == EXIT_FAILED and "no space left" in loop.rules.reason
    loop.shut_down()
    assert not (tmp_path / "checkpoints" / "latest.pt").exists()
    assert (tmp_path / "errors.log").read_text().count("no space left") == 1


def test_the_session_runs_until_the_target_and_shuts_down_in_order(tmp_path):
    children = Children([Evaluated(global_step=0, wall_time=0.0, episodes=((6.0, 6),))])
    loop = make_loop(tmp_path, children, target_return=5.0, eval_episodes=1)
    loop.run()
    loop.shut_down()
    assert children.calls == ["start", "stop"]
    session = json.loads((tmp_path / "meta.json").read_text())["sessions"][-1]
    assert session["ended"] == "target_return" and session["exit_code"] == 0
    assert (tmp_path / "checkpoints" / "latest.pt").exists()


def test_the_supervisors_events_reach_the_log_the_errors_and_the_stop_rules(tmp_path):
    loop = make_loop(tmp_path)
    loop.handle([Said("worker 0 was killed by signal 9; restarting it (1/1)"), Said("worker 1 stalled", error=True),
                 PidsChanged({"worker 0": 123}), MustStop("worker 0 was killed by signal 9")])
    assert loop.rules.exit_code == EXIT_FAILED and loop.rules.reason == "failed: worker 0 was killed by signal 9"
    loop.shut_down()
    log, errors = (tmp_path / "train.log").read_text(), (tmp_path / "errors.log").read_text()
    assert "restarting it (1/1)" in log and "worker 1 stalled" in errors and "restarting" not in errors
    assert json.loads((tmp_path / "meta.json").read_text())["sessions"][-1]["pids"] == {"worker 0": 123}


def test_the_bar_shows_the_training_return_from_the_first_episode_and_a_time_budget():
    from hogwild_a3c.run.run_loop import bar_postfix

    assert bar_postfix([], None, 3.0, None) == {}
    assert bar_postfix([-21.0, -19.0], None, 30.0, None) == {"return": "-20.0"}
    assert bar_postfix([1.0], 2.5, 90.0, 600.0) == {"return": "1.0", "eval": "2.5", "min": "1.5/10.0"}
