"""SB3 PPO, A2C or SAC with rl-zoo's hyperparameters on one env for BUDGET_S seconds of wall time,
then the final policy played for EVAL_EPISODES deterministic episodes on a fresh env; prints one
JSON line. The reference of `make bench-continuous` (experiments/bench_continuous.py); run as its
own process so each run starts cold, like the trainer's.

usage: continuous.py ALGO ENV SEED BUDGET_S JSON_SETTINGS [EVAL_EPISODES EVAL_SEED]
ALGO: PPO, A2C or SAC. EVAL_EPISODES: 10 unless given; EVAL_SEED: 10000 + SEED unless given.
JSON_SETTINGS (an entry of experiments/configs/continuous.json):
    {"n_envs": 4, "normalize": true, "threads": 1, "kwargs": {...the algorithm's keyword arguments}}
    In "kwargs", a string "lin_X" (rl-zoo's linear schedule, e.g. "lin_7e-4" for learning_rate or
    clip_range) decays linearly from X to 0 over the wall-time budget: rl-zoo decays it over its
    own step budget, and here the run's length is a time. "policy_kwargs" is JSON: "activation_fn"
    names a torch.nn activation in lower case ("relu", "tanh", ...), "net_arch" a list or a dict
    {"pi": [...], "vf": [...]} (or {"pi": [...], "qf": [...]} for SAC), as in rl-zoo's Python strings.

The clock starts just before the envs are built. Training stops when the budget is spent: between
env steps (the callback) and also inside an update (a hook before every optimizer step), so a
long PPO epoch or a burst of SAC gradient steps cannot run past it. Output keys: algo, time_s
(training time), steps (env steps, all envs), train_last20 (mean raw return of the last 20 training
episodes, from the Monitor wrapper), train_episodes, eval_mean, eval_std, eval_returns.
"""
import collections
import json
import sys
import time

WINDOW = 20  # training episodes in train_last20
ACTIVATIONS = {"relu": "ReLU", "tanh": "Tanh", "elu": "ELU", "leaky_relu": "LeakyReLU", "gelu": "GELU",
               "silu": "SiLU"}


class BudgetSpent(Exception):
    """Raised before an optimizer step once the wall-time budget is spent."""


class TimeLinear:
    """rl-zoo's `lin_X` under a wall-time budget: X times the fraction of the budget still left
    (SB3 passes its step-based progress, which a time budget does not have; it is ignored)."""

    def __init__(self, initial: float, clock: dict):
        self.initial = initial
        self.clock = clock

    def __call__(self, _progress_remaining: float) -> float:
        start, budget = self.clock["start"], self.clock["budget_s"]
        left = 1.0 if start is None else 1.0 - (time.time() - start) / budget
        return self.initial * min(1.0, max(0.0, left))


def translate_policy_kwargs(kwargs: dict) -> dict:
    import torch.nn as nn

    out = dict(kwargs)
    if "activation_fn" in out:
        name = out["activation_fn"]
        if name not in ACTIVATIONS:
            raise SystemExit(f"policy_kwargs: unknown activation_fn {name!r} (one of {', '.join(ACTIVATIONS)})")
        out["activation_fn"] = getattr(nn, ACTIVATIONS[name])
    return out


def translate_kwargs(kwargs: dict, clock: dict) -> dict:
    out = {}
    for key, value in kwargs.items():
        if isinstance(value, str) and value.startswith("lin_"):
            value = TimeLinear(float(value[len("lin_"):]), clock)
        elif key == "policy_kwargs":
            value = translate_policy_kwargs(value)
        out[key] = value
    return out


def main():
    algo_name, env_id, seed = sys.argv[1].upper(), sys.argv[2], int(sys.argv[3])
    budget_s = float(sys.argv[4])
    settings = json.loads(sys.argv[5])
    eval_episodes = int(sys.argv[6]) if len(sys.argv) > 6 else 10
    eval_seed = int(sys.argv[7]) if len(sys.argv) > 7 else 10_000 + seed
    import numpy as np
    import torch
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    torch.set_num_threads(int(settings.get("threads", 1)))
    import gymnasium as gym
    import stable_baselines3
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.vec_env import VecNormalize

    clock = {"start": None, "budget_s": budget_s}

    class UntilBudget(BaseCallback):
        def __init__(self):
            super().__init__()
            self.returns = collections.deque(maxlen=WINDOW)
            self.episodes = 0

        def _on_step(self):
            for info in self.locals["infos"]:
                if "episode" in info:  # the Monitor wrapper's raw (unnormalized) episode return
                    self.returns.append(float(info["episode"]["r"]))
                    self.episodes += 1
            return time.time() - clock["start"] < budget_s

    def out_of_time(_optimizer, _args, _kwargs):
        if time.time() - clock["start"] >= budget_s:
            raise BudgetSpent

    kwargs = translate_kwargs(settings.get("kwargs", {}), clock)
    algo = getattr(stable_baselines3, algo_name)
    action_space = gym.make(env_id).action_space
    if algo_name == "SAC" and not isinstance(action_space, gym.spaces.Box):
        raise SystemExit(f"SAC needs a Box action space; {env_id} has {action_space}")

    clock["start"] = start = time.time()
    venv = make_vec_env(env_id, n_envs=int(settings.get("n_envs", 1)), seed=seed)
    if settings.get("normalize"):
        # As rl-zoo: VecNormalize's defaults, with the algorithm's gamma where the settings give one.
        venv = VecNormalize(venv, gamma=settings.get("kwargs", {}).get("gamma", 0.99))
    model = algo("MlpPolicy", venv, seed=seed, device="cpu", **kwargs)
    callback = UntilBudget()
    hook = register_optimizer_step_pre_hook(out_of_time)
    stopped_in_update = False
    try:
        model.learn(total_timesteps=10**12, callback=callback)
    except BudgetSpent:
        stopped_in_update = True
    finally:
        hook.remove()
    time_s = time.time() - start

    # The final policy on a fresh env; VecNormalize's statistics frozen and raw rewards, as rl-zoo evaluates.
    eval_env = make_vec_env(env_id, n_envs=1, seed=eval_seed)
    if settings.get("normalize"):
        eval_env = VecNormalize(eval_env, training=False, norm_reward=False,
                                gamma=settings.get("kwargs", {}).get("gamma", 0.99))
        eval_env.obs_rms = model.get_vec_normalize_env().obs_rms.copy()
    returns, _lengths = evaluate_policy(model, eval_env, n_eval_episodes=eval_episodes, deterministic=True,
                                        return_episode_rewards=True)
    eval_env.close()
    venv.close()
    result = {
        "algo": algo_name, "time_s": time_s, "steps": int(model.num_timesteps),
        "train_last20": float(np.mean(callback.returns)) if callback.returns else float("nan"),
        "train_episodes": callback.episodes, "stopped_in_update": stopped_in_update,
        "eval_mean": float(np.mean(returns)), "eval_std": float(np.std(returns)),
        "eval_returns": [float(r) for r in returns],
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
