"""The evaluator: every --eval-interval seconds, snapshot the shared model, play --eval-episodes
episodes, report them, and keep checkpoints/best.pt (written by `checkpoint.save_best`).

The episodes are played side by side (`play_episodes`, up to `MAX_EVAL_ENVS` envs): one forward
a step for all of them, each with its own LSTM state, so an evaluation costs the cores less and
ends sooner than the same episodes played one after another; each is the policy's own episode.

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

from ..acting.actor import make_actor
from ..config import Config
from ..envs.make import EnvInfo, env_options, make_env
from ..files.atomic import WriteError
from ..files.checkpoint import save_best
from ..learning.distributions import choose
from ..learning.lstm_watch import LstmWatch
from ..learning.model import ActorCritic, State, model_for_env
from .shared import EvaluatorLink

POLL_S = 0.2
CHECK_EVERY_STEPS = 64
# Episodes of one evaluation played side by side, one forward a step for all of them: a batch of
# five costs far less than five forwards of one.
MAX_EVAL_ENVS = 8


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
            action_params, _, state = model.step(torch.from_numpy(np.asarray(obs, dtype=np.float32)[None]), state)
            if on_state is not None:
                on_state(state)
            action = choose(model.distribution, action_params, rng, greedy)[0]
            obs, reward, terminated, truncated, _ = env.step(model.distribution.env_action(action))
            total += float(reward)
            length += 1
            if terminated or truncated:
                if on_frame is not None:
                    on_frame()
                return total, length
            if length % CHECK_EVERY_STEPS == 0 and should_stop():
                return None


def play_episodes(
    model: ActorCritic,
    envs: list[Any],
    rng: np.random.Generator,
    episodes: int,
    should_stop: Callable[[], bool] = lambda: False,
    watch: LstmWatch | None = None,
    step: Callable[[torch.Tensor, State], tuple[torch.Tensor, torch.Tensor, State]] | None = None,
) -> list[tuple[float, int]] | None:
    """Play `episodes` episodes of the policy (sampled; a Gaussian's at its mean, the distribution's
    `evaluated_at_mode`) on `envs` side by side: each step is one
    forward for every env still playing, each with its own LSTM state, and an env that ends its
    episode starts another while fewer than `episodes` have started. Every episode started is
    played to its end, so short ones are not favoured. (return, length) in the order the episodes
    ended; None if `should_stop` (asked every 64 steps) said so. `step`: the acting backend's
    (`acting.Actor.step`), the model's own by default."""
    step = model.step if step is None else step
    count = len(envs)
    obs: list[np.ndarray] = [np.empty(0, dtype=np.float32)] * count
    totals, lengths = [0.0] * count, [0] * count
    h, c = model.initial_state(count)
    playing: list[int] = []
    results: list[tuple[float, int]] = []
    started = 0

    def start(k: int) -> None:
        nonlocal started
        obs[k] = np.asarray(envs[k].reset()[0], dtype=np.float32)
        totals[k], lengths[k] = 0.0, 0
        h[:, k].zero_()
        c[:, k].zero_()
        playing.append(k)
        started += 1

    for k in range(min(count, episodes)):
        start(k)
    steps = 0
    with torch.no_grad():
        while playing:
            rows = torch.tensor(playing)
            action_params, _, (h_rows, c_rows) = step(torch.from_numpy(np.stack([obs[k] for k in playing])),
                                               (h[:, rows], c[:, rows]))
            h[:, rows], c[:, rows] = h_rows, c_rows
            actions = choose(model.distribution, action_params, rng, model.distribution.evaluated_at_mode)
            ended = []
            for i, k in enumerate(playing):
                if watch is not None:
                    watch.observe((h_rows[:, i:i + 1], c_rows[:, i:i + 1]))
                observation, reward, terminated, truncated, _ = envs[k].step(model.distribution.env_action(actions[i]))
                totals[k] += float(reward)
                lengths[k] += 1
                obs[k] = np.asarray(observation, dtype=np.float32)
                if terminated or truncated:
                    ended.append(k)
                    results.append((totals[k], lengths[k]))
                    if watch is not None:
                        watch.episode_ended((h_rows[:, i:i + 1], c_rows[:, i:i + 1]))
            playing = [k for k in playing if k not in ended]
            for k in ended:
                if started < episodes:
                    start(k)
            steps += 1
            if steps % CHECK_EVERY_STEPS == 0 and should_stop():
                return None
    return results


class Evaluator:
    def __init__(self, cfg: Config, env_info: EnvInfo, link: EvaluatorLink, run_dir: str | Path, best_return: float,
                 seed: int):
        self.cfg = cfg
        self.link = link
        self.model = model_for_env(env_info, cfg)
        self.actor = make_actor(cfg.act_backend, self.model)
        self.envs = [make_env(cfg.env, cfg.env_kwargs, **env_options(cfg))
                     for _ in range(min(MAX_EVAL_ENVS, max(1, cfg.eval_episodes)))]
        self.rng = np.random.default_rng(seed)
        for k, env in enumerate(self.envs):
            env.reset(seed=seed + k)  # seeds each env's generator once; later resets continue it
        self.run_dir = Path(run_dir)
        self.best_return = best_return
        self.write_failed = False

    def _alive_and_not_stopping(self) -> bool:
        self.link.heartbeat()
        return self.link.should_stop()

    def evaluate(self) -> bool:
        """Evaluate a snapshot of the shared model and report it; False if stopped part-way."""
        self.link.snapshot(self.model)
        self.actor.refresh()
        global_step = self.link.global_step()
        watch = LstmWatch() if self.model.lstm is not None else None
        episodes = play_episodes(self.model, self.envs, self.rng, self.cfg.eval_episodes,
                                 should_stop=self._alive_and_not_stopping, watch=watch, step=self.actor.step)
        if episodes is None:
            return False
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
        for env in self.envs:
            env.close()


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
