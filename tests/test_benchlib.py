"""The benchmarks' shared writer: a second result of the same day goes to a file of its own, so an
earlier one (a race that took an hour) is never overwritten."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
import benchlib  # noqa: E402 - experiments/ is a folder of scripts, not a package


def test_a_second_result_the_same_day_never_overwrites_the_first(tmp_path, monkeypatch):
    monkeypatch.setattr(benchlib, "RESULTS", tmp_path)
    written = [benchlib.write_dated_result("peers", "pong", f"race {n}\n") for n in (1, 2, 3)]
    assert [path.read_text() for path in written] == ["race 1\n", "race 2\n", "race 3\n"]
    assert written[0].name.endswith("-pong.md")
    assert [path.name[len(written[0].stem):] for path in written[1:]] == ["-2.md", "-3.md"]
    assert len(list((tmp_path / "peers").iterdir())) == 3


def test_an_arm_whose_seeds_ran_apart_is_compared_as_one(tmp_path, monkeypatch):
    import pandas as pd

    import compare_atari

    monkeypatch.setattr(benchlib, "RESULTS", tmp_path)
    (tmp_path / "atari").mkdir()

    def table(name, rows):
        frame = pd.DataFrame([{"game": game, "agent": "hogwild_a3c", "seed": seed, "steps": 1000, "steps_per_s": 10.0,
                               "train_mean_100": score} for game, seed, score in rows])
        frame.to_csv(tmp_path / "atari" / f"{name}.csv", index=False)

    table("base", [("Qbert", 0, 100.0), ("Qbert", 1, 300.0)])
    table("lever", [("Qbert", 0, 500.0)])
    table("lever-s1", [("Qbert", 1, 700.0)])
    rows, summary = compare_atari.compare(["base", "lever+lever-s1"], benchlib.load_config("atari"))
    assert rows == [{"game": "Qbert", "base": "200.0 (100 / 300)", "lever": "600.0 (500 / 700)",
                     "lever / base": "3.00"}]
    assert [arm["seeds_per_game"] for arm in summary] == ["2", "2"]


def test_a_single_trainer_flag_is_taken_as_the_value_of_extra_flags():
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--extra-flags", default="")
    parser.add_argument("--steps", type=int)
    for argv, expected in [(["--extra-flags", "--normalize-advantages", "--steps", "5"], "--normalize-advantages"),
                           (["--extra-flags", "--epochs 2"], "--epochs 2"),
                           (["--extra-flags=--no-clip-reward"], "--no-clip-reward")]:
        assert parser.parse_args(benchlib.glue_flag_values(argv)).extra_flags == expected
    assert parser.parse_args(benchlib.glue_flag_values(["--extra-flags", "--normalize-advantages",
                                                        "--steps", "5"])).steps == 5
