"""The plot command, the notebook (executed headless) and the evaluation CLI on a tiny real run."""
import json
import os

import nbformat
import pytest
from nbclient import NotebookClient

from hogwild_a3c import evaluate, plot, train
from tests.conftest import REPO


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
    from hogwild_a3c.logs import load_run

    groups = plot.group_by_config([load_run(r) for r in tiny_runs])
    assert sorted(len(g) for g in groups.values()) == [1, 2]


def test_labels_draw_each_run_on_its_own(tiny_runs, tmp_path, capsys):
    from hogwild_a3c.logs import load_run

    runs = [load_run(r) for r in tiny_runs]
    groups = plot.labelled_groups(runs, ["before", "after", "other"])
    assert {k: [r["name"] for r in g] for k, g in groups.items()} == {"before": ["s1"], "after": ["s2"], "other": ["other"]}
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
    assert all(not cell.get("outputs") for cell in notebook.cells if cell.cell_type == "code"), "commit it without outputs"
    os.environ["HOGWILD_RUNS"] = ":".join(map(str, tiny_runs))
    try:
        NotebookClient(notebook, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(REPO)}}).execute()
    finally:
        del os.environ["HOGWILD_RUNS"]
    text = json.dumps(notebook)
    assert "3 runs" in text and "image/png" in text


def test_evaluate_cli_plays_and_records(tiny_runs, tmp_path, capsys):
    record = tmp_path / "videos"
    assert evaluate.main([str(tiny_runs[0]), "--episodes", "2", "--greedy", "--record", str(record)]) == 0
    out = capsys.readouterr().out
    assert "episode 2: return" in out and "mean return over 2 episodes" in out
    gifs = sorted(record.glob("*.gif"))
    assert [g.name for g in gifs] == ["episode-1.gif", "episode-2.gif"]
    assert gifs[0].read_bytes()[:6] in (b"GIF89a", b"GIF87a")


def test_evaluate_cli_bad_input(tmp_path, capsys):
    assert evaluate.main([str(tmp_path / "missing")]) == 2
    assert "no such checkpoint file or run directory" in capsys.readouterr().err
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"junk")
    assert evaluate.main([str(bad)]) == 2
    assert "bad.pt: not a readable checkpoint" in capsys.readouterr().err
