"""One A3C worker: act in its environments, learn from each rollout, update the shared model.

The hot loop, per rollout of T steps over K environments:

1. Pull: copy the shared weights into the local model in place (`copy_`, no state-dict build).
2. Act under `torch.no_grad()`: one forward per step for all K environments at once, with the
   LSTM cell written out (`ActorCritic.step`); observations, actions, rewards and values go into
   preallocated numpy buffers. No autograd graph is built while acting.
3. Targets: returns and GAE per environment and per episode stretch (`algo.rollout_targets`),
   bootstrapping from V(s_T) mid-episode and at time-limit cuts, from 0 at a true terminal.
4. Replay with gradients: the conv encoder sees all T*K frames as one batch and `nn.LSTM` runs
   fused over the sequence from the LSTM state saved at the rollout's start; one backward.
5. Clip to the global norm, hand the gradients to the shared parameters, step this worker's
   optimizer, count the steps in this worker's own slot (no lock).

With `--normalize-obs` / `--normalize-reward` (the `vector` preset), the model carries running
statistics as buffers (`model.RunningMoments`). Acting and replay use the local copy pulled at
the rollout's start, so both see the same normalization; after acting, the worker folds the
rollout's observations and discounted returns into the shared statistics. Rewards are divided
by the running std of the discounted return (as SB3's VecNormalize does), so the value targets
have a scale near 1 whatever the env's reward scale; episode returns are logged unscaled.

A rollout may cross an episode end: that environment's column is cut there (its own bootstrap)
and its LSTM state zeroed for the next step, in acting and in replay alike. The per-step Python
work is the env step and a few array writes; everything else happens once per rollout.
"""
from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from .algo import a3c_loss, rollout_targets
from .config import Config
from .envs import EnvInfo, make_env
from .model import build_model
from .shared import HogwildLink


class EnvFailure(RuntimeError):
    """Too many consecutive exceptions from one worker's environments."""


def sample_actions(logits: torch.Tensor, rng: np.random.Generator) -> np.ndarray:
    """One categorical sample per row, by inverting the CDF with a uniform draw."""
    probs = torch.softmax(logits, dim=-1).numpy().astype(np.float64)
    cdf = np.cumsum(probs, axis=1)
    draws = rng.random((len(cdf), 1)) * cdf[:, -1:]
    return np.minimum((cdf < draws).sum(axis=1), cdf.shape[1] - 1)


class Worker:
    def __init__(self, rank: int, cfg: Config, env_info: EnvInfo, link: HogwildLink, seed: int):
        self.rank = rank
        self.cfg = cfg
        self.link = link
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.num_envs = cfg.envs_per_worker
        self.model = build_model(env_info.obs_shape, env_info.num_actions, cfg)
        self.optimizer = link.make_optimizer()
        # Walking the module tree for parameters() costs more than a small model's update step.
        self.params = list(self.model.parameters())
        self.envs: list[gym.Env] = [None] * self.num_envs  # type: ignore[list-item]
        steps, envs, shape = cfg.rollout_steps, self.num_envs, env_info.obs_shape
        self.obs = np.zeros((envs, *shape), dtype=np.float32)
        self.obs_buf = np.zeros((steps, envs, *shape), dtype=np.float32)
        self.actions = np.zeros((steps, envs), dtype=np.int64)
        self.rewards = np.zeros((steps, envs), dtype=np.float32)
        self.values = np.zeros((steps, envs), dtype=np.float32)
        self.dones = np.zeros((steps, envs), dtype=bool)
        self.done_values = np.zeros((steps, envs), dtype=np.float32)
        self.resets = np.zeros((steps, envs), dtype=bool)
        self.episode_return = np.zeros(envs)
        self.discounted_return = np.zeros(envs)  # per env, for --normalize-reward
        self.episode_length = np.zeros(envs, dtype=np.int64)
        self.env_errors_in_a_row = 0
        self.state = self.model.initial_state(envs)
        for k in range(envs):
            self._start_env(k)

    # -- environments -------------------------------------------------------------------------

    def _start_env(self, k: int) -> None:
        """(Re)create env k if needed, reset it and its LSTM state."""
        if self.envs[k] is None:
            self.envs[k] = make_env(self.cfg.env, self.cfg.env_kwargs)
            self.envs[k].action_space.seed(self.seed + k)
            obs, _ = self.envs[k].reset(seed=self.seed * 1000 + k)
        else:
            obs, _ = self.envs[k].reset()
        self.obs[k] = obs
        self.state[0][:, k] = 0.0
        self.state[1][:, k] = 0.0
        self.episode_return[k] = 0.0
        self.episode_length[k] = 0

    def _recover_env(self, k: int, exc: BaseException) -> None:
        """Replace env k after it raised; a replacement that fails to start counts as another error."""
        while True:
            self.env_errors_in_a_row += 1
            self.link.count("env_errors")
            if self.env_errors_in_a_row > self.cfg.max_env_errors:
                raise EnvFailure(
                    f"worker {self.rank}: environment raised {self.env_errors_in_a_row} times in a row; "
                    f"last: {type(exc).__name__}: {exc}"
                ) from exc
            broken, self.envs[k] = self.envs[k], None
            try:
                if broken is not None:
                    broken.close()
            except Exception:  # noqa: BLE001 - a broken env may fail to close too
                pass
            try:
                self._start_env(k)
                return
            except Exception as again:  # noqa: BLE001
                exc = again

    # -- one rollout and one update -----------------------------------------------------------

    def run_rollout(self) -> int:
        """Collect one rollout and apply one update; returns agent steps taken (0 if dropped)."""
        self.link.pull(self.model)
        start_state = (self.state[0].clone(), self.state[1].clone())
        self.dones[:] = False
        self.resets[:] = False
        try:
            last_values = self._act()
        except _EnvStepError as err:
            self._recover_env(err.env_index, err.cause)
            return 0
        self.env_errors_in_a_row = 0
        self._update_statistics()
        self._learn(start_state, last_values)
        steps = self.cfg.rollout_steps * self.num_envs
        self.link.add_steps(steps)
        return steps

    @torch.no_grad()
    def _act(self) -> np.ndarray:
        model, envs = self.model, self.envs
        for t in range(self.cfg.rollout_steps):
            self.obs_buf[t] = self.obs
            logits, value, self.state = model.step(torch.from_numpy(self.obs), self.state)
            actions = sample_actions(logits, self.rng)
            self.actions[t] = actions
            self.values[t] = value.numpy()
            for k, env in enumerate(envs):
                try:
                    obs, reward, terminated, truncated, _ = env.step(int(actions[k]))
                except Exception as exc:  # noqa: BLE001 - any env failure is recoverable here
                    raise _EnvStepError(k, exc) from exc
                self.rewards[t, k] = reward
                self.episode_return[k] += reward
                self.episode_length[k] += 1
                if terminated or truncated:
                    self._end_episode(t, k, obs, terminated)
                else:
                    self.obs[k] = obs
        _, last_values, _ = model.step(torch.from_numpy(self.obs), self.state)
        return last_values.numpy()

    def _end_episode(self, t: int, k: int, final_obs: np.ndarray, terminated: bool) -> None:
        self.dones[t, k] = True
        if terminated:
            self.done_values[t, k] = 0.0
        else:
            # A time-limit cut is not the end of the task: bootstrap from the state reached.
            state_k = (self.state[0][:, k : k + 1], self.state[1][:, k : k + 1])
            _, value, _ = self.model.step(torch.from_numpy(final_obs[None]), state_k)
            self.done_values[t, k] = float(value[0])
        self.link.report_episode(self.episode_return[k], int(self.episode_length[k]))
        try:
            self._start_env(k)
        except Exception as exc:  # noqa: BLE001
            raise _EnvStepError(k, exc) from exc
        if t + 1 < self.cfg.rollout_steps:
            self.resets[t + 1, k] = True

    def _update_statistics(self) -> None:
        """Fold this rollout into the shared running statistics and scale its rewards with the
        local (pulled) ones. Nothing to do for the seed's model, which has none."""
        local = self.model
        if local.obs_norm is None and local.return_norm is None:
            return
        shared_model = self.link.shared.model
        if local.obs_norm is not None:
            shared_model.obs_norm.merge_(self.obs_buf)
        if local.return_norm is not None:
            returns = np.empty_like(self.rewards, dtype=np.float64)
            running = self.discounted_return
            for t in range(self.cfg.rollout_steps):
                running = running * self.cfg.gamma + self.rewards[t]
                returns[t] = running
                running = np.where(self.dones[t] | ~np.isfinite(running), 0.0, running)
            self.discounted_return = running
            shared_model.return_norm.merge_(returns)
            self.rewards *= local.return_norm.scale()
            np.clip(self.rewards, -local.return_norm.clip, local.return_norm.clip, out=self.rewards)

    def _learn(self, start_state: Any, last_values: np.ndarray) -> None:
        cfg = self.cfg
        returns, advantages = rollout_targets(
            self.rewards, self.values, self.dones, self.done_values, last_values, cfg.gamma, cfg.gae_lambda
        )
        obs = torch.from_numpy(self.obs_buf)
        logits, values = self.model.replay(obs, start_state, torch.from_numpy(self.resets))
        loss = a3c_loss(
            logits.flatten(0, 1),
            values.flatten(),
            torch.from_numpy(self.actions).flatten(),
            torch.from_numpy(advantages).flatten(),
            torch.from_numpy(returns).flatten(),
            value_coef=cfg.value_coef,
            entropy_coef=cfg.entropy_coef,
            reduction=cfg.loss_reduction,
        )
        for p in self.params:
            p.grad = None
        loss.total.backward()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, cfg.max_grad_norm))
        if not (math.isfinite(grad_norm) and math.isfinite(loss.total.item())):
            # Applying it would poison the shared weights for every worker.
            self.link.count("skipped_updates")
            return
        self.link.push(self.model, self.optimizer)
        batch = returns.size if cfg.loss_reduction == "sum" else 1  # progress.csv shows per-sample losses
        self.link.report_update(
            loss.policy.item() / batch, loss.value.item() / batch, loss.entropy.item() / batch, grad_norm
        )

    def close(self) -> None:
        for env in self.envs:
            if env is not None:
                env.close()


class _EnvStepError(Exception):
    def __init__(self, env_index: int, cause: BaseException):
        super().__init__(str(cause))
        self.env_index = env_index
        self.cause = cause


def worker_seed(base_seed: int, rank: int, session: int) -> int:
    """Distinct seeds per worker, and fresh ones after each resume (a resumed Hogwild run cannot
    replay its past randomness anyway)."""
    return base_seed * 10_007 + rank * 101 + session * 1_000_003 + 1


def worker_main(rank: int, cfg: Config, env_info: EnvInfo, shared: Any, session: int, parent_pid: int) -> None:
    """Entry point of a worker process."""
    from .process import run_child

    def body() -> None:
        # make_env registers the ALE ids when the env needs them (spawned children do not inherit them).
        link = HogwildLink(shared, rank)
        link.heartbeat()
        worker = Worker(rank, cfg, env_info, link, worker_seed(cfg.seed, rank, session))
        try:
            while not link.should_stop():
                worker.run_rollout()
        finally:
            worker.close()

    run_child("worker", rank, shared.queue, parent_pid, body)
