"""The evaluator: every --eval-interval seconds, snapshot the shared model, play --eval-episodes
episodes, report them, and keep checkpoints/best.pt.

Between evaluations it blocks on the stop event with a timeout, so it costs nothing while idle
and stops as soon as the run does. During an evaluation it checks the stop event every step.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from .checkpoint import atomic_save, FORMAT
from .config import Config
from .envs import EnvInfo, make_env
from .model import ActorCritic, build_model
from .shared import copy_weights
from .worker import sample_actions


def play_episode(
    model: ActorCritic,
    env: Any,
    rng: np.random.Generator,
    greedy: bool = False,
    should_stop: Callable[[], bool] = lambda: False,
    on_frame: Callable[[], None] | None = None,
    seed: int | None = None,
) -> tuple[float, int] | None:
    """Play one episode with the model; None if stopped before the end."""
    obs, _ = env.reset(seed=seed)
    state = model.initial_state(1)
    total, length = 0.0, 0
    with torch.no_grad():
        while True:
            if on_frame is not None:
                on_frame()
            logits, _, state = model.step(torch.from_numpy(np.asarray(obs, dtype=np.float32)[None]), state)
            action = int(logits.argmax(dim=-1)[0]) if greedy else int(sample_actions(logits, rng)[0])
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            length += 1
            if terminated or truncated:
                if on_frame is not None:
                    on_frame()
                return total, length
            if length % 64 == 0 and should_stop():
                return None


class Evaluator:
    def __init__(self, cfg: Config, env_info: EnvInfo, shared_model: torch.nn.Module, run_dir: Path, best_return: float, seed: int):
        self.cfg = cfg
        self.shared_model = shared_model
        self.model = build_model(env_info.obs_shape, env_info.num_actions, cfg)
        self.env = make_env(cfg.env, cfg.env_kwargs)
        self.rng = np.random.default_rng(seed)
        self.env.reset(seed=seed)  # seeds the env's generator once; later resets continue it
        self.best_path = Path(run_dir) / "checkpoints" / "best.pt"
        self.best_return = best_return

    def evaluate(self, global_step: int, time_s: float, should_stop: Callable[[], bool]) -> dict | None:
        """One evaluation of a snapshot of the shared model; None if stopped part-way."""
        copy_weights(self.model, self.shared_model)
        episodes = []
        for _ in range(self.cfg.eval_episodes):
            result = play_episode(self.model, self.env, self.rng, should_stop=should_stop)
            if result is None:
                return None
            episodes.append(result)
        mean = float(np.mean([r for r, _ in episodes]))
        if mean > self.best_return:
            self.best_return = mean
            self._save_best(global_step, mean)
        return {"global_step": global_step, "time_s": time_s, "episodes": episodes, "mean_return": mean}

    def _save_best(self, global_step: int, mean: float) -> None:
        payload = {
            "format": FORMAT,
            "kind": "best",
            "model": {k: v.clone() for k, v in self.model.state_dict().items()},
            "global_step": global_step,
            "eval_mean_return": mean,
            "config": self.cfg.to_dict(),
        }
        atomic_save(payload, self.best_path)

    def close(self) -> None:
        self.env.close()


def evaluator_main(
    cfg: Config, env_info: EnvInfo, shared: Any, run_dir: str, best_return: float, clock_origin: float,
    session: int, parent_pid: int,
) -> None:
    """Entry point of the evaluator process."""
    from .process import run_child

    def body() -> None:
        from .envs import register_atari

        register_atari()
        evaluator = Evaluator(cfg, env_info, shared.model, Path(run_dir), best_return, cfg.seed + 7 + 1000 * session)
        stop = shared.stop_event
        try:
            while not stop.wait(timeout=cfg.eval_interval):
                result = evaluator.evaluate(shared.global_step(), time.time() - clock_origin, stop.is_set)
                if result is not None:
                    shared.queue.put(("eval", result))
        finally:
            evaluator.close()

    run_child("evaluator", 0, shared.queue, parent_pid, body)
