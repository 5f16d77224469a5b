"""Replay with V-trace (`--replay-ratio`): the correction against a slow reference and against the
on-policy targets it must reduce to; the replay memory's bounds and frames; a replayed update at
the weights that acted equal to A3C's, and one at moved weights equal to a reference; ratio 0 is
A3C exactly; a toy image task learned with replay through the real processes."""
import json
import math

import numpy as np
import pytest
import torch

import tests.envs  # noqa: F401 - registers the test envs
from hogwild_a3c import train
from hogwild_a3c.children.shared import HogwildLink
from hogwild_a3c.children.worker import Worker
from hogwild_a3c.config import Config
from hogwild_a3c.envs.make import describe_env
from hogwild_a3c.learning.algo import a3c_loss, rollout_targets
from hogwild_a3c.learning.learner import A3CLearner, LearnBatch, ReplayLearner
from hogwild_a3c.learning.model import build_model
from hogwild_a3c.learning.replay_memory import ReplayMemory
from hogwild_a3c.learning.rollout import Rollout
from hogwild_a3c.learning.vtrace import vtrace_targets
from tests.helpers import acts_and_learns_in_a_worker, one_error_line
from tests.test_epochs import SgdLink
from tests.test_epochs import make_worker as make_epochs_worker


def slow_vtrace(rewards, values, dones, done_values, last_values, log_ratios, gamma, lam, rho_bar=1.0, c_bar=1.0):
    """IMPALA's sums written out: for each step s of each column, over the steps t of its stretch,
    v_s = V_s + sum_t gamma^(t-s) (prod_{i=s}^{t-1} c_i) rho_t delta_t, and the advantage the same
    sum with (gamma lambda)^(t-s)."""
    steps, envs = rewards.shape
    value_targets, advantages = np.zeros((steps, envs)), np.zeros((steps, envs))
    ratios = np.exp(log_ratios.astype(np.float64))
    for k in range(envs):
        for s in range(steps):
            end = s
            while end < steps - 1 and not dones[end, k]:
                end += 1  # the stretch runs to an episode end or the rollout's last step
            total_v = total_a = 0.0
            for t in range(s, end + 1):
                following = values[t + 1, k] if t + 1 < steps else last_values[k]
                next_value = done_values[t, k] if dones[t, k] else following
                delta = min(rho_bar, ratios[t, k]) * (rewards[t, k] + gamma * next_value - values[t, k])
                trace = math.prod(min(c_bar, ratios[i, k]) for i in range(s, t))
                total_v += gamma ** (t - s) * trace * delta
                total_a += (gamma * lam) ** (t - s) * trace * delta
            value_targets[s, k] = values[s, k] + total_v
            advantages[s, k] = total_a
    return value_targets, advantages


def random_rollout(seed, steps=9, envs=3):
    rng = np.random.default_rng(seed)
    dones = rng.random((steps, envs)) < 0.2
    done_values = np.where(rng.random((steps, envs)) < 0.5, 0.0, rng.normal(size=(steps, envs))) * dones
    return (rng.normal(size=(steps, envs)).astype(np.float32), rng.normal(size=(steps, envs)).astype(np.float32),
            dones, done_values.astype(np.float32), rng.normal(size=envs).astype(np.float32),
            rng.normal(scale=0.7, size=(steps, envs)).astype(np.float32))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("gamma, lam", [(0.99, 1.0), (0.9, 0.95), (0.5, 0.0)])
def test_vtrace_matches_the_sums_written_out(seed, gamma, lam):
    rewards, values, dones, done_values, last_values, log_ratios = random_rollout(seed)
    fast = vtrace_targets(rewards, values, dones, done_values, last_values, log_ratios, gamma, lam)
    slow = slow_vtrace(rewards, values, dones, done_values, last_values, log_ratios, gamma, lam)
    for got, want in zip(fast, slow):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_truncation_levels_other_than_one_match_the_sums_too():
    rewards, values, dones, done_values, last_values, log_ratios = random_rollout(7)
    fast = vtrace_targets(rewards, values, dones, done_values, last_values, log_ratios, 0.95, 0.9, 1.5, 0.8)
    slow = slow_vtrace(rewards, values, dones, done_values, last_values, log_ratios, 0.95, 0.9, 1.5, 0.8)
    for got, want in zip(fast, slow):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("lam", [1.0, 0.95, 0.0])
def test_on_policy_vtrace_is_the_n_step_return_and_the_gae_advantage(lam):
    rewards, values, dones, done_values, last_values, _ = random_rollout(3, steps=12, envs=4)
    on_policy = np.zeros_like(rewards)
    returns, advantages = rollout_targets(rewards, values, dones, done_values, last_values, 0.97, lam)
    value_targets, corrected = vtrace_targets(rewards, values, dones, done_values, last_values, on_policy, 0.97, lam)
    np.testing.assert_allclose(value_targets, returns, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(corrected, advantages, rtol=1e-5, atol=1e-5)


def test_a_ratio_above_one_is_truncated_to_one_and_one_below_scales_the_step():
    rewards, values, dones, done_values, last_values, _ = random_rollout(5, steps=1, envs=1)
    dones[:] = True
    done_values[:] = 0.0
    at = {r: vtrace_targets(rewards, values, dones, done_values, last_values, np.full((1, 1), np.log(r), np.float32),
                            0.9, 1.0)[1][0, 0] for r in (1.0, 30.0, 0.25)}
    assert at[30.0] == pytest.approx(at[1.0])
    assert at[0.25] == pytest.approx(0.25 * at[1.0], rel=1e-6)
    huge = vtrace_targets(rewards, values, dones, done_values, last_values, np.full((1, 1), 1e4, np.float32), 0.9, 1.0)
    assert np.isfinite(huge[0]).all() and np.isfinite(huge[1]).all()


# -- the replay memory ------------------------------------------------------------------------

def filled_rollout(info, steps, envs, value, frames=False):
    state = (torch.full((1, envs, 4), value), torch.full((1, envs, 4), -value))
    rollout = Rollout.empty(steps, envs, info.obs_shape, state, info.distribution)
    rollout.obs[:] = value if not frames else np.linspace(0, 1, rollout.obs.size).reshape(rollout.obs.shape)
    rollout.next_obs[:] = value if not frames else 0.5
    rollout.rewards[:] = value
    rollout.actions[:] = int(value) % 2
    rollout.log_probs[:] = -value
    return rollout


def test_the_memory_keeps_the_last_n_rollouts_as_copies_in_the_room_it_was_given():
    info = describe_env("tests.envs:VaryingLength-v0")
    memory = ReplayMemory(3, 5, 2, info.obs_shape, 4, info.distribution, frames_uint8=False)
    room = memory.nbytes
    for value in range(1, 6):
        rollout = filled_rollout(info, 5, 2, float(value))
        memory.add(rollout)
        rollout.rewards[:] = -99  # a worker refills its one rollout: the memory must hold its own copy
    assert memory.size == 3 and memory.nbytes == room
    rng = np.random.default_rng(0)
    seen = {float(memory.sample(rng).rewards[0, 0]) for _ in range(60)}
    assert seen == {3.0, 4.0, 5.0}  # the two oldest went first, and every kept one is drawn
    stored = memory.sample(np.random.default_rng(1))
    value = float(stored.rewards[0, 0])
    assert stored.obs.shape == (6, 2, *info.obs_shape)  # s_0 .. s_T
    assert float(stored.start_state[0][0, 0, 0]) == value and float(stored.start_state[1][0, 0, 0]) == -value
    assert (stored.log_probs == -value).all()


def test_frames_are_kept_as_uint8_levels_within_half_a_level():
    info = describe_env("tests.envs:CueImage-v0")
    assert info.unit_interval
    memory = ReplayMemory(2, 4, 2, info.obs_shape, 4, info.distribution, frames_uint8=True)
    assert memory.obs.dtype == np.uint8
    rollout = filled_rollout(info, 4, 2, 0.0, frames=True)
    memory.add(rollout)
    stored = memory.sample(np.random.default_rng(0))
    np.testing.assert_allclose(stored.obs[:4].numpy(), rollout.obs, atol=0.5 / 255 + 1e-7)
    np.testing.assert_allclose(stored.obs[4].numpy(), 0.5, atol=0.5 / 255 + 1e-7)
    float_memory = ReplayMemory(2, 4, 2, info.obs_shape, 4, info.distribution, frames_uint8=False)
    assert memory.obs.nbytes * 4 == float_memory.obs.nbytes


def test_only_observations_bounded_in_the_unit_interval_are_frames():
    assert describe_env("tests.envs:CueImage-v0").unit_interval  # uint8 images, scaled by 1/255
    assert describe_env("ALE/Pong-v5").unit_interval
    assert not describe_env("CartPole-v1").unit_interval
    assert not describe_env("tests.envs:CueDict-v0").unit_interval  # a noise vector beside the image


# -- the learner ------------------------------------------------------------------------------

def make_worker(lr, replay_ratio, **settings):
    return make_epochs_worker(1, lr, replay_ratio=replay_ratio, replay_size=4, **settings)


def test_replay_ratio_zero_is_a3c_exactly():
    plain, plain_link, _ = make_worker(0.5, 0.0)
    assert type(plain.learner) is A3CLearner
    default_cfg = Config(env="tests.envs:VaryingLength-v0", num_workers=1, envs_per_worker=3, rollout_steps=6,
                         lstm_size=8)
    info = describe_env(default_cfg.env)
    torch.manual_seed(0)
    default_link = SgdLink(build_model(info.obs_shape, info.distribution, default_cfg), 0.5)
    default = Worker(0, default_cfg, info, default_link, seed=3)
    for _ in range(4):
        plain.run_rollout()
        default.run_rollout()
    assert plain_link.calls == default_link.calls
    for a, b in zip(plain_link.model.parameters(), default_link.model.parameters()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("lam", [1.0, 0.9])
def test_a_replayed_update_at_the_weights_that_acted_is_a3cs_update(lam):
    # lr 0: the weights never move, so every replay of the one stored rollout is on-policy, and
    # V-trace must give A3C's gradient (its value at s_T taken by the replay, not by acting).
    worker, link, _ = make_worker(0.0, 16.0, gae_lambda=lam)
    assert isinstance(worker.learner, ReplayLearner)
    worker.run_rollout()
    assert link.calls[:2] == ["pull", "push"] and link.calls[2:] == ["pull", "push"] * (len(link.pushed) - 1)
    assert len(link.pushed) > 4  # Poisson(16) replays, drawn
    for replayed in link.pushed[1:]:
        for on_policy, again in zip(link.pushed[0], replayed):
            torch.testing.assert_close(again, on_policy, rtol=1e-4, atol=1e-5)


def test_a_replayed_update_at_moved_weights_is_vtraces_at_those_weights():
    worker, link, info = make_worker(0.5, 1.0, gae_lambda=0.95)
    for _ in range(3):
        worker.run_rollout()
    memory, slot = worker.learner.memory, 0  # the oldest: acted by weights that have moved since
    link.pull(worker.model)
    link.pushed.clear()
    weights = [p.detach().clone() for p in link.model.parameters()]  # the push moves them
    assert worker.learner._replayed_update(memory.stored(slot), lambda phase: None)

    reference = build_model(info.obs_shape, info.distribution, worker.cfg)
    with torch.no_grad():
        for p, w in zip(reference.parameters(), weights):
            p.copy_(w)
    logits, values = reference.replay(torch.from_numpy(memory.obs[slot]), (memory.start_h[slot], memory.start_c[slot]),
                                      torch.from_numpy(memory.resets[slot]))
    steps = worker.cfg.rollout_steps
    actions = torch.from_numpy(memory.actions[slot])
    log_pi = torch.log_softmax(logits[:steps].detach(), -1).gather(-1, actions[..., None]).squeeze(-1)
    log_ratios = log_pi.numpy() - memory.log_probs[slot]
    assert np.abs(log_ratios).max() > 1e-3  # the weights moved since it was acted
    v = values.detach().numpy()
    targets, advantages = vtrace_targets(memory.rewards[slot], v[:steps], memory.dones[slot], memory.done_values[slot],
                                         v[steps], log_ratios, worker.cfg.gamma, 0.95)
    a3c_loss(logits[:steps].flatten(0, 1), values[:steps].flatten(), actions.flatten(),
             torch.from_numpy(advantages).flatten(), torch.from_numpy(targets).flatten()).total.backward()
    torch.nn.utils.clip_grad_norm_(list(reference.parameters()), worker.cfg.max_grad_norm)
    for fast, ref in zip(link.pushed[0], reference.parameters()):
        torch.testing.assert_close(fast, ref.grad, rtol=1e-4, atol=1e-5)


class FixedPoisson:
    """The worker's generator, but a fixed number of replays per rollout."""

    def __init__(self, rng, count):
        self.rng, self.count = rng, count

    def poisson(self, lam):
        return self.count

    def __getattr__(self, name):
        return getattr(self.rng, name)


def test_a_joint_update_is_one_push_of_the_rollouts_gradient_plus_each_replayed_ones():
    # lr 0 keeps the weights where they acted; no clipping, so the pushed gradient is the raw sum.
    worker, link, _ = make_worker(0.0, 1.0, replay_joint=True, max_grad_norm=1e9)
    worker.run_rollout()  # an empty memory: A3C's update alone
    worker.learner.rng = FixedPoisson(worker.learner.rng, 3)
    worker.run_rollout()
    assert link.calls == ["pull", "push", "pull", "push"]  # no pull or push of their own for the replays
    learner, memory = worker.learner, worker.learner.memory
    assert memory.size == 2  # the second rollout joined after its update: every draw was the first

    def gradient(loss):
        for p in worker.model.parameters():
            p.grad = None
        loss.backward()
        return [p.grad.clone() for p in worker.model.parameters()]

    own = gradient(learner._loss(LearnBatch.of(worker.rollout, worker.cfg), None, lambda phase: None, "").total)
    replayed = gradient(learner._replayed_loss(memory.stored(0), lambda phase: None))
    for pushed, a, b in zip(link.pushed[1], own, replayed):
        torch.testing.assert_close(pushed, a + 3 * b, rtol=1e-4, atol=1e-5)
    assert max(float(b.abs().max()) for b in replayed) > 1e-4  # the replayed term is there to be found


@pytest.mark.parametrize("flags, message", [
    (["--replay-ratio", "-1"], "error: --replay-ratio must be a number from 0 (no replay) to 16 (got -1.0)"),
    (["--replay-size", "0"],
     "error: --replay-size must be an integer from 1 to 100000 (rollouts a worker keeps) (got 0)"),
    (["--replay-joint", "--epochs", "2"], "error: --replay-joint must be off with --epochs 2 (a joint update is one "
                                          "pass; drop --replay-joint or set --epochs 1) (got True)"),
])
def test_bad_replay_settings_are_one_line_before_anything_is_written(tmp_path, capsys, flags, message):
    run_dir = tmp_path / "run"
    assert train.main(["--env", "CartPole-v1", *flags, "--run-dir", str(run_dir)]) == 2
    assert one_error_line(capsys) == message
    assert not run_dir.exists()


@pytest.mark.timeout(240)
def test_a_toy_image_task_is_learned_with_replay_through_the_real_processes(tmp_path):
    # CueImage-v0: uint8 images, so the memory keeps uint8 frames; chance is 0.25, all right 1.
    run_dir = tmp_path / "run"
    assert train.main(["--env", "tests.envs:CueImage-v0", "--num-workers", "2", "--replay-ratio", "2",
                       "--max-steps", "60000", "--eval-interval", "3", "--eval-episodes", "10",
                       "--target-return", "0.9", "--no-progress", "--run-dir", str(run_dir)]) == 0
    log = (run_dir / "train.log").read_text()
    assert "replay memory:" in log and "uint8 frames" in log, log
    assert json.loads((run_dir / "meta.json").read_text())["sessions"][-1]["ended"] == "target_return"


@pytest.mark.parametrize("env_id", ["tests.envs:TargetBox-v0", "tests.envs:TargetParts-v0", "CartPole-v1",
                                    "tests.envs:CueImage-v0", "tests.envs:CueDict-v0"])
def test_every_action_and_observation_kind_replays_under_its_auto_preset(env_id, monkeypatch):
    # Box (Gaussian, stored unclipped), MultiDiscrete, a vector under the vector preset (mlp value
    # net, running normalization), a uint8 image (kept as uint8), a packed Dict (kept as float32).
    from hogwild_a3c.envs.make import env_options
    from hogwild_a3c.files.rundir import resolve_new

    cfg = resolve_new({"env": env_id, "num_workers": 0, "lstm_size": 16, "replay_ratio": 3.0, "replay_size": 2})
    info = describe_env(cfg.env, cfg.env_kwargs, **env_options(cfg))
    applied = []
    original = ReplayLearner._replayed_update
    monkeypatch.setattr(ReplayLearner, "_replayed_update",
                        lambda self, stored, phase_done: applied.append(original(self, stored, phase_done)) or True)
    worker = acts_and_learns_in_a_worker(cfg, info, rollouts=4)
    assert worker.learner.memory.size == 2 and worker.learner.memory.added == 4
    assert applied and all(applied)  # Poisson(3) four times: none at all has odds e^-12
    assert worker.learner.memory.frames_uint8 == (env_id == "tests.envs:CueImage-v0")


@pytest.mark.parametrize("env_id", ["tests.envs:TargetBox-v0", "tests.envs:CueImage-v0"])
def test_joint_updates_replay_under_the_auto_preset_with_one_push_a_rollout(env_id, monkeypatch):
    # CueImage's conv encoder learns the rollout's part from acting's kept activations and the
    # replayed part from the kept frames, in one backward.
    from hogwild_a3c.envs.make import env_options
    from hogwild_a3c.files.rundir import resolve_new

    cfg = resolve_new({"env": env_id, "num_workers": 0, "lstm_size": 16, "replay_ratio": 3.0, "replay_size": 2,
                       "replay_joint": True})
    info = describe_env(cfg.env, cfg.env_kwargs, **env_options(cfg))
    replayed, pushes = [], []
    original_loss, original_push = ReplayLearner._replayed_loss, HogwildLink.push
    monkeypatch.setattr(ReplayLearner, "_replayed_loss",
                        lambda self, stored, phase_done: replayed.append(1) or original_loss(self, stored, phase_done))
    monkeypatch.setattr(HogwildLink, "push", lambda self, model: pushes.append(1) or original_push(self, model))
    acts_and_learns_in_a_worker(cfg, info, rollouts=4)
    assert len(pushes) == 4 and replayed  # Poisson(3) three times: none at all has odds e^-9


class NoneKeepingSgdLink(SgdLink):
    """SgdLink for updates that leave some gradients None (the encoder, under features replay)."""

    def push(self, local_model):
        self.calls.append("push")
        self.pushed.append([None if p.grad is None else p.grad.clone() for p in local_model.parameters()])
        with torch.no_grad():
            for shared, local in zip(self.model.parameters(), local_model.parameters()):
                if local.grad is not None:
                    shared -= self.lr * local.grad


def test_a_replay_of_kept_features_at_the_weights_that_acted_is_a3cs_update_of_the_lstm_and_heads():
    # Atari frames: universe's conv + ELU chain, whose activations acting keeps for the learner.
    cfg = Config(env="ALE/Pong-v5", num_workers=1, envs_per_worker=2, rollout_steps=5, lstm_size=8,
                 replay_ratio=16.0, replay_size=4, replay_input="features")
    info = describe_env(cfg.env, cfg.env_kwargs)
    torch.manual_seed(0)
    link = NoneKeepingSgdLink(build_model(info.obs_shape, info.distribution, cfg), 0.0)
    worker = Worker(0, cfg, info, link, seed=3)
    assert worker.learner.keeps_features and worker.learner.reads_activations
    worker.run_rollout()
    memory = worker.learner.memory
    assert worker.learner.memory_has_features and memory.obs.shape[3:] == (288,)  # 32 channels x 3 x 3
    assert len(link.pushed) > 4
    names = [name for name, _ in worker.model.named_parameters()]
    for replayed in link.pushed[1:]:
        for name, on_policy, again in zip(names, link.pushed[0], replayed):
            if name.startswith("encoder."):
                assert again is None  # features replay leaves the encoder to the on-policy update
            else:
                torch.testing.assert_close(again, on_policy, rtol=1e-4, atol=1e-5)
