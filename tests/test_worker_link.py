"""The backend seam and the learn step: a real Worker driven through an in-memory link that
records what it was given; gradients against a slow step-by-step reference; episodes ending at
different steps of one rollout; the exact truncation bootstrap."""
import numpy as np
import torch

import tests.envs  # noqa: F401
from hogwild_a3c.children.shared import copy_weights
from hogwild_a3c.children.worker import Worker
from hogwild_a3c.config import Config
from hogwild_a3c.envs.make import describe_env
from hogwild_a3c.learning.algo import a3c_loss, rollout_targets
from hogwild_a3c.learning.model import build_model


class RecordingLink:
    """A `WorkerLink` that keeps everything in this process and records every call."""

    def __init__(self, model):
        self.model = model
        self.pushed = []  # the gradients of each push, copied
        self.steps = 0
        self.episodes = []
        self.updates = []
        self.counts = []
        self.calls = []

    def pull(self, local_model):
        self.calls.append("pull")
        copy_weights(local_model, self.model)

    def push(self, local_model):
        self.calls.append("push")
        self.pushed.append([p.grad.clone() for p in local_model.parameters()])

    def add_steps(self, steps):
        self.steps += steps

    def global_step(self):
        return self.steps

    def record_update(self, *stats):
        self.updates.append(stats)

    def count(self, stat):
        self.counts.append(stat)

    def merge_statistics(self, obs, returns):
        self.calls.append("merge_statistics")

    def report_episode(self, episode_return, length):
        self.episodes.append((episode_return, length))

    def heartbeat(self):
        pass

    def should_stop(self):
        return False


def make(env="tests.envs:Counting-v0", envs=1, steps=5, **env_kwargs):
    cfg = Config(env=env, env_kwargs=env_kwargs, num_workers=1, envs_per_worker=envs, rollout_steps=steps, lstm_size=8)
    info = describe_env(cfg.env, cfg.env_kwargs)
    torch.manual_seed(0)
    link = RecordingLink(build_model(info.obs_shape, info.distribution, 8))
    return Worker(0, cfg, info, link, seed=3), link, cfg


def test_a_worker_runs_through_any_link_that_has_the_methods():
    worker, link, _ = make(length=7)
    for _ in range(4):
        assert worker.run_rollout() == 5
    assert link.calls == ["pull", "push"] * 4
    assert link.steps == 20 and len(link.updates) == 4
    assert link.episodes == [(7.0, 7), (7.0, 7)]  # episodes end at steps 7 and 14
    assert all(any(g.abs().sum() > 0 for g in grads) for grads in link.pushed)


def test_gradients_do_not_accumulate_across_updates():
    worker, link, _ = make(length=50)
    rollout = worker.collect()
    worker.learner.learn(rollout)
    worker.learner.learn(rollout)  # the same data twice: the same gradient, not twice it
    for first, second in zip(*link.pushed):
        torch.testing.assert_close(first, second)


def test_learn_gradient_equals_a_slow_step_by_step_reference():
    worker, link, cfg = make(env="tests.envs:VaryingLength-v0", envs=3, steps=6)
    worker.run_rollout()  # carry a non-zero LSTM state into the rollout we check
    link.pull(worker.model)
    rollout = worker.collect()
    assert rollout.dones.any() and rollout.start_state[0].abs().sum() > 0
    worker.learner.learn(rollout)
    fast = link.pushed[-1]

    reference = build_model((2,), 2, 8)
    copy_weights(reference, worker.model)
    returns, advantages = rollout_targets(rollout.rewards, rollout.values, rollout.dones, rollout.done_values,
                                          rollout.last_values, cfg.gamma, cfg.gae_lambda)
    total = 0
    for k in range(3):  # one env, one step at a time, its state zeroed where its episode restarted
        state = (rollout.start_state[0][:, k : k + 1], rollout.start_state[1][:, k : k + 1])
        for t in range(6):
            if rollout.resets[t, k]:
                state = reference.initial_state(1)
            logits, value, state = reference.step(torch.from_numpy(rollout.obs[t, k][None]), state)
            total = total + a3c_loss(logits, value, torch.tensor([rollout.actions[t, k]]),
                                     torch.tensor([advantages[t, k]]), torch.tensor([returns[t, k]])).total
    total.backward()
    for p_fast, p_ref in zip(fast, reference.parameters()):
        torch.testing.assert_close(p_fast, p_ref.grad, rtol=1e-4, atol=1e-5)


def test_envs_that_end_episodes_at_different_steps_keep_their_own_columns():
    worker, link, _ = make(env="tests.envs:VaryingLength-v0", envs=3, steps=8)
    lengths = [env.unwrapped.length for env in worker.envs]
    assert len(set(lengths)) == 3
    rollout = worker.collect()
    for k, length in enumerate(lengths):
        ends = list(np.flatnonzero(rollout.dones[:, k]))
        assert ends == [t for t in range(8) if (t + 1) % length == 0]
        restarts = list(np.flatnonzero(rollout.resets[:, k]))
        assert restarts == [t + 1 for t in ends if t + 1 < 8]
        # Each column's observation counts steps within its own episode.
        np.testing.assert_array_equal(rollout.obs[:, k, 0], [t % length for t in range(8)])
    assert sorted(length for _, length in link.episodes) == sorted(
        length for length in lengths for t in range(8) if (t + 1) % length == 0)


def test_truncation_bootstraps_from_the_value_of_the_state_reached():
    worker, _, cfg = make(length=3, truncate=True, steps=4)
    rollout = worker.collect()
    assert rollout.dones[2, 0] and not rollout.resets[:3].any()
    # The value of the final observation [3, 1] from the LSTM state after steps 0..2.
    with torch.no_grad():
        state = rollout.start_state
        for t in range(3):
            _, _, state = worker.model.step(torch.from_numpy(rollout.obs[t]), state)
        _, expected, _ = worker.model.step(torch.tensor([[3.0, 1.0]]), state)
    assert rollout.done_values[2, 0] == float(expected[0]) != 0.0
    returns, _ = rollout_targets(rollout.rewards, rollout.values, rollout.dones, rollout.done_values,
                                 rollout.last_values, cfg.gamma, cfg.gae_lambda)
    np.testing.assert_allclose(returns[2, 0], 1.0 + cfg.gamma * expected[0].item(), rtol=1e-6)
