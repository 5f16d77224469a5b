"""The run's own files failing, injected for real: a disk that fills mid-run, a run directory
made read-only or deleted mid-run, temp files left by saves killed with `kill -9`, a session
killed with `kill -9` that meta.json still calls running, and crafted or damaged checkpoints.
Timeouts bound everything; nothing asserts speed."""
import errno
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from hogwild_a3c import evaluate, train
from hogwild_a3c.files.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from tests.helpers import (
    REPO,
    finish,
    last_session,
    mount_tmpfs,
    one_error_line,
    serial_run,
    start_run,
    training_started,
    wait_for,
)

ROOT = os.geteuid() == 0
KILLED = "killed or crashed (no clean end recorded)"  # meta.json's words, a contract


def trainer(*args, prefix=()):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([*prefix, sys.executable, "-m", "hogwild_a3c.train", *map(str, args)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def resume_in_background(run_dir, *args, prefix=()):
    """A resumed run of a finished serial run: one worker and an evaluator every second."""
    return trainer("--resume", run_dir, "--num-workers", 1, "--eval-interval", 1, "--eval-episodes", 1,
                   "--max-steps", 10**9, "--max-seconds", 120, "--no-progress", *args, prefix=prefix)


def assert_one_line_failure(out, expected):
    assert "Traceback" not in out and "Error:" not in out, out
    ended = [line for line in out.splitlines() if line.startswith("run ended: ")]
    assert len(ended) == 1 and ended[0].startswith(f"run ended: failed: {expected}"), out


# -- a disk that fills up, a folder that turns read-only -----------------------------------------

@pytest.fixture
def tiny_disk(tmp_path):
    yield from mount_tmpfs(tmp_path / "disk", "2m", "cannot mount a 2 MB tmpfs here (mount needs root, as on CI)")


def fill_up(folder):
    fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)


@pytest.mark.timeout(240)
def test_a_disk_that_fills_mid_run_is_one_line_and_meta_json_records_it(tiny_disk):
    run_dir = serial_run(tiny_disk / "run")
    latest = (run_dir / "checkpoints" / "latest.pt").read_bytes()
    steps_before = load_checkpoint(run_dir / "checkpoints" / "latest.pt")["global_step"]
    proc = resume_in_background(run_dir, "--checkpoint-interval", 1000)
    wait_for(training_started(run_dir, steps_before + 1), what="training", proc=proc)
    fill_up(tiny_disk)  # the next CSV row, log line or best.pt finds no room
    code, out = finish(proc)
    assert code == 1, out
    assert_one_line_failure(out, "no space left on device while writing")
    assert (run_dir / "checkpoints" / "latest.pt").read_bytes() == latest
    session = last_session(run_dir)  # written in the room the run held back for it
    assert session["ended"].startswith("failed: no space left on device while writing ") and session["exit_code"] == 1


@pytest.mark.timeout(240)
def test_a_run_directory_made_read_only_mid_run_is_one_line(tmp_path):
    prefix = ()
    if ROOT:  # root writes through any mode: drop the capabilities that let it
        if shutil.which("setpriv") is None:
            pytest.skip("needs setpriv (util-linux) to run the trainer as root without CAP_DAC_OVERRIDE")
        prefix = ("setpriv", "--bounding-set=-dac_override,-dac_read_search", "--")
    run_dir = serial_run(tmp_path / "run")
    steps_before = load_checkpoint(run_dir / "checkpoints" / "latest.pt")["global_step"]
    proc = resume_in_background(run_dir, "--checkpoint-interval", 3, prefix=prefix)
    wait_for(training_started(run_dir, steps_before + 1), what="training", proc=proc)
    try:
        for folder in (run_dir, run_dir / "checkpoints"):
            folder.chmod(0o555)
        latest = (run_dir / "checkpoints" / "latest.pt").read_bytes()
        code, out = finish(proc)
    finally:
        for folder in (run_dir, run_dir / "checkpoints"):
            folder.chmod(0o755)
    assert code == 1, out
    assert_one_line_failure(out, "cannot write ")
    assert "Permission denied" in out
    assert (run_dir / "checkpoints" / "latest.pt").read_bytes() == latest
    session = last_session(run_dir)  # no new file can be made there: meta.json was rewritten in place
    assert session["ended"].startswith("failed: cannot write ") and session["exit_code"] == 1


# -- a run directory deleted mid-run ---------------------------------------------------------------

@pytest.mark.timeout(180)
def test_a_run_directory_deleted_mid_run_stops_the_run_and_is_not_recreated(tmp_path):
    run_dir = tmp_path / "run"
    proc = start_run(run_dir, "--num-workers", "1", "--eval-interval", "1", "--eval-episodes", "1",
                     "--checkpoint-interval", "1", "--max-seconds", "40")
    wait_for(training_started(run_dir), what="training", proc=proc)
    for _ in range(20):  # rm races the run's own writes until the run notices
        subprocess.run(["rm", "-rf", str(run_dir)], capture_output=True)
        if not run_dir.exists():
            break
    code, out = finish(proc)
    assert code == 1, out
    assert_one_line_failure(out, f"the run directory {run_dir} was deleted or moved away during the run")
    assert not run_dir.exists()


# -- temp files of saves killed mid-write ----------------------------------------------------------

# A real save (`atomic_save`) whose bytes never finish: the writer is killed, or kept alive, there.
STUCK_WRITER = """
import sys, time
from hogwild_a3c.files import checkpoint

def stuck(payload, f):
    f.write(b"partial")
    f.flush()
    time.sleep(600)

checkpoint.torch.save = stuck
checkpoint.atomic_save({"w": 1}, sys.argv[1])
"""


@pytest.mark.timeout(180)
def test_resume_removes_temp_files_of_killed_saves_and_leaves_a_live_writers(tmp_path):
    run_dir = serial_run(tmp_path / "run")
    folder = run_dir / "checkpoints"
    targets = [folder / "ckpt-000000000300.pt", folder / "ckpt-000000000400.pt", folder / "best.pt",
               folder / "ckpt-000000000500.pt"]
    writers = [subprocess.Popen([sys.executable, "-c", STUCK_WRITER, str(target)], cwd=REPO) for target in targets]
    try:
        temps = [folder / f".{target.name}.{writer.pid}.tmp" for target, writer in zip(targets, writers)]
        wait_for(lambda: all(t.exists() and t.stat().st_size > 0 for t in temps), timeout=60, what="the writers")
        for writer in writers[:-1]:
            writer.send_signal(signal.SIGKILL)
            writer.wait(timeout=10)
        assert train.main(["--resume", str(run_dir), "--max-steps", "1", "--no-progress"]) == 0
        assert [t.exists() for t in temps] == [False, False, False, True]  # the last writer is alive
        assert "removed 3 temp file(s) of saves cut short by a kill" in (run_dir / "train.log").read_text()
    finally:
        for writer in writers:
            writer.kill()
            writer.wait(timeout=10)


# -- a killed session in meta.json -----------------------------------------------------------------

def complete_rows(path):
    lines = path.read_text().split("\n")[:-1]  # a row cut by the kill has no newline
    return [dict(zip(lines[0].split(","), line.split(","))) for line in lines[1:]]


@pytest.mark.timeout(180)
def test_resume_records_a_killed_session_as_ended_with_its_last_known_step(tmp_path):
    run_dir = tmp_path / "run"
    proc = start_run(run_dir, "--num-workers", "0", "--eval-episodes", "0", "--checkpoint-interval", "0.5",
                     "--max-seconds", "120")
    wait_for(lambda: (run_dir / "checkpoints" / "latest.pt").exists() and training_started(run_dir)(),
             what="a checkpoint", proc=proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stdout.close()
    assert last_session(run_dir)["ended"] == "running"
    checkpoint_step = load_checkpoint(run_dir / "checkpoints" / "latest.pt")["global_step"]
    progress_step = int(float(complete_rows(run_dir / "progress.csv")[-1]["global_step"]))
    assert train.main(["--resume", str(run_dir), "--max-steps", "1", "--no-progress"]) == 0
    killed, resumed = json.loads((run_dir / "meta.json").read_text())["sessions"]
    assert killed["ended"] == KILLED and killed["exit_code"] is None
    assert killed["global_step_end"] == max(checkpoint_step, progress_step)
    if progress_step > checkpoint_step:
        assert killed["global_step_end_from"] == "progress.csv's last row"
    else:
        assert killed["global_step_end_from"].startswith("the newest checkpoint")
    assert resumed["ended"] == "max_steps" and resumed["global_step_start"] == checkpoint_step


# -- crafted or damaged checkpoints --------------------------------------------------------------

@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    return serial_run(tmp_path_factory.mktemp("finished") / "run")


def with_optimizer(change):
    def craft(payload):
        change(payload["optimizer"])
        return payload
    return craft


def first_state(change):
    return with_optimizer(lambda optimizer: change(optimizer["states"][0]))


CRAFTED = {
    "optimizer of the wrong shape": (
        first_state(lambda state: state["exp_avg"].__setitem__(0, torch.zeros(3, 3))), "exp_avg[0] is (3, 3)"),
    "another optimizer's statistics": (
        with_optimizer(lambda optimizer: optimizer.update(kind="rmsprop")), "its optimizer is rmsprop, whose"),
    "empty optimizer list": (with_optimizer(lambda optimizer: optimizer.update(states=[])), "no optimizer statistics"),
    "NaN Adam moments": (
        first_state(lambda state: state["exp_avg_sq"][0].fill_(float("nan"))), "exp_avg_sq[0] is"),
    "counter of the wrong type": (lambda p: {**p, "counters": {**p["counters"], "updates": "12"}}, "counter 'updates'"),
    "negative counter": (lambda p: {**p, "counters": {**p["counters"], "env_errors": -1}}, "counter 'env_errors'"),
    "negative step": (lambda p: {**p, "global_step": -5}, "global_step is -5"),
    "step of the wrong type": (lambda p: {**p, "global_step": 5.5}, "global_step is 5.5"),
    "step beyond int64": (lambda p: {**p, "global_step": 2**63}, f"global_step is {2**63}, not an integer"),
    "a bool for a step": (lambda p: {**p, "global_step": True}, "global_step is True"),
    "NaN elapsed time": (lambda p: {**p, "elapsed_s": math.nan}, "elapsed_s is nan"),
    "NaN best return": (lambda p: {**p, "best_eval_return": math.nan}, "best_eval_return is nan"),
    "NaN weights": (lambda p: {**p, "model": {k: v.clone().fill_(math.nan) if v.is_floating_point() else v
                                              for k, v in p["model"].items()}}, "holds NaN or inf"),
}


@pytest.mark.parametrize("damage", list(CRAFTED))
def test_resume_from_a_crafted_checkpoint_is_one_line_naming_it(tmp_path, capsys, finished_run, damage):
    run_dir = Path(shutil.copytree(finished_run, tmp_path / "run"))
    craft, expected = CRAFTED[damage]
    payload = craft(load_checkpoint(run_dir / "checkpoints" / "latest.pt"))
    for path in (run_dir / "checkpoints").glob("*.pt"):
        path.unlink()
    save_checkpoint(run_dir / "checkpoints", payload, 200)
    capsys.readouterr()
    assert train.main(["--resume", str(run_dir), "--max-steps", "400", "--no-progress"]) == 2
    line = one_error_line(capsys)
    assert "latest.pt: " in line and expected in line, line


def test_evaluate_refuses_nan_weights_in_one_line(tmp_path, capsys, finished_run):
    payload = load_checkpoint(finished_run / "checkpoints" / "latest.pt")
    payload["model"] = {k: v.clone().fill_(math.inf) if v.is_floating_point() else v
                        for k, v in payload["model"].items()}
    save_checkpoint(tmp_path / "nan", payload, 1)
    capsys.readouterr()
    assert evaluate.main([str(tmp_path / "nan" / "latest.pt"), "--episodes", "1"]) == 2
    assert "latest.pt: its model's" in one_error_line(capsys)


def test_a_checkpoint_that_would_inflate_is_refused_before_loading(tmp_path):
    """torch stores archive members uncompressed; one rewritten with compressed zeros declares
    far more than its own size, and is refused from its directory before anything is unpacked."""
    plain = tmp_path / "plain.pt"
    save_checkpoint(tmp_path, {"global_step": 1, "w": torch.zeros(8 << 20)}, 1)  # 32 MB of zeros
    shutil.copy(tmp_path / "latest.pt", plain)
    bomb = tmp_path / "bomb.pt"
    with zipfile.ZipFile(plain) as src, zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as dst:
        for member in src.infolist():
            dst.writestr(member.filename, src.read(member))
    assert bomb.stat().st_size < 1 << 20
    refused = r"bomb\.pt: refused: its archive declares 33,5\d\d,\d\d\d bytes unpacked"
    with pytest.raises(CheckpointError, match=refused):
        load_checkpoint(bomb)
    assert load_checkpoint(plain)["global_step"] == 1  # what torch.save wrote passes


def test_a_negative_step_is_never_saved(tmp_path):
    with pytest.raises(ValueError, match="step must be an integer >= 0"):
        save_checkpoint(tmp_path, {"global_step": -5}, -5)
    assert not list(tmp_path.iterdir())
