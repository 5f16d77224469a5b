"""One A3C worker: act in its environments and hand each rollout to its learner, which updates the
shared model.

The hot loop, per rollout of T steps over K environments:

1. Pull: copy the shared weights into the local model in place (`copy_`, no state-dict build).
2. Collect (`Worker.collect() -> Rollout`): act under `torch.no_grad()`: one forward per step
   for all K environments at once (`ActorCritic.step`, run by the acting backend, which takes the
   pulled weights at the rollout's start, and keeps what the learner asked it to keep), one draw
   from the action distribution per step;
   observations, actions and their behaviour log-probabilities, rewards and values go into the
   preallocated arrays of one `Rollout`. No autograd graph is built while acting.
3. Learn (`learner.learn(rollout)`, learning/learner.py): targets, a replay with gradients, the
   push to the shared model; count the steps in this worker's own slot.

With `--normalize-obs` / `--normalize-reward` (the `vector` preset), the model carries running
statistics as buffers (`model.RunningMoments`). Acting and replay use the local copy pulled at
the rollout's start, so both see the same normalization; after acting, the worker folds the
rollout's observations and discounted returns into the shared statistics. Rewards are divided
by the running std of the discounted return (as SB3's VecNormalize does), so the value targets
have a scale near 1 whatever the env's reward scale; episode returns are logged unscaled.

A rollout may cross an episode end: that environment's column is cut there (its own bootstrap)
and its LSTM state zeroed for the next step, in acting and in replay alike. With `--life-loss`
a lost Atari life cuts the column too (bootstrap 0), but the LSTM state and the game go on.
`--clip-reward` clips the rollout's rewards once it is collected, after the episode returns
took the raw ones. The per-step Python work is the env step and a few array writes; everything
else happens once per rollout.
"""
from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch

from ..acting.actor import make_actor
from ..config import Config
from ..envs.make import EnvInfo, env_options, make_env
from ..learning.algo import running_returns
from ..learning.learner import make_learner
from ..learning.model import model_for_env
from ..learning.rollout import Rollout
from .shared import WorkerLink


class EnvFailure(RuntimeError):
    """Too many consecutive exceptions from one worker's environments."""


class Worker:
    def __init__(self, rank: int, cfg: Config, env_info: EnvInfo, link: WorkerLink, seed: int):
        self.rank = rank
        self.cfg = cfg
        self.link = link
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.num_envs = cfg.envs_per_worker
        self.model = model_for_env(env_info, cfg)
        self.distribution = self.model.distribution
        self.learner = make_learner(self.model, link, cfg, self.rng, env_info.unit_interval)
        # Acts with what the model held at its last refresh, and keeps what the learner can reuse.
        self.actor = make_actor(cfg.act_backend, self.model, keep_activations=self.learner.reads_activations)
        self.envs: list[gym.Env] = [None] * self.num_envs  # type: ignore[list-item]
        self.obs = np.zeros((self.num_envs, *env_info.obs_shape), dtype=np.float32)
        self.episode_return = np.zeros(self.num_envs)
        self.discounted_return = np.zeros(self.num_envs)  # per env, for --normalize-reward
        self.episode_length = np.zeros(self.num_envs, dtype=np.int64)
        self.env_errors_in_a_row = 0
        self.state = self.model.initial_state(self.num_envs)
        self.rollout = Rollout.empty(cfg.rollout_steps, self.num_envs, env_info.obs_shape, self.state,
                                     self.distribution, activation_shapes=self.actor.activation_shapes,
                                     activations_nhwc=self.actor.activations_nhwc)
        for k in range(self.num_envs):
            self._start_env(k)

    # -- environments -------------------------------------------------------------------------

    def _start_env(self, k: int) -> None:
        """(Re)create env k if needed, reset it and its LSTM state."""
        if self.envs[k] is None:
            self.envs[k] = make_env(self.cfg.env, self.cfg.env_kwargs, **env_options(self.cfg))
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
            broken, self.envs[k] = self.envs[k], None  # type: ignore[call-overload]  # None: to be recreated
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
        """Pull, collect one rollout, hand it to the learner; returns agent steps taken (0 if dropped).

        Steps of a rollout whose update is skipped (non-finite loss) still count: the
        environments were stepped."""
        self.link.pull(self.model)
        rollout = self.collect()
        if rollout is None:
            return 0
        self.learner.learn(rollout)
        self.link.add_steps(rollout.steps)
        return rollout.steps

    def collect(self) -> Rollout | None:
        """Act for one rollout with the local model; None when an env raised (the rollout is
        dropped and that env recreated). With --normalize-obs/--normalize-reward the rollout is
        folded into the shared running statistics, and its rewards come back scaled."""
        rollout = self.rollout
        self.actor.refresh()  # the weights just pulled: Hogwild acts with them for the whole rollout
        # Cloned, not referenced: acting overwrites self.state in place at episode ends.
        rollout.start_state = (self.state[0].clone(), self.state[1].clone())
        rollout.dones[:] = False
        rollout.resets[:] = False
        rollout.next_resets[:] = False
        try:
            self._act(rollout)
        except _EnvStepError as err:
            self._recover_env(err.env_index, err.cause)
            return None
        self.env_errors_in_a_row = 0
        if self.cfg.clip_reward:  # after the episode returns took the raw rewards
            np.clip(rollout.rewards, -1.0, 1.0, out=rollout.rewards)
        self._update_statistics(rollout)
        return rollout

    @torch.no_grad()
    def _act(self, rollout: Rollout) -> None:
        act, envs, life_loss = self.actor.step, self.envs, self.cfg.life_loss
        sample, env_action = self.distribution.sample, self.distribution.env_action
        for t in range(self.cfg.rollout_steps):
            rollout.store_obs(t, self.obs)
            action_params, value, self.state = act(torch.from_numpy(self.obs), self.state,
                                                   [kept[t] for kept in rollout.activations])
            actions, rollout.log_probs[t] = sample(action_params, self.rng)
            rollout.actions[t] = actions
            rollout.values[t] = value.numpy()
            for k, env in enumerate(envs):
                try:
                    obs, reward, terminated, truncated, info = env.step(env_action(actions[k]))
                except Exception as exc:  # noqa: BLE001 - any env failure is recoverable here
                    raise _EnvStepError(k, exc) from exc
                rollout.rewards[t, k] = reward
                self.episode_return[k] += reward
                self.episode_length[k] += 1
                if terminated or truncated:
                    # a life lost as a time limit cuts the game: with --life-loss, no bootstrap either
                    self._end_episode(rollout, t, k, obs, terminated or (life_loss and info.get("life_lost", False)))
                    continue
                if life_loss and info.get("life_lost"):
                    # The end of a stretch for the targets only: the game, the LSTM state and
                    # the episode's return go on.
                    rollout.dones[t, k] = True
                    rollout.done_values[t, k] = 0.0
                self.obs[k] = obs
        _, last_values, _ = act(torch.from_numpy(self.obs), self.state)
        rollout.last_values[:] = last_values.numpy()
        rollout.next_obs[:] = self.obs

    def _end_episode(self, rollout: Rollout, t: int, k: int, final_obs: np.ndarray, terminated: bool) -> None:
        rollout.dones[t, k] = True
        if terminated:
            rollout.done_values[t, k] = 0.0
        else:
            # A time-limit cut is not the end of the task: bootstrap from the state reached.
            state_k = (self.state[0][:, k : k + 1], self.state[1][:, k : k + 1])
            _, value, _ = self.actor.step(torch.from_numpy(final_obs[None]), state_k)
            rollout.done_values[t, k] = float(value[0])
        self.link.report_episode(self.episode_return[k], int(self.episode_length[k]))
        try:
            self._start_env(k)
        except Exception as exc:  # noqa: BLE001
            raise _EnvStepError(k, exc) from exc
        if t + 1 < self.cfg.rollout_steps:
            rollout.resets[t + 1, k] = True
        else:
            rollout.next_resets[k] = True

    def _update_statistics(self, rollout: Rollout) -> None:
        """Fold this rollout into the shared running statistics and scale its rewards with the
        local (pulled) ones. Nothing to do for universe's model, which has none."""
        local = self.model
        if local.obs_norm is None and local.return_norm is None:
            return
        returns = None
        if local.return_norm is not None:
            returns, self.discounted_return = running_returns(rollout.rewards, rollout.dones, self.discounted_return,
                                                              self.cfg.gamma)
        self.link.merge_statistics(rollout.observations().numpy() if local.obs_norm is not None else None, returns)
        if local.return_norm is not None:
            rollout.rewards *= local.return_norm.scale()
            np.clip(rollout.rewards, -local.return_norm.clip, local.return_norm.clip, out=rollout.rewards)

    def close(self) -> None:
        for env in self.envs:
            if env is not None:
                env.close()


class _EnvStepError(Exception):
    def __init__(self, env_index: int, cause: BaseException):
        super().__init__(str(cause))
        self.env_index = env_index
        self.cause = cause


def worker_seed(base_seed: int, rank: int, session: int, node_rank: int = 0) -> int:
    """Distinct seeds per worker, and fresh ones after each resume (a resumed Hogwild run cannot
    replay its past randomness anyway). Every node of a multi-node run numbers its workers from 0
    and starts from the same broadcast weights: without the node's rank its workers would play the
    same games as every other node's, and the sum of their updates would count one experience
    twice. Node 0's seeds are a single machine's."""
    return base_seed * 10_007 + rank * 101 + session * 1_000_003 + node_rank * 2_147_483_647 + 1


def run_worker(rank: int, cfg: Config, env_info: EnvInfo, link: WorkerLink, seed: int) -> None:
    """A worker's whole life, in whatever process it runs."""
    worker = Worker(rank, cfg, env_info, link, seed)
    link.heartbeat()  # ready: imports and env creation are over, the stall clock starts now
    try:
        while not link.should_stop():
            worker.run_rollout()
    finally:
        worker.close()


def worker_main(rank: int, cfg: Config, env_info: EnvInfo, links: Any, seed: int, parent_pid: int) -> None:
    """Entry point of a worker process; `links` builds its link (see `shared.HogwildLinkFactory`)."""
    from .process import run_child

    def body() -> None:
        # make_env registers the ALE ids when the env needs them (spawned children do not inherit them).
        run_worker(rank, cfg, env_info, links.worker_link(rank), seed)

    run_child("worker", rank, parent_pid, body, links.report)
