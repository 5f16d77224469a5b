"""The worker loop in-process: LSTM state hand-over with a counting env, bootstrap choice."""
import numpy as np
import torch

import tests.envs  # noqa: F401
from hogwild_a3c.children.reports import InProcessReports
from hogwild_a3c.children.shared import STAT, HogwildLink, SharedState
from hogwild_a3c.children.worker import Worker
from hogwild_a3c.config import Config
from hogwild_a3c.envs.make import describe_env
from hogwild_a3c.learning.model import build_model
from hogwild_a3c.learning.optim import LrSchedule


def make_worker(env="tests.envs:Counting-v0", envs_per_worker=1, rollout_steps=5, **env_kwargs):
    cfg = Config(env=env, env_kwargs=env_kwargs, num_workers=0, envs_per_worker=envs_per_worker,
                 rollout_steps=rollout_steps, lstm_size=8)
    info = describe_env(cfg.env, cfg.env_kwargs)
    torch.manual_seed(0)
    shared = SharedState.create(build_model(info.obs_shape, info.distribution, 8), 1, "adam", LrSchedule(1e-3))
    return Worker(0, cfg, info, HogwildLink(shared, 0, InProcessReports()), seed=1), shared


def record_steps(worker):
    """Wrap model.step to record (observation, input LSTM state) for every acting call."""
    calls = []
    original = worker.model.step

    def spy(obs, state):
        calls.append((obs.clone(), state[0].clone(), state[1].clone()))
        return original(obs, state)

    worker.model.step = spy
    return calls


def test_lstm_state_carried_across_rollouts_and_reset_at_episode_end():
    # Episodes of 7 steps, rollouts of 5: episodes straddle rollouts and end mid-rollout.
    worker, _ = make_worker(length=7)
    calls = record_steps(worker)
    replay_starts = []
    original_replay = worker.model.replay

    def replay_spy(obs, state, resets=None, *rest):
        replay_starts.append((state[0].clone(), resets.clone()))
        return original_replay(obs, state, resets, *rest)

    worker.model.replay = replay_spy
    end_states = []
    for _ in range(6):
        worker.run_rollout()
        end_states.append(worker.state[0].clone())
    # Every step that sees the first observation of an episode (t == 0) starts from a zero state;
    # every other step starts from a non-zero one.
    for obs, h, c in calls:
        if obs[0, 0] == 0:
            assert not h.any() and not c.any()
        else:
            assert h.abs().sum() > 0
    # Each replay starts from the state the previous rollout ended in (detached, carried over).
    for (start, _), previous_end in zip(replay_starts[1:], end_states[:-1]):
        torch.testing.assert_close(start, previous_end)
        assert not start.requires_grad
    # Episode ends at global steps 7, 14, 21, 28 fall in rollouts 1, 2, 4, 5 (0-based).
    assert [bool(r.any()) for _, r in replay_starts] == [False, True, True, False, True, True]


def test_truncation_bootstraps_and_termination_does_not():
    for truncate in (False, True):
        worker, _ = make_worker(length=3, truncate=truncate, rollout_steps=4)
        worker.run_rollout()
        assert worker.rollout.dones[2, 0]
        if truncate:
            assert worker.rollout.done_values[2, 0] != 0.0
        else:
            assert worker.rollout.done_values[2, 0] == 0.0


def test_batched_envs_keep_their_own_state_and_rollouts():
    worker, shared = make_worker(envs_per_worker=3, length=4)
    assert worker.run_rollout() == 15
    assert worker.rollout.obs.shape[:2] == (5, 3)
    assert shared.global_step() == 15
    # All three envs ended at step 4 (index 3) and restarted at index 4.
    assert worker.rollout.dones[3].all() and worker.rollout.resets[4].all()
    np.testing.assert_array_equal(worker.rollout.obs[4, :, 0], [0, 0, 0])


def test_env_exception_drops_the_rollout_and_recreates_the_env():
    worker, shared = make_worker(env="tests.envs:Faulty-v0", fault="raise", fail_at=3, max_failures=1)
    tests.envs.FaultyEnv.failures_in_process = 0
    assert worker.run_rollout() == 0
    assert shared.worker_stats[0, STAT["env_errors"]] == 1
    assert worker.run_rollout() == 5
