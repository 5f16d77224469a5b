"""User callbacks, in real serial runs: a callback that stops a run from `on_progress`, one that
raises, and the order and content of what each method is given."""
import json

import numpy as np
import pytest

import hogwild_a3c
from hogwild_a3c import Callback
from hogwild_a3c.run.callbacks import Evaluation

SMALL = dict(env="CartPole-v1", lstm_size=16, num_workers=0, progress=False, progress_interval=0.05)


class StopAfterThreeRows(Callback):
    def __init__(self):
        self.rows, self.calls, self.result = [], [], None

    def on_start(self, info):
        self.calls.append("on_start")
        self.info = info

    def on_progress(self, row):
        self.calls.append("on_progress")
        self.rows.append(row)
        return len(self.rows) < 3  # False at the third: stop

    def on_checkpoint(self, path):
        self.calls.append("on_checkpoint")

    def on_end(self, result):
        self.calls.append("on_end")
        self.result = result


@pytest.mark.timeout(120)
def test_a_callback_stops_a_run_after_its_third_progress_row(tmp_path):
    callback = StopAfterThreeRows()
    result = hogwild_a3c.train(**SMALL, max_steps=10_000_000, eval_episodes=0, run_dir=tmp_path / "run",
                               callbacks=[callback])
    assert result.ended == "callback" and result.exit_code == 0
    assert len(callback.rows) == 3 and callback.result == result
    assert callback.calls[0] == "on_start" and callback.calls[-1] == "on_end"
    assert callback.info["run_dir"] == tmp_path / "run" and callback.info["global_step"] == 0
    assert set(callback.rows[0]) >= {"time_s", "global_step", "steps_per_s", "policy_loss", "updates"}
    session = json.loads((tmp_path / "run" / "meta.json").read_text())["sessions"][-1]
    assert session["ended"] == "callback" and session["exit_code"] == 0
    assert (tmp_path / "run" / "checkpoints" / "latest.pt").exists()  # stopped saved
    assert "stopping: callback StopAfterThreeRows.on_progress returned False" in (
        tmp_path / "run" / "train.log").read_text()


class Raises(Callback):
    def on_progress(self, row):
        raise KeyError("no such column")


@pytest.mark.timeout(120)
def test_a_raising_callback_stops_the_run_saved_with_one_line_naming_it(tmp_path, capsys):
    result = hogwild_a3c.train(**SMALL, max_steps=10_000_000, eval_episodes=0, run_dir=tmp_path / "run",
                               callbacks=[Raises()])
    assert result.ended == "callback" and result.exit_code == 0
    line = "callback Raises.on_progress raised KeyError: 'no such column'"
    assert line in (tmp_path / "run" / "errors.log").read_text()
    assert "Traceback" not in (tmp_path / "run" / "errors.log").read_text()
    assert (tmp_path / "run" / "checkpoints" / "latest.pt").exists()
    assert sum(line in text for text in capsys.readouterr().err.splitlines()) >= 1


class Watches:
    """Not a Callback subclass: any object with some of the methods will do."""

    def __init__(self):
        self.evaluations, self.checkpoints = [], []

    def on_evaluation(self, result):
        self.evaluations.append(result)

    def on_checkpoint(self, path):
        self.checkpoints.append(path)


@pytest.mark.timeout(120)
def test_evaluations_and_checkpoints_reach_a_plain_object(tmp_path):
    watch = Watches()
    result = hogwild_a3c.train(**SMALL, max_steps=1500, eval_episodes=2, eval_interval=0.05,
                               checkpoint_interval=0.2, run_dir=tmp_path / "run", callbacks=[watch])
    assert result.ended == "max_steps"
    assert watch.evaluations and all(isinstance(e, Evaluation) and len(e.returns) == 2 for e in watch.evaluations)
    assert all(e.mean_return == sum(e.returns) / 2 for e in watch.evaluations)
    assert watch.checkpoints[-1].name.startswith("ckpt-") and watch.checkpoints[-1].exists()


def test_what_is_not_a_callback_is_refused_before_anything_is_written(tmp_path):
    for bad, expected in ((Callback, "is a class; pass an instance, Callback()"), (object(), "has none of"),
                          ("on_end", "must be a list")):
        with pytest.raises(ValueError, match=expected):
            hogwild_a3c.train(**SMALL, max_steps=100, run_dir=tmp_path / "run",
                              callbacks=bad if isinstance(bad, str) else [bad])
    assert not (tmp_path / "run").exists()


class Exits(Callback):
    """`sys.exit()` in a callback, the idiom of many scripts; raised again if called again, as a
    callback that keeps failing during the shutdown would be."""

    def __init__(self, exception):
        self.exception, self.ended = exception, None

    def on_progress(self, row):
        raise self.exception

    def on_end(self, result):
        self.ended = result


class NumpyFalse(Callback):
    def on_progress(self, row):
        return np.float64(row["global_step"]) < 0.0  # np.bool_(False)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("exception, word", [(SystemExit(0), "SystemExit"), (KeyboardInterrupt(), "KeyboardInterrupt"),
                                             (BaseException("odd"), "BaseException: odd")])
def test_a_callback_that_exits_or_raises_a_base_exception_stops_the_run_saved(tmp_path, exception, word):
    callback = Exits(exception)
    result = hogwild_a3c.train(**SMALL, max_steps=10_000_000, eval_episodes=0, run_dir=tmp_path / "run",
                               callbacks=[callback])
    assert result.ended == "callback" and callback.ended == result
    assert result.exit_code == 0  # as returning False
    session = json.loads((tmp_path / "run" / "meta.json").read_text())["sessions"][-1]
    assert session["ended"] == "callback" and session["exit_code"] == 0
    assert (tmp_path / "run" / "checkpoints" / "latest.pt").exists()
    assert not (tmp_path / "run" / ".reserve").exists()
    assert f"stopping: callback Exits.on_progress raised {word}" in (tmp_path / "run" / "train.log").read_text()


@pytest.mark.timeout(120)
def test_numpys_false_stops_the_run_as_false_does(tmp_path):
    result = hogwild_a3c.train(**SMALL, max_steps=10_000_000, eval_episodes=0, run_dir=tmp_path / "run",
                               callbacks=[NumpyFalse()])
    assert result.ended == "callback" and result.exit_code == 0
    assert "stopping: callback NumpyFalse.on_progress returned False" in (tmp_path / "run" / "train.log").read_text()


BLOCKING_SCRIPT = """
import pathlib, sys, time
import hogwild_a3c

class Blocks(hogwild_a3c.Callback):
    def on_progress(self, row):
        if row["global_step"] > 0:  # once the workers train: the weights to save are theirs
            pathlib.Path(sys.argv[2]).write_text("in")
            time.sleep(600)

    def on_end(self, result):
        pathlib.Path(sys.argv[2]).write_text("on_end called")

if __name__ == "__main__":
    result = hogwild_a3c.train(env="CartPole-v1", lstm_size=16, num_workers=1, eval_episodes=0, progress=False,
                               progress_interval=0.5, run_dir=sys.argv[1], callbacks=[Blocks()])
    sys.exit(result.exit_code)
"""


@pytest.mark.timeout(150)
def test_a_second_ctrl_c_stops_a_run_whose_callback_blocks_saved(tmp_path):
    """Issue 64 M1: a callback that sleeps kept Ctrl-C, a second Ctrl-C and SIGTERM from saving
    anything; only kill -9 ended the run, with no checkpoint and meta.json 'running'."""
    import signal
    import subprocess
    import sys

    from hogwild_a3c.files.checkpoint import load_checkpoint
    from tests.helpers import REPO, finish, last_session, wait_for

    script, marker, run_dir = tmp_path / "blocking.py", tmp_path / "marker", tmp_path / "run"
    script.write_text(BLOCKING_SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), str(run_dir), str(marker)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_for(lambda: marker.exists(), timeout=90, what="the callback to block", proc=proc)
    proc.send_signal(signal.SIGINT)
    wait_for(lambda: "SIGINT received" in (run_dir / "train.log").read_text(), timeout=30, what="the first Ctrl-C",
             proc=proc)
    proc.send_signal(signal.SIGINT)
    code, out = finish(proc, timeout=60)
    assert code == 130, out
    assert last_session(run_dir)["ended"] == "interrupted (SIGINT)"
    assert load_checkpoint(run_dir / "checkpoints" / "latest.pt")["global_step"] > 0
    assert "callback Blocks.on_progress was cut short by a second signal" in (run_dir / "errors.log").read_text()
    assert marker.read_text() == "on_end called"  # after everything was saved
