"""The peers race reads each trainer's progress from the files it writes while it runs: a reading
taken mid-write must neither crash the race nor count a game twice or half."""
import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
import bench_peers  # noqa: E402 - experiments/ is a folder of scripts, not a package


def test_pufferlib_games_are_read_whole_and_its_frames_become_agent_steps(tmp_path):
    games = tmp_path / "pufferlib-pong-s0.csv"
    returns = [float(-21 + n) for n in range(25)]
    lines = ["frames,episode_return", "4096,"]  # a log with no finished game keeps the step count moving
    lines += [f"{8192 + 1024 * n},{value}" for n, value in enumerate(returns)]
    games.write_text("\n".join(lines) + "\n" + "40000,-1")  # the launcher is mid-way through its next row

    mean, steps = bench_peers.pufferlib_reading(games, window=20)

    assert mean == statistics.mean(returns[-20:])
    assert steps == (8192 + 1024 * 24) // bench_peers.PUFFER_FRAMESKIP


def test_pufferlib_has_no_mean_before_a_whole_window_of_games(tmp_path):
    games = tmp_path / "games.csv"
    assert bench_peers.pufferlib_reading(games, window=20) == (None, 0)  # not written yet
    games.write_text("frames,episode_return\n" + "".join(f"{1000 * n},-21.0\n" for n in range(1, 20)))
    assert bench_peers.pufferlib_reading(games, window=20) == (None, 19000 // 4)


def test_rl_games_mean_counts_only_once_its_window_is_full(tmp_path):
    log = tmp_path / "rl-games.log"
    log.write_text("epoch 1\nRACE mean=-20.5 games=12 steps=8192\nfps 300\nRACE mean=-19.25 games=20 steps=16384\n")
    assert bench_peers.rl_games_reading(log, window=20) == (-19.25, 16384)
    assert bench_peers.rl_games_reading(log, window=100) == (None, 16384)


def test_the_result_file_names_a_race_of_our_flags_as_a_command_that_runs_again(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["bench_peers.py", "--part", "atari-30min", "--ours-flags",
                                      "--image-size 84 --core mlp"])
    assert bench_peers.make_command() == ("make bench-peers ARGS='--part atari-30min --ours-flags "
                                          "\"--image-size 84 --core mlp\"'")


def test_flags_our_trainer_would_refuse_are_named_before_any_race_starts():
    assert bench_peers.ours_flags_problem("--image-size 84 --frame-stack 4 --core mlp --epochs 2") is None
    assert "--image-sise" in bench_peers.ours_flags_problem("--image-sise 84")
    assert "invalid float value: 'abc'" in bench_peers.ours_flags_problem("--lr abc")


def test_the_reuse_ablation_reads_the_first_epoch_past_each_milestone(tmp_path):
    log = tmp_path / "rl-games-pong-default-s0.log"
    log.write_text("RUN mini_epochs=1 minibatch_size=512\n"
                   "RACE mean=-20.5 games=20 steps=98304\nRACE mean=-19.0 games=20 steps=100352\n"
                   "RACE mean=-17.0 games=20 steps=102400\nRACE mean=1.5e+00 games=20 steps=204800\nRACE mean=-3")
    at = bench_peers.mean_at_milestones(log)
    assert at[100_000] == -19.0 and at[200_000] == 1.5  # the first past each, not the last
    assert at[300_000] is None  # never reached


def test_a_game_no_peer_has_a_config_for_is_refused_before_any_race_starts(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["bench_peers.py", "--part", "atari-30min", "--games", "qbert"])
    raced = []
    monkeypatch.setattr(bench_peers, "atari_30_min_part", lambda args: raced.append(args))
    with pytest.raises(SystemExit) as stop:
        bench_peers.main()
    assert stop.value.code == 2 and raced == []
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--games qbert" in error and "--peers alone" in error
