"""Corruption, lost data and bad input on disk, injected for real: a cut CSV line, two trainers
on one run, a run that learns nothing, a full disk, damaged config.json/meta.json, bad run
directories, foreign checkpoints, offset action spaces, and a checkpoint naming a module."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from hogwild_a3c import evaluate, train
from hogwild_a3c.files.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from hogwild_a3c.run.prepare import prepare
from tests.helpers import (
    CARTPOLE,
    REPO,
    last_progress,
    last_session,
    mount_tmpfs,
    one_error_line,
    serial_run,
    start_training,
    wait_for,
)


def snapshot(run_dir):
    return {p.relative_to(run_dir): p.read_bytes() for p in sorted(Path(run_dir).rglob("*")) if p.is_file()}


# -- a CSV line cut by a crash ------------------------------------------------------------------

def test_resume_cuts_a_half_written_csv_line_before_appending(tmp_path, capsys):
    run_dir = serial_run(tmp_path / "run")
    with open(run_dir / "progress.csv", "ab") as f:
        f.write(b"12.5,1234,99")  # what kill -9 mid-write leaves: no newline
    with open(run_dir / "episodes.csv", "ab") as f:
        f.write(b"3.1,")
    capsys.readouterr()
    assert train.main(["--resume", str(run_dir), "--max-steps", "400", "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "progress.csv: its last line was cut (12 bytes" in err
    assert "episodes.csv: its last line was cut (4 bytes" in err
    progress = pd.read_csv(run_dir / "progress.csv")  # loads: no glued row
    assert progress["global_step"].is_monotonic_increasing and 1234 not in set(progress["global_step"])
    assert len(pd.read_csv(run_dir / "episodes.csv")) > 0


# -- two trainers on one run -------------------------------------------------------------------

@pytest.mark.timeout(200)
def test_a_second_trainer_on_a_running_run_is_refused_and_writes_nothing(tmp_path, run_cli):
    run_dir = tmp_path / "run"
    proc, _ = start_training(run_dir, "--num-workers", "1", "--eval-episodes", "0", "--max-seconds", "120",
                             "--checkpoint-interval", "1")
    wait_for(lambda: (run_dir / "checkpoints" / "latest.pt").exists(), what="a checkpoint", proc=proc)
    try:
        meta_before = (run_dir / "meta.json").read_text()
        config_before = (run_dir / "config.json").read_text()
        for argv in (["--resume", run_dir, "--max-steps", "100"], [*CARTPOLE, "--run-dir", run_dir]):
            second = run_cli(*argv, timeout=120)
            lines = second.stderr.strip().splitlines()
            assert second.returncode == 2 and len(lines) == 1, second.stderr
            assert f"is in use by another trainer (pid {proc.pid})" in lines[0]
        assert (run_dir / "meta.json").read_text() == meta_before
        assert (run_dir / "config.json").read_text() == config_before
    finally:
        proc.send_signal(signal.SIGKILL)  # the lock dies with its holder, even by kill -9
        proc.wait(timeout=30)
    resumed = run_cli("--resume", run_dir, "--max-steps", "100", "--no-progress", "--num-workers", "0", timeout=120)
    assert resumed.returncode == 0, resumed.stderr


# -- a run that learns nothing ----------------------------------------------------------------

def test_a_run_whose_updates_are_all_skipped_fails_with_a_reason(tmp_path):
    run_dir = tmp_path / "run"
    code = train.main([
        "--env", "tests.envs:Faulty-v0", "--env-kwargs", "fault='nan_obs'", "fail_at=1",
        "--num-workers", "0", "--max-seconds", "120", "--max-skipped-updates", "20", "--eval-episodes", "0",
        "--lstm-size", "8", "--progress-interval", "0.2", "--no-progress", "--run-dir", str(run_dir),
    ])
    assert code == 1
    ended = last_session(run_dir)["ended"]
    assert ended.startswith("failed: worker 0 skipped") and "updates in a row" in ended
    assert last_progress(run_dir)["skipped_updates"] >= 20


def test_a_short_run_that_applied_no_update_does_not_end_ok(tmp_path):
    """Issue 64 L5: fewer skips than --max-skipped-updates, the budget reached, 0 updates applied:
    it ended "max_steps", exit 0."""
    run_dir = tmp_path / "run"
    code = train.main([
        "--env", "tests.envs:Faulty-v0", "--env-kwargs", "fault='nan_obs'", "fail_at=1",
        "--num-workers", "0", "--max-steps", "300", "--eval-episodes", "0", "--lstm-size", "8",
        "--no-progress", "--run-dir", str(run_dir),
    ])
    assert code == 1
    ended = last_session(run_dir)["ended"]
    assert ended.startswith("failed: no update was applied: all ") and "skipped" in ended
    assert last_progress(run_dir)["updates"] == 0


# -- a full disk -------------------------------------------------------------------------------

@pytest.fixture
def small_disk(tmp_path):
    yield from mount_tmpfs(tmp_path / "disk", "3m", "cannot mount a small tmpfs here (needs root, as on CI)")


def test_a_full_disk_is_one_clear_line_and_the_previous_checkpoint_survives(small_disk):
    folder = small_disk / "checkpoints"
    save_checkpoint(folder, {"global_step": 1, "w": torch.ones(3)}, 1)
    free = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
    (small_disk / "filler").write_bytes(b"\0" * (free - 64 * 1024))  # the kernel's own ENOSPC, part-way through
    with pytest.raises(CheckpointError, match=r"^no space left on device while writing .*ckpt-000000000002\.pt$"):
        save_checkpoint(folder, {"global_step": 2, "w": torch.ones(100_000)}, 2)
    assert load_checkpoint(folder / "latest.pt")["global_step"] == 1
    assert not any(p.name.startswith(".") for p in folder.iterdir())


def test_a_link_planted_as_a_checkpoints_temp_file_is_not_written_through(tmp_path):
    folder, victim = tmp_path / "checkpoints", tmp_path / "victim"
    victim.write_bytes(b"precious")
    save_checkpoint(folder, {"global_step": 1, "w": torch.ones(3)}, 1)
    (folder / f".ckpt-{2:012d}.pt.{os.getpid()}.tmp").symlink_to(victim)
    with pytest.raises(CheckpointError, match=r"^cannot write .*ckpt-000000000002\.pt: Too many levels of symbolic"):
        save_checkpoint(folder, {"global_step": 2, "w": torch.ones(3)}, 2)
    assert victim.read_bytes() == b"precious"
    assert load_checkpoint(folder / "latest.pt")["global_step"] == 1


def test_a_run_on_a_full_disk_stops_with_one_line_in_meta(small_disk):
    run_dir = serial_run(small_disk / "run")
    free = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
    (small_disk / "filler").write_bytes(b"\0" * (free - 24 * 1024))  # room for logs, not for a checkpoint
    code = train.main(["--resume", str(run_dir), "--max-steps", "400", "--no-progress"])
    assert code == 1
    ended = last_session(run_dir)["ended"]
    assert ended.startswith("failed: no space left on device while writing") and "\n" not in ended
    assert load_checkpoint(run_dir / "checkpoints" / "latest.pt")["global_step"] >= 200


# -- damaged config.json and meta.json on --resume ---------------------------------------------

def edit_config(key, value):
    def edit(config):
        if value is KeyError:
            del config[key]
        else:
            config[key] = value
        return config
    return edit


DAMAGED = [
    ("config.json", edit_config("lr", "abc"), "'lr' must be a number"),
    ("config.json", edit_config("num_workers", "two"), "'num_workers' must be an integer or null"),
    ("config.json", edit_config("lstm_size", 64), "'lstm_size' is 64 but"),
    ("config.json", edit_config("env", KeyError), "missing setting 'env'"),
    ("config.json", lambda config: [config], "expected a JSON object"),
    ("meta.json", lambda meta: {}, "has no list of sessions"),
    ("meta.json", None, "not readable JSON"),
]


@pytest.mark.parametrize("name,damage,expected", DAMAGED)
def test_a_damaged_saved_file_is_refused_in_one_line_and_nothing_is_written(tmp_path, capsys, name, damage, expected):
    run_dir = serial_run(tmp_path / "run")
    path = run_dir / name
    path.write_text("{not json" if damage is None else json.dumps(damage(json.loads(path.read_text()))))
    before = snapshot(run_dir)
    capsys.readouterr()
    assert train.main(["--resume", str(run_dir), "--max-steps", "400", "--no-progress"]) == 2
    line = one_error_line(capsys)
    assert name in line and expected in line, line
    assert snapshot(run_dir) == before


def test_a_run_saved_before_the_forget_bias_setting_resumes_as_the_run_it_was(tmp_path):
    """Runs started before `lstm_forget_bias` existed were initialised with 0.0 and saved no such
    key: their config reads back as 0.0 (not today's default, 1.0), and they resume."""
    from hogwild_a3c.files.rundir import read_saved_config

    run_dir = serial_run(tmp_path / "run", "--lstm-size", "8")
    config_path = run_dir / "config.json"
    saved = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({k: v for k, v in saved.items() if k != "lstm_forget_bias"}))
    payload = load_checkpoint(run_dir / "checkpoints" / "latest.pt")
    payload["config"].pop("lstm_forget_bias")
    for path in (run_dir / "checkpoints").glob("*.pt"):
        path.unlink()
    save_checkpoint(run_dir / "checkpoints", payload, payload["global_step"])
    assert read_saved_config(run_dir).lstm_forget_bias == 0.0
    assert train.main(["--resume", str(run_dir), "--max-steps", "400", "--no-progress"]) == 0
    assert read_saved_config(run_dir).lstm_forget_bias == 0.0


# -- run directories that cannot be ------------------------------------------------------------

def test_run_dir_that_is_a_file_or_under_one_or_under_proc_is_one_line(tmp_path, capsys):
    a_file = tmp_path / "file"
    a_file.write_text("mine\n")
    for run_dir, expected in [(a_file, "is a file"), (a_file / "run", "is a file, so no folder"),
                              (Path("/proc/hogwild-run"), "cannot make the folder")]:
        assert train.main([*CARTPOLE, "--run-dir", str(run_dir), "--max-steps", "10"]) == 2
        assert expected in one_error_line(capsys)
    assert a_file.read_text() == "mine\n"


# -- checkpoints that are not ours -------------------------------------------------------------

class NotWeights:
    pass


def test_a_checkpoint_carrying_code_is_refused_as_not_weights_only(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"format": "hogwild_a3c/checkpoint-v1", "model": {}, "payload": NotWeights()}, path)
    with pytest.raises(CheckpointError, match="refused: not a weights-only checkpoint"):
        load_checkpoint(path)


def test_resume_from_a_checkpoint_without_model_or_of_another_size_is_one_line(tmp_path, capsys):
    run_dir = serial_run(tmp_path / "run")
    latest = run_dir / "checkpoints" / "latest.pt"
    payload = load_checkpoint(latest)
    no_model = {k: v for k, v in payload.items() if k != "model"}
    cut_model = {**payload, "model": {k: v[..., :1] if v.dim() else v for k, v in payload["model"].items()}}
    for broken, expected in [(no_model, "not a training checkpoint (no model)"),
                             (cut_model, "does not fit this config")]:
        for path in (run_dir / "checkpoints").glob("*.pt"):
            path.unlink()
        save_checkpoint(run_dir / "checkpoints", broken, 200)
        capsys.readouterr()
        assert train.main(["--resume", str(run_dir), "--max-steps", "400"]) == 2
        assert expected in one_error_line(capsys)


def test_evaluate_says_what_a_wrong_file_is(tmp_path, capsys):
    run_dir = serial_run(tmp_path / "run", "--lstm-size", "16")
    capsys.readouterr()
    assert evaluate.main([str(run_dir / "config.json")]) == 2
    assert "not a checkpoint (a JSON file" in one_error_line(capsys)
    payload = load_checkpoint(run_dir / "checkpoints" / "latest.pt")
    payload["config"]["lstm_size"] = 32
    save_checkpoint(tmp_path / "other", payload, 1)
    assert evaluate.main([str(tmp_path / "other" / "latest.pt")]) == 2
    assert "does not fit this config" in one_error_line(capsys)


# -- offset action spaces, oversubscription ----------------------------------------------------

def test_an_action_space_that_starts_at_one_is_trained(tmp_path):
    run_dir = serial_run(tmp_path / "run", "--env", "tests.envs:OffsetAction-v0", "--lstm-size", "8")
    assert last_progress(run_dir)["env_errors"] == 0 and last_progress(run_dir)["updates"] > 0


def test_far_more_workers_than_cores_is_warned_in_one_line(tmp_path, capsys):
    workers = 3 * (os.cpu_count() or 1)
    prepared = prepare([*CARTPOLE, "--num-workers", str(workers), "--run-dir", str(tmp_path / "run")])
    prepared.lock.release()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"warning: --num-workers {workers} on ")


# -- a checkpoint never imports code by itself -------------------------------------------------

def test_evaluate_never_imports_a_module_named_by_a_checkpoint(tmp_path):
    (tmp_path / "planted_env.py").write_text(
        "import pathlib, gymnasium\n"
        f"pathlib.Path({str(tmp_path / 'IMPORTED')!r}).write_text('code ran')\n"
        "gymnasium.register('Planted-v0', entry_point='gymnasium.envs.classic_control:CartPoleEnv')\n"
    )
    run_dir = serial_run(tmp_path / "run", "--lstm-size", "16")
    payload = load_checkpoint(run_dir / "checkpoints" / "latest.pt")
    payload["config"]["env"] = "planted_env:Planted-v0"
    save_checkpoint(tmp_path / "shared", payload, 1)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"}
    command = [sys.executable, "-m", "hogwild_a3c.evaluate", str(tmp_path / "shared" / "latest.pt"), "--episodes", "1"]
    refused = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "pass --env planted_env:Planted-v0 to allow it" in refused.stderr
    assert not (tmp_path / "IMPORTED").exists()
    allowed = subprocess.run([*command, "--env", "planted_env:Planted-v0"], env=env, capture_output=True, text=True,
                             timeout=120)
    assert allowed.returncode == 0, allowed.stderr
    assert (tmp_path / "IMPORTED").exists()
