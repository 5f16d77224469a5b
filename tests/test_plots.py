"""The plot command, the notebook (executed headless) and the evaluation CLI on a tiny real run."""
import json
import os
import re
import sys

import nbformat
import numpy as np
import pytest
from nbclient import NotebookClient

from hogwild_a3c import evaluate, plot, train
from tests.helpers import REPO


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory):
    """Two seeds of one config and one other config, each a short serial CartPole run."""
    base = tmp_path_factory.mktemp("runs")
    runs = []
    for name, extra in [("s1", ["--seed", "1"]), ("s2", ["--seed", "2"]), ("other", ["--seed", "1", "--lr", "3e-3"])]:
        run_dir = base / name
        assert train.main([
            "--env", "CartPole-v1", "--num-workers", "0", "--lstm-size", "16", "--max-steps", "3000",
            "--eval-interval", "0.3", "--eval-episodes", "2", "--progress-interval", "0.2", "--no-progress",
            "--run-dir", str(run_dir), *extra,
        ]) == 0
        runs.append(run_dir)
    return runs


def test_plot_command_writes_a_png(tiny_runs, tmp_path):
    out = tmp_path / "curves.png"
    assert plot.main([*map(str, tiny_runs), "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def test_seeds_of_one_config_are_grouped(tiny_runs):
    from hogwild_a3c.files.logs import load_run

    groups = plot.group_by_config([load_run(r) for r in tiny_runs])
    assert sorted(len(g) for g in groups.values()) == [1, 2]


def test_a_run_saved_before_a_setting_existed_groups_with_its_seeds_saved_after(tiny_runs):
    from hogwild_a3c.files.logs import load_run

    runs = [load_run(r) for r in tiny_runs]
    for newer in ("epochs", "ratio_clip", "frame_stack"):  # settings added after the first runs were saved
        del runs[0]["config"][newer]
    groups = plot.group_by_config(runs)
    assert sorted(len(g) for g in groups.values()) == [1, 2]
    assert plot.as_trained(runs[0]["config"])["epochs"] == 1


def test_labels_draw_each_run_on_its_own(tiny_runs, tmp_path, capsys):
    from hogwild_a3c.files.logs import load_run

    runs = [load_run(r) for r in tiny_runs]
    groups = plot.labelled_groups(runs, ["before", "after", "other"])
    named = {k: [r["name"] for r in g] for k, g in groups.items()}
    assert named == {"before": ["s1"], "after": ["s2"], "other": ["other"]}
    out = tmp_path / "labelled.png"
    assert plot.main([*map(str, tiny_runs), "--out", str(out), "--labels", "before", "after", "other"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot.main([*map(str, tiny_runs), "--out", str(out), "--labels", "a", "b"]) == 2
    assert "--labels: 2 names for 3 run directories" in capsys.readouterr().err
    assert plot.main([*map(str, tiny_runs), "--out", str(out), "--labels", "a", "a", "b"]) == 2
    assert "one distinct name per RUN_DIR" in capsys.readouterr().err


def test_plot_rejects_a_folder_that_is_not_a_run(tmp_path, capsys):
    assert plot.main([str(tmp_path), "--out", str(tmp_path / "x.png")]) == 2
    assert "not a run directory" in capsys.readouterr().err


def test_notebook_runs_headless_on_real_runs(tiny_runs, tmp_path):
    notebook = nbformat.read(REPO / "experiments" / "plot_logs.ipynb", as_version=4)
    code_cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert all(not cell.get("outputs") for cell in code_cells), "commit it without outputs"
    os.environ["HOGWILD_RUNS"] = ":".join(map(str, tiny_runs))
    try:
        NotebookClient(notebook, timeout=120, kernel_name="python3",
                       resources={"metadata": {"path": str(REPO)}}).execute()
    finally:
        del os.environ["HOGWILD_RUNS"]
    text = json.dumps(notebook)
    assert "3 runs" in text and "image/png" in text


def decoded_frames(path):
    """Every frame of a video file, decoded again (mp4 through ffmpeg, gif through pillow)."""
    import imageio.v2 as imageio

    reader = imageio.get_reader(path, format="FFMPEG") if path.suffix == ".mp4" else imageio.get_reader(path)
    try:
        return [frame for frame in reader]
    finally:
        reader.close()


def episode_lengths(out: str) -> list[int]:
    return [int(m) for m in re.findall(r"length (\d+)", out)]


def test_evaluate_cli_plays_and_records_mp4(tiny_runs, tmp_path, capsys):
    record = tmp_path / "videos"
    assert evaluate.main([str(tiny_runs[0]), "--episodes", "2", "--greedy", "--record", str(record)]) == 0
    out = capsys.readouterr().out
    assert "episode 2: return" in out and "mean return over 2 episodes" in out
    videos = sorted(record.iterdir())
    assert [v.name for v in videos] == ["episode-1.mp4", "episode-2.mp4"]  # and no temp file left
    assert videos[0].read_bytes()[4:8] == b"ftyp"  # an MP4 container
    for video, length in zip(videos, episode_lengths(out)):
        frames = decoded_frames(video)
        assert len(frames) == length + 1  # the first observation, then one per step
        assert frames[0].shape == (400, 600, 3) and frames[0].std() > 0  # CartPole's picture, not blank


def test_evaluate_cli_records_gif_on_request_and_one_episode_is_singular(tiny_runs, tmp_path, capsys):
    record = tmp_path / "videos"
    assert evaluate.main([str(tiny_runs[0]), "--episodes", "1", "--greedy", "--record", str(record),
                          "--video-format", "gif"]) == 0
    out = capsys.readouterr().out
    assert "mean return over 1 episode:" in out
    gif = record / "episode-1.gif"
    assert [p.name for p in record.iterdir()] == [gif.name]
    assert gif.read_bytes()[:6] in (b"GIF89a", b"GIF87a")
    # Frames identical to the one before (a still cart) are merged into a longer delay.
    from PIL import Image, ImageSequence

    with Image.open(gif) as image:
        total_ms = sum(frame.info["duration"] for frame in ImageSequence.Iterator(image))
    assert total_ms == (episode_lengths(out)[0] + 1) * evaluate.gif_frame_ms(30)


def test_odd_sized_frames_become_an_mp4_with_every_frame(tmp_path):
    frames = [np.full((41, 33, 3), 20 * i, dtype=np.uint8) for i in range(7)]
    evaluate.write_video(tmp_path / "odd.mp4", frames, fps=10)
    decoded = decoded_frames(tmp_path / "odd.mp4")
    assert len(decoded) == 7 and decoded[0].shape == (42, 34, 3)
    assert abs(int(decoded[3].mean()) - 60) <= 3


def test_mp4_without_imageio_ffmpeg_is_one_line_that_offers_gif(tiny_runs, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)  # as if not installed
    assert evaluate.main([str(tiny_runs[0]), "--episodes", "1", "--record", str(tmp_path / "v")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs imageio-ffmpeg" in err[0] and "--video-format gif" in err[0]
    assert evaluate.video_writer_problem("gif") is None
    assert not (tmp_path / "v").exists()


def test_evaluate_cli_bad_input(tmp_path, capsys):
    assert evaluate.main([str(tmp_path / "missing")]) == 2
    assert "no such checkpoint file or run directory" in capsys.readouterr().err
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"junk")
    assert evaluate.main([str(bad)]) == 2
    assert "bad.pt: not a readable checkpoint" in capsys.readouterr().err
