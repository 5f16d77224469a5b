"""PufferLib 3.0.0's own Atari config (`pufferlib/config/atari.ini` with its `default.ini`: PPO
with an LSTM of 512, Muon at lr 0.015, frameskip 1, no sticky actions), run in this peer's virtual
environment by `make bench-peers`, on the tree build.py made.

`python train_puffer.py GAME EPISODES_CSV SEED [STICKY]`: GAME is its Atari env name (pong,
breakout, space_invaders). What this launcher changes, and why (listed in the results too), is
CPU_CHANGES: its config trains on `cuda` and spreads 128 envs over 16 worker processes
(`num_workers (16) > hardware cores (2) is disallowed by default` here), and its batches of
8,192 steps took minutes an epoch on 2 cores, so 16 envs on 2 workers with the batch and the
minibatch cut in the same proportion (as many minibatches an epoch as published, the same
half-the-envs batches from its vector). Besides: the seed, and for the sticky-actions games its
env's `repeat_action_probability`.

PufferLib keeps no local log (its stdout is a dashboard redrawn in place), so each time it logs,
the returns of the whole games finished since (its `episode_return`, kept per game before it
averages them) are appended to EPISODES_CSV with its step count: `frames,episode_return`, one row
a game, or a row with no return when none finished. Its steps are frames (frameskip 1); the race
converts them to agent steps at frameskip 4.
"""
import csv
import glob
import sys
from pathlib import Path

TREE = Path(sys.prefix) / "src" / "pufferlib-3.0.0"
sys.path.insert(0, str(TREE))

import pufferlib.pufferl as pufferl  # noqa: E402  (the tree build.py made)

# Published: 128 envs, 16 workers, vector batches of 64 envs; train batch 8,192, minibatch 2,048.
CPU_CHANGES = {"train.device": "cpu", "vec.num-envs": 16, "vec.num-workers": 2, "vec.batch-size": 8,
               "train.batch-size": 1024, "train.minibatch-size": 256}


def atari_config(game: str, seed: int, sticky: float) -> dict:
    """Its config for GAME from atari.ini: `load_config` takes the first .ini whose env_name lists
    the game, in glob order, and Ocean's own pong.ini lists pong too."""
    atari_ini = str(TREE / "pufferlib" / "config" / "atari.ini")
    overrides = {**CPU_CHANGES, "train.seed": seed, "vec.seed": seed}
    if sticky:
        overrides["env.repeat-action-probability"] = sticky
    sys.argv = [sys.argv[0], *(f"--{key}={value}" for key, value in overrides.items())]
    original_glob = glob.glob
    glob.glob = lambda pattern, recursive=False: [atari_ini] if pattern.endswith(".ini") else original_glob(
        pattern, recursive=recursive)
    try:
        args = pufferl.load_config(game)
    finally:
        glob.glob = original_glob
    if args["package"] != "atari":
        raise SystemExit(f"{game}: PufferLib's config is not its Atari one ({args['package']})")
    return args


class GameLog:
    """Writes each finished game's return, taken from the trainer's stats just before it averages them."""

    def __init__(self, path: str):
        self.file = open(path, "a", newline="")
        self.writer = csv.writer(self.file)
        if self.file.tell() == 0:
            self.writer.writerow(["frames", "episode_return"])

    def wrap(self, mean_and_log):
        def logged(trainer):
            returns = list(trainer.stats.get("episode_return", []))
            for value in returns or [""]:
                self.writer.writerow([int(trainer.global_step), value])
            self.file.flush()
            return mean_and_log(trainer)
        return logged


def main(game: str, episodes_csv: str, seed: str, sticky: str = "0") -> None:
    args = atari_config(game, int(seed), float(sticky))
    log = GameLog(episodes_csv)
    pufferl.PuffeRL.mean_and_log = log.wrap(pufferl.PuffeRL.mean_and_log)
    pufferl.train(game, args=args)


if __name__ == "__main__":
    main(*sys.argv[1:])
