"""rl_games 1.6.5's own EnvPool Atari configs (`rl_games/configs/atari/ppo_<game>_envpool.yaml`, as
shipped in its wheel: PPO, the Nature CNN on EnvPool's 84x84 x 4 frames), run in this peer's
virtual environment by `make bench-peers`.

`python train_rlg.py CONFIG TRAIN_DIR NAME SEED GAMES_TO_TRACK [STICKY [CHANGES]]`: CONFIG is the
file name in the package; CHANGES (`key=value,...`, values read as YAML) sets keys of its `config`
section after the CPU changes, for the ablations of `make bench-peers ARGS='--part reuse'`.
What this launcher changes, and why (listed in the results too), is CPU_CHANGES: the config
leaves the device to its default, `cuda:0`, and compiles the model with torch.compile (no epoch
finished in 90 s on 2 cores); its 64 (or 48) actors x 128 steps make one epoch 8,192 (6,144)
steps, minutes on 2 cores, so 16 actors with the minibatch cut in the same proportion
(as many minibatches an epoch as published). Besides: the seed (rl_games seeds nothing for
seed 0, so it is set here for torch, numpy and EnvPool), where it writes, the window of its
running mean (`games_to_track`, our race's 20 episodes for Pong), no epoch limit (the race stops
it) and, for the sticky-actions games, EnvPool's `repeat_action_probability`.

Each epoch prints one line `RACE mean=<mean of the last games_to_track whole games> games=<n>
steps=<agent steps>`: its observer's figure (EnvPool's unclipped per-game score, every life of a
game summed) as its summaries record it, on stdout at once (its writer flushes every 2 minutes).
rl_games' runner.py is not in the wheel; the Runner is called as runner.py does.
"""
import sys
from importlib.resources import files

import numpy as np
import torch
import yaml
from rl_games.common.algo_observer import DefaultAlgoObserver
from rl_games.torch_runner import Runner

CPU_CHANGES = {"device": "cpu", "device_name": "cpu", "torch_compile": False, "num_actors": 16}


class RacePrinter(DefaultAlgoObserver):
    def after_print_stats(self, frame, epoch_num, total_time):
        super().after_print_stats(frame, epoch_num, total_time)
        if self.game_scores.current_size > 0:
            mean = float(self.game_scores.get_mean().reshape(-1)[0])
            print(f"RACE mean={mean} games={int(self.game_scores.current_size)} steps={int(frame)}", flush=True)


def main(name_of_config: str, train_dir: str, name: str, seed: str, games_to_track: str, sticky: str = "0",
         changes: str = "") -> None:
    config = yaml.safe_load((files("rl_games") / "configs" / "atari" / name_of_config).read_text())
    params = config["params"]
    params["seed"] = int(seed)
    torch.manual_seed(int(seed))  # rl_games' own seeding is skipped for seed 0 (`if self.seed:`)
    np.random.seed(int(seed))
    run = params["config"]
    run["env_config"]["seed"] = int(seed)
    actors = run["num_actors"]
    run.update(CPU_CHANGES)
    run["minibatch_size"] = run["minibatch_size"] * CPU_CHANGES["num_actors"] // actors
    run.update(train_dir=train_dir, full_experiment_name=name, games_to_track=int(games_to_track),
               max_epochs=10**9)
    if float(sticky):
        run["env_config"]["repeat_action_probability"] = float(sticky)
    for change in filter(None, changes.split(",")):
        key, _, value = change.partition("=")
        if key not in run:
            raise SystemExit(f"train_rlg.py: {key!r} is not a key of {name_of_config}'s config: {sorted(run)}")
        run[key] = yaml.safe_load(value)
    print(f"RUN mini_epochs={run.get('mini_epochs')} minibatch_size={run['minibatch_size']} "
          f"horizon_length={run.get('horizon_length')} num_actors={run['num_actors']}", flush=True)
    runner = Runner(algo_observer=RacePrinter())
    runner.load(config)
    runner.run({"train": True, "play": False, "checkpoint": None, "sigma": None})


if __name__ == "__main__":
    main(*sys.argv[1:])
