"""Faults injected for real: raising and NaN envs, killed workers, signals, kill -9 of the main
process, stalls, resume, corrupt checkpoints. Timeouts bound everything; nothing asserts speed."""
import json
import os
import signal

import pandas as pd
import pytest
import torch

from hogwild_a3c import train
from hogwild_a3c.children.supervisor import InProcessChildren
from hogwild_a3c.files.checkpoint import CheckpointError, load_checkpoint, load_latest, save_checkpoint
from tests.helpers import CARTPOLE, alive, finish, last_progress, last_session, start_training, wait_for

# -- environments that raise or return NaN ---------------------------------------------------

def test_env_that_raises_is_recreated_and_counted(tmp_path):
    run_dir = tmp_path / "run"
    code = train.main([
        "--env", "tests.envs:Faulty-v0", "--env-kwargs", "fault='raise'", "fail_at=7", "max_failures=2",
        "--num-workers", "1", "--max-steps", "400", "--eval-episodes", "0", "--lstm-size", "8",
        "--no-progress", "--run-dir", str(run_dir),
    ])
    assert code == 0
    assert last_progress(run_dir)["env_errors"] == 2


def test_env_that_keeps_raising_stops_the_run_with_its_error(tmp_path):
    run_dir = tmp_path / "run"
    code = train.main([
        "--env", "tests.envs:Faulty-v0", "--env-kwargs", "fault='raise'", "fail_at=1", "--max-env-errors", "3",
        "--num-workers", "1", "--max-steps", "400", "--eval-episodes", "0", "--lstm-size", "8",
        "--no-progress", "--run-dir", str(run_dir),
    ])
    assert code == 1
    errors = (run_dir / "errors.log").read_text()
    assert "worker 0 raised EnvFailure" in errors and "4 times in a row" in errors
    assert "injected env failure" in errors and "Traceback" in errors
    assert last_session(run_dir)["ended"].startswith("failed: worker 0")
    load_checkpoint(run_dir / "checkpoints" / "latest.pt")


def test_nan_loss_skips_the_update_and_keeps_weights_finite(tmp_path):
    run_dir = tmp_path / "run"
    code = train.main([
        "--env", "tests.envs:Faulty-v0", "--env-kwargs", "fault='nan'", "fail_at=3",
        "--num-workers", "0", "--max-steps", "300", "--eval-episodes", "0", "--lstm-size", "8",
        "--no-progress", "--run-dir", str(run_dir),
    ])
    assert code == 0
    assert last_progress(run_dir)["skipped_updates"] >= 1
    model = load_checkpoint(run_dir / "checkpoints" / "latest.pt")["model"]
    assert all(torch.isfinite(t).all() for t in model.values())


def test_non_finite_shared_weights_stop_the_run(tmp_path, monkeypatch):
    """A NaN that slipped into the shared weights (here: put there by hand) ends the run."""
    original = InProcessChildren.start

    def poison_then_start(self, best_return):
        with torch.no_grad():
            next(self.shared.model.parameters()).view(-1)[0] = float("nan")
        original(self, best_return)

    monkeypatch.setattr(InProcessChildren, "start", poison_then_start)
    run_dir = tmp_path / "run"
    code = train.main([*CARTPOLE, "--num-workers", "0", "--max-steps", "100000", "--eval-episodes", "0",
                       "--run-dir", str(run_dir)])
    assert code == 1
    errors = (run_dir / "errors.log").read_text()
    assert "shared weights became non-finite" in errors
    assert "not saving a checkpoint of non-finite weights" in errors
    assert not any((run_dir / "checkpoints").glob("*.pt"))  # nothing that --resume could pick up


# -- dead and stalled workers ----------------------------------------------------------------

@pytest.mark.timeout(150)
def test_worker_killed_by_sigkill_stops_the_run_cleanly(tmp_path):
    run_dir = tmp_path / "run"
    proc, workers = start_training(run_dir, "--num-workers", "2", "--eval-episodes", "0", "--max-seconds", "120")
    assert len(workers) == 2
    os.kill(workers[0], signal.SIGKILL)
    code, out = finish(proc)
    assert code == 1, out
    assert "was killed by signal 9" in (run_dir / "errors.log").read_text()
    load_checkpoint(run_dir / "checkpoints" / "latest.pt")
    assert not any(alive(pid) for pid in workers)


@pytest.mark.timeout(150)
def test_killed_worker_is_restarted_when_allowed(tmp_path):
    run_dir = tmp_path / "run"
    proc, workers = start_training(run_dir, "--num-workers", "2", "--eval-episodes", "0",
                                   "--max-worker-restarts", "1", "--max-steps", "30000")
    os.kill(workers[1], signal.SIGKILL)
    code, out = finish(proc, timeout=120)
    assert code == 0, out
    assert "restarting it (1/1)" in out
    assert last_progress(run_dir)["worker_restarts"] == 1
    assert last_progress(run_dir)["global_step"] >= 30000


@pytest.mark.timeout(120)
def test_stalled_worker_is_reported(tmp_path):
    run_dir = tmp_path / "run"
    code = train.main([
        "--env", "tests.envs:Faulty-v0", "--env-kwargs", "fault='hang'", "fail_at=50", "hang_s=25",
        "--num-workers", "1", "--max-seconds", "12", "--stall-timeout", "3", "--eval-episodes", "0",
        "--lstm-size", "8", "--no-progress", "--run-dir", str(run_dir),
    ])
    assert code == 0
    assert "worker 0 stalled" in (run_dir / "errors.log").read_text()


# -- signals ---------------------------------------------------------------------------------

@pytest.mark.timeout(150)
@pytest.mark.parametrize("signum,expected_code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_stops_the_run_saves_and_leaves_no_process(tmp_path, signum, expected_code):
    run_dir = tmp_path / "run"
    proc, children = start_training(run_dir, "--num-workers", "2", "--eval-interval", "1", "--eval-episodes", "1")
    assert len(children) == 3  # two workers and the evaluator
    proc.send_signal(signum)
    code, out = finish(proc, timeout=30)
    assert code == expected_code, out
    payload = load_checkpoint(run_dir / "checkpoints" / "latest.pt")
    assert payload["global_step"] > 0
    session = last_session(run_dir)
    assert session["ended"] == f"interrupted ({signal.Signals(signum).name})"
    assert session["exit_code"] == expected_code
    wait_for(lambda: not any(alive(pid) for pid in children), timeout=10, what="children to exit")


@pytest.mark.timeout(150)
def test_kill_9_of_the_main_process_takes_the_children_down(tmp_path):
    run_dir = tmp_path / "run"
    proc, children = start_training(run_dir, "--num-workers", "2", "--eval-episodes", "1", "--eval-interval", "1")
    assert len(children) == 3
    proc.kill()
    proc.wait(timeout=10)
    wait_for(lambda: not any(alive(pid) for pid in children), timeout=15, what="orphaned children to exit")


# -- resume ----------------------------------------------------------------------------------

@pytest.mark.timeout(200)
def test_resume_after_interruption_continues_steps_and_appends_logs(tmp_path, run_cli):
    run_dir = tmp_path / "run"
    proc, _ = start_training(run_dir, "--num-workers", "2", "--eval-episodes", "0", "--max-steps", "10000000",
                             min_step=2000)
    proc.send_signal(signal.SIGINT)
    code, out = finish(proc, timeout=30)
    assert code == 130, out
    stopped_at = load_checkpoint(run_dir / "checkpoints" / "latest.pt")
    episodes_before = len(pd.read_csv(run_dir / "episodes.csv"))
    progress_before = pd.read_csv(run_dir / "progress.csv")

    target = stopped_at["global_step"] + 4000
    resumed = run_cli("--resume", run_dir, "--max-steps", target, "--no-progress", timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert f"at global step {stopped_at['global_step']}" in resumed.stderr
    after = load_checkpoint(run_dir / "checkpoints" / "latest.pt")
    assert after["global_step"] >= target and after["session"] == 1
    assert after["elapsed_s"] > stopped_at["elapsed_s"]
    # Optimizer statistics continued rather than restarting from zero.
    assert torch.all(after["optimizer"]["states"][0]["step"] > stopped_at["optimizer"]["states"][0]["step"])
    episodes = pd.read_csv(run_dir / "episodes.csv")  # one header: rows were appended
    progress = pd.read_csv(run_dir / "progress.csv")
    assert len(episodes) > episodes_before
    new_rows = progress.iloc[len(progress_before):]
    assert new_rows["global_step"].min() >= stopped_at["global_step"]
    assert new_rows["time_s"].min() >= progress_before["time_s"].max()
    meta = json.loads((run_dir / "meta.json").read_text())
    assert [s["ended"] for s in meta["sessions"]] == ["interrupted (SIGINT)", "max_steps"]


def _finished_serial_run(tmp_path, steps=200):
    run_dir = tmp_path / "run"
    assert train.main([*CARTPOLE, "--num-workers", "0", "--max-steps", str(steps), "--eval-episodes", "0",
                       "--run-dir", str(run_dir)]) == 0
    return run_dir


def test_resume_refuses_a_flag_that_changes_the_algorithm(tmp_path, capsys):
    run_dir = _finished_serial_run(tmp_path)
    config_before = (run_dir / "config.json").read_text()
    capsys.readouterr()
    assert train.main(["--resume", str(run_dir), "--lr", "0.5", "--max-steps", "400"]) == 2
    err = capsys.readouterr().err
    assert "--lr 0.5 would change the algorithm" in err
    assert (run_dir / "config.json").read_text() == config_before
    # Same value, or a raised budget, is fine.
    assert train.main(["--resume", str(run_dir), "--lr", "0.0001", "--max-steps", "400", "--no-progress"]) == 0


def test_resume_with_a_budget_already_reached_ends_at_once(tmp_path):
    run_dir = _finished_serial_run(tmp_path)
    assert train.main(["--resume", str(run_dir), "--no-progress"]) == 0
    assert last_session(run_dir)["ended"] == "max_steps"


def test_resume_refuses_to_append_to_a_csv_with_another_schema(tmp_path, capsys):
    run_dir = _finished_serial_run(tmp_path)
    (run_dir / "progress.csv").write_text("step,loss\n1,2\n")
    meta_before = (run_dir / "meta.json").read_text()
    capsys.readouterr()
    assert train.main(["--resume", str(run_dir), "--max-steps", "400", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "progress.csv: its header step,loss is not this version's" in err[-1]
    assert (run_dir / "progress.csv").read_text() == "step,loss\n1,2\n"
    assert (run_dir / "meta.json").read_text() == meta_before


# -- checkpoints -----------------------------------------------------------------------------

def test_corrupt_latest_falls_back_to_an_older_checkpoint(tmp_path):
    folder = tmp_path / "checkpoints"
    for step in (10, 20):
        save_checkpoint(folder, {"global_step": step, "w": torch.ones(3) * step}, step, keep=3)
    (folder / "latest.pt").unlink()  # break the link so the newest numbered file stays intact
    (folder / "latest.pt").write_bytes(b"\x00garbage")
    warnings = []
    payload, path = load_latest(folder, warn=warnings.append)
    assert payload["global_step"] == 20 and path.name == "ckpt-000000000020.pt"
    assert "latest.pt" in warnings[0] and "not a readable checkpoint" in warnings[0]


def test_truncated_and_foreign_checkpoints_give_a_clear_error(tmp_path):
    folder = tmp_path / "checkpoints"
    good = save_checkpoint(folder, {"global_step": 5}, 5)
    data = good.read_bytes()
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated.pt: not a readable checkpoint"):
        load_checkpoint(truncated)
    foreign = tmp_path / "foreign.pt"
    torch.save({"state_dict": {}}, foreign)
    with pytest.raises(CheckpointError, match="foreign.pt: not a hogwild_a3c checkpoint"):
        load_checkpoint(foreign)


def test_resume_from_a_corrupt_run_names_the_file(tmp_path, capsys):
    run_dir = _finished_serial_run(tmp_path)
    for path in (run_dir / "checkpoints").glob("*.pt"):
        path.write_bytes(b"not a checkpoint")
    capsys.readouterr()
    assert train.main(["--resume", str(run_dir), "--max-steps", "400"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "latest.pt: not a readable checkpoint" in err[0]


def test_checkpoint_rotation_keeps_the_last_few_and_ignores_temp_files(tmp_path):
    folder = tmp_path / "checkpoints"
    for step in range(1, 6):
        save_checkpoint(folder, {"global_step": step}, step, keep=2)
    (folder / ".ckpt-000000000099.pt.123.tmp").write_bytes(b"partial")
    names = sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))
    assert names == ["ckpt-000000000004.pt", "ckpt-000000000005.pt", "latest.pt"]
    payload, _ = load_latest(folder)
    assert payload["global_step"] == 5


# -- resources -------------------------------------------------------------------------------

def test_no_growth_of_shm_or_descriptors_across_runs(tmp_path):
    def snapshot():
        # Only this process's own segments (torch names them torch_<pid>_...): another job on the
        # machine may make and drop its own at any time.
        ours = [name for name in (os.listdir("/dev/shm") if os.path.isdir("/dev/shm") else [])
                if name.startswith(f"torch_{os.getpid()}_")]
        return len(os.listdir("/proc/self/fd")), len(ours)

    argv = [*CARTPOLE, "--num-workers", "1", "--max-steps", "400", "--eval-episodes", "1", "--eval-interval", "1"]
    assert train.main([*argv, "--run-dir", str(tmp_path / "warmup")]) == 0
    before = snapshot()
    for i in range(3):
        assert train.main([*argv, "--run-dir", str(tmp_path / f"r{i}")]) == 0
    after = snapshot()
    assert after[0] <= before[0] + 2, (before, after)
    assert after[1] <= before[1], (before, after)
