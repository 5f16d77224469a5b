"""SB3 A2C (or PPO) with rl-zoo's hyperparameters on one env until the mean of the last WINDOW
training episodes reaches TARGET; prints one JSON line. The reference for `make bench-classic`
and `make bench-minigrid`; run as its own process so each run starts cold, like the trainer's.

usage: a2c.py ENV SEED TARGET BUDGET_S LAUNCH_TIME JSON_SETTINGS
JSON_SETTINGS: {"n_envs": 8, "normalize": false, "threads": 1, "kwargs": {...keyword arguments},
                "algo": "A2C" or "PPO", "env_wrapper": "module.Class" (rl-zoo's env_wrapper, e.g.
                minigrid.wrappers.FlatObsWrapper; its module is imported first, which registers its envs)}
"""
import collections
import json
import sys
import time


def main():
    env_id, seed = sys.argv[1], int(sys.argv[2])
    target, budget_s, launched = float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
    settings = json.loads(sys.argv[6])
    window = int(settings.get("window", 20))
    import numpy as np
    import torch

    torch.set_num_threads(int(settings.get("threads", 1)))
    import importlib

    import stable_baselines3
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    class UntilTarget(BaseCallback):
        def __init__(self, start):
            super().__init__()
            self.start = start
            self.returns = collections.deque(maxlen=window)
            self.result = None

        def _on_step(self):
            for info in self.locals["infos"]:
                if "episode" in info:  # the Monitor wrapper's raw (unnormalized) episode return
                    self.returns.append(float(info["episode"]["r"]))
            now = time.time()
            if len(self.returns) == window and np.mean(self.returns) >= target:
                self.result = {"reached": True, "time_s": now - self.start, "wall_s": now - launched,
                               "steps": int(self.num_timesteps)}
                return False
            return now - self.start < budget_s

    wrapper = None
    if settings.get("env_wrapper"):
        module, _, name = settings["env_wrapper"].rpartition(".")
        wrapper = getattr(importlib.import_module(module), name)
    start = time.time()
    venv = make_vec_env(env_id, n_envs=int(settings["n_envs"]), seed=seed, wrapper_class=wrapper)
    if settings.get("normalize"):
        venv = VecNormalize(venv, gamma=settings.get("kwargs", {}).get("gamma", 0.99))
    algo = getattr(stable_baselines3, settings.get("algo", "A2C"))
    model = algo("MlpPolicy", venv, seed=seed, device="cpu", **settings.get("kwargs", {}))
    callback = UntilTarget(start)
    model.learn(total_timesteps=10**9, callback=callback)
    result = callback.result or {"reached": False, "time_s": time.time() - start, "wall_s": time.time() - launched,
                                  "steps": int(model.num_timesteps)}
    result["final_mean"] = float(np.mean(callback.returns)) if callback.returns else float("nan")
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
