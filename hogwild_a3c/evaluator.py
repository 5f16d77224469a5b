"""The evaluator: every --eval-interval seconds, snapshot the shared model, play --eval-episodes
episodes, report them, and keep checkpoints/best.pt (written by `checkpoint.save_best`).

Between evaluations it sleeps in slices of `POLL_S`, checking the stop flag and beating its
heartbeat; during an evaluation it does both every 64 steps. It holds no training state, so the
supervisor restarts it when it dies.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .checkpoint import save_best
from .config import Config
from .envs import EnvInfo, env_options, make_env
from .files import WriteError
from .lstm_watch import LstmWatch
from .model import ActorCritic, State, build_model, sample_actions
from .shared import EvaluatorLink

POLL_S = 0.2
CHECK_EVERY_STEPS = 64


def evaluator_seed(base_seed: int, session: int) -> int:
    """Fresh per session, distinct from every worker's (see `worker.worker_seed`)."""
    return base_seed + 7 + 1000 * session


def play_episode(
    model: ActorCritic,
    env: Any,
    rng: np.random.Generator,
    greedy: bool = False,
    should_stop: Callable[[], bool] = lambda: False,
    on_frame: Callable[[], None] | None = None,
    seed: int | None = None,
    on_state: Callable[[State], None] | None = None,
) -> tuple[float, int] | None:
    """Play one episode with the model; None if `should_stop` (asked every 64 steps) said so.
    `on_state` sees every LSTM state the episode passes through (the evaluator's `LstmWatch`)."""
    obs, _ = env.reset(seed=seed)
    state = model.initial_state(1)
    total, length = 0.0, 0
    with torch.no_grad():
        while True:
            if on_frame is not None:
                on_frame()
            logits, _, state = model.step(torch.from_numpy(np.asarray(obs, dtype=np.float32)[None]), state)
            if on_state is not None:
                on_state(state)
            action = int(logits.argmax(dim=-1)[0]) if greedy else int(sample_actions(logits, rng)[0])
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            length += 1
            if terminated or truncated:
                if on_frame is not None:
                    on_frame()
                return total, length
            if length % CHECK_EVERY_STEPS == 0 and should_stop():
                return None


class Evaluator:
    def __init__(self, cfg: Config, env_info: EnvInfo, link: EvaluatorLink, run_dir: str | Path, best_return: float,
                 seed: int):
        self.cfg = cfg
        self.link = link
        self.model = build_model(env_info.obs_shape, env_info.num_actions, cfg)
        self.env = make_env(cfg.env, cfg.env_kwargs, **env_options(cfg))
        self.rng = np.random.default_rng(seed)
        self.env.reset(seed=seed)  # seeds the env's generator once; later resets continue it
        self.run_dir = Path(run_dir)
        self.best_return = best_return
        self.write_failed = False

    def _alive_and_not_stopping(self) -> bool:
        self.link.heartbeat()
        return self.link.should_stop()

    def evaluate(self) -> bool:
        """Evaluate a snapshot of the shared model and report it; False if stopped part-way."""
        self.link.snapshot(self.model)
        global_step = self.link.global_step()
        episodes = []
        watch = LstmWatch() if self.model.lstm is not None else None
        for _ in range(self.cfg.eval_episodes):
            result = play_episode(self.model, self.env, self.rng, should_stop=self._alive_and_not_stopping,
                                  on_state=None if watch is None else watch.observe)
            if result is None:
                return False
            episodes.append(result)
            if watch is not None:
                watch.episode_ended()
        mean = float(np.mean([r for r, _ in episodes]))
        if mean > self.best_return and not self.write_failed:
            try:
                save_best(self.run_dir, self.model, global_step, mean, self.cfg)
                self.best_return = mean
            except WriteError as exc:
                # Not a crash to restart from: the main process stops the run on this line, as
                # for any file it cannot write. Once is enough; the evaluator goes on till then.
                self.write_failed = True
                self.link.report_write_failure(str(exc))
        self.link.report_evaluation(global_step, episodes, None if watch is None else watch.health())
        return True

    def close(self) -> None:
        self.env.close()


def run_evaluator(cfg: Config, env_info: EnvInfo, link: EvaluatorLink, run_dir: str, best_return: float,
                  seed: int) -> None:
    """The evaluator's whole life as a process of its own."""
    evaluator = Evaluator(cfg, env_info, link, Path(run_dir), best_return, seed)
    link.heartbeat()  # ready: the stall clock starts now
    next_eval = time.monotonic() + cfg.eval_interval
    try:
        while not link.should_stop():
            wait = next_eval - time.monotonic()
            if wait > 0:
                link.heartbeat()
                time.sleep(min(POLL_S, wait))
                continue
            evaluator.evaluate()
            next_eval = time.monotonic() + cfg.eval_interval
    finally:
        evaluator.close()


def evaluator_main(
    cfg: Config, env_info: EnvInfo, links: Any, run_dir: str, best_return: float, seed: int, parent_pid: int
) -> None:
    """Entry point of the evaluator process; `links` builds its link (`shared.HogwildLinkFactory`)."""
    from .process import run_child

    def body() -> None:
        if cfg.eval_nice > 0:
            # Busy cores then serve the workers first; what it plays is the same policy, only later.
            os.nice(cfg.eval_nice)
        # make_env registers the ALE ids when the env needs them, as in the worker.
        run_evaluator(cfg, env_info, links.evaluator_link(), run_dir, best_return, seed)

    run_child("evaluator", 0, parent_pid, body, links.report)
