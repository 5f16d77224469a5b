"""SB3 PPO with rl-zoo's Atari settings on one ALE v5 game for a fixed wall time; writes every
training episode's raw return to a CSV and prints one JSON line. The reference of
`make bench-atari`; a process of its own, so each run starts cold like the trainer's.

rl-zoo's `ppo.yml` atari entry: AtariWrapper (30 no-op starts, max over the last two of 4
repeated frames, a lost life as the end of an episode for learning, FIRE at reset, 84x84 grey,
rewards clipped to their sign), 4 stacked frames, CnnPolicy, 8 envs, n_steps 128, 4 epochs,
batch 256, learning rate 2.5e-4 and clip range 0.1 both decayed linearly over 10M steps, vf 0.5,
entropy 0.01. The game is the same `ALE/<Game>-v5` our trainer plays, made with frameskip 1 so
that the wrapper repeats the action, and ALE's own sticky actions (0.25 per frame) left on, as
they are for our trainer. The Monitor sits under the wrapper, so the returns are whole games,
unclipped.

usage: ppo_atari.py ENV_ID SEED BUDGET_S EPISODES_CSV
"""
import csv
import json
import os
import sys
import time


def main():
    env_id, seed, budget_s, out = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    import ale_py
    import gymnasium as gym
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack

    gym.register_envs(ale_py)
    zoo_steps = 10_000_000  # rl-zoo's n_timesteps: the schedules decay over it, as in the zoo

    def linear(start):
        return lambda remaining: remaining * start

    class ForTheBudget(BaseCallback):
        def __init__(self, start, writer):
            super().__init__()
            self.start, self.writer, self.episodes = start, writer, 0

        def _on_step(self):
            now = time.time() - self.start
            for info in self.locals["infos"]:
                if "episode" in info:
                    self.writer.writerow([f"{now:.3f}", self.num_timesteps, info["episode"]["r"], info["episode"]["l"]])
                    self.episodes += 1
            return now < budget_s

    with open(out, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["time_s", "global_step", "episode_return", "episode_length"])
        start = time.time()
        venv = VecFrameStack(make_atari_env(env_id, n_envs=8, seed=seed, env_kwargs={"frameskip": 1}), n_stack=4)
        model = PPO("CnnPolicy", venv, n_steps=128, n_epochs=4, batch_size=256, learning_rate=linear(2.5e-4),
                    clip_range=linear(0.1), vf_coef=0.5, ent_coef=0.01, seed=seed, device="cpu", verbose=0)
        callback = ForTheBudget(start, writer)
        model.learn(total_timesteps=zoo_steps, callback=callback)
        elapsed = time.time() - start
    print(json.dumps({"time_s": elapsed, "steps": int(model.num_timesteps), "episodes": callback.episodes}), flush=True)


if __name__ == "__main__":
    main()
