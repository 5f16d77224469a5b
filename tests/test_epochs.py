"""`--epochs N`: N updates from each rollout, the passes after the first with PPO's clipped policy
term against the first pass's probabilities. The term against a per-sample reference, its
gradient where the policy has not moved, a worker's passes through a link whose pushes move the
weights, and bad values refused in one line."""
import pytest
import torch

import tests.envs  # noqa: F401
from hogwild_a3c import train
from hogwild_a3c.children.worker import Worker
from hogwild_a3c.config import Config
from hogwild_a3c.envs.make import describe_env
from hogwild_a3c.learning.algo import a3c_loss, rollout_targets
from hogwild_a3c.learning.distributions import Categorical
from hogwild_a3c.learning.model import build_model
from tests.helpers import one_error_line
from tests.test_worker_link import RecordingLink


def random_batch(size=12, actions=4, seed=0):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(size, actions, generator=generator)
    old_logits = logits + 0.6 * torch.randn(size, actions, generator=generator)
    chosen = torch.randint(actions, (size,), generator=generator)
    advantages = torch.randn(size, generator=generator)
    returns, values = torch.randn(size, generator=generator), torch.randn(size, generator=generator)
    return logits, old_logits, chosen, advantages, returns, values


def test_the_clipped_policy_term_is_ppos_sample_by_sample():
    logits, old_logits, actions, advantages, returns, values = random_batch()
    old = Categorical(2).log_prob(old_logits, actions)
    terms = a3c_loss(logits, values, actions, advantages, returns, old_log_probs=old, ratio_clip=0.2)
    expected = 0.0
    clipped_samples = 0
    for i in range(len(actions)):
        p_new = torch.softmax(logits[i], -1)[actions[i]]
        p_old = torch.softmax(old_logits[i], -1)[actions[i]]
        ratio = float(p_new / p_old)
        bounded = min(max(ratio, 0.8), 1.2)
        clipped_samples += bounded != ratio
        expected -= min(ratio * float(advantages[i]), bounded * float(advantages[i]))
    assert clipped_samples >= 3  # the batch exercises the clip
    torch.testing.assert_close(terms.policy, torch.tensor(expected, dtype=torch.float32))
    # The value and entropy terms are A3C's whatever the policy term is.
    plain = a3c_loss(logits, values, actions, advantages, returns)
    torch.testing.assert_close(terms.value, plain.value)
    torch.testing.assert_close(terms.entropy, plain.entropy)


def test_where_the_policy_has_not_moved_the_clipped_term_has_a3cs_gradient():
    logits, _, actions, advantages, returns, values = random_batch(seed=1)
    plain_logits = logits.clone().requires_grad_()
    clipped_logits = logits.clone().requires_grad_()
    a3c_loss(plain_logits, values, actions, advantages, returns).total.backward()
    old = Categorical(2).log_prob(logits, actions)
    a3c_loss(clipped_logits, values, actions, advantages, returns, old_log_probs=old).total.backward()
    torch.testing.assert_close(clipped_logits.grad, plain_logits.grad)


def test_a_sample_moved_past_the_clip_stops_pushing_only_in_the_direction_it_moved():
    # One sample whose action became 1.5x as likely: with a positive advantage (the way it moved)
    # its policy gradient is cut; with a negative one (back towards the old policy) it stays.
    old_logits = torch.zeros(1, 2)
    logits = torch.tensor([[torch.log(torch.tensor(3.0)).item(), 0.0]])  # p(0): 0.5 -> 0.75
    action = torch.tensor([0])
    old = Categorical(2).log_prob(old_logits, action)
    for advantage, cut in [(1.0, True), (-1.0, False)]:
        moved = logits.clone().requires_grad_()
        a3c_loss(moved, torch.zeros(1), action, torch.tensor([advantage]), torch.zeros(1),
                 entropy_coef=0.0, old_log_probs=old, ratio_clip=0.1).policy.backward()
        assert (moved.grad.abs().max() == 0) == cut
    # Its mirror: the action became half as likely; cut with a negative advantage only.
    logits = torch.tensor([[0.0, torch.log(torch.tensor(3.0)).item()]])  # p(0): 0.5 -> 0.25
    for advantage, cut in [(-1.0, True), (1.0, False)]:
        moved = logits.clone().requires_grad_()
        a3c_loss(moved, torch.zeros(1), action, torch.tensor([advantage]), torch.zeros(1),
                 entropy_coef=0.0, old_log_probs=old, ratio_clip=0.1).policy.backward()
        assert (moved.grad.abs().max() == 0) == cut


class SgdLink(RecordingLink):
    """A link whose push moves its weights by plain SGD, as a shared model's optimizer would, and
    whose statistics merge into its model's running moments, as the shared model's do."""

    def __init__(self, model, lr):
        super().__init__(model)
        self.lr = lr

    def push(self, local_model):
        super().push(local_model)
        with torch.no_grad():
            for shared, local in zip(self.model.parameters(), local_model.parameters()):
                shared -= self.lr * local.grad

    def merge_statistics(self, obs, returns):
        super().merge_statistics(obs, returns)
        if obs is not None:
            self.model.obs_norm.merge_(obs)


def make_worker(epochs, lr=2.0, **settings):
    cfg = Config(env="tests.envs:VaryingLength-v0", num_workers=1, envs_per_worker=3, rollout_steps=6, lstm_size=8,
                 epochs=epochs, ratio_clip=0.1, **settings)
    info = describe_env(cfg.env, cfg.env_kwargs)
    torch.manual_seed(0)
    link = SgdLink(build_model(info.obs_shape, info.distribution, cfg), lr)
    return Worker(0, cfg, info, link, seed=3), link, info


def targets(rollout, cfg):
    returns, advantages = rollout_targets(rollout.rewards, rollout.values, rollout.dones, rollout.done_values,
                                          rollout.last_values, cfg.gamma, cfg.gae_lambda)
    return torch.from_numpy(returns).flatten(), torch.from_numpy(advantages).flatten()


def test_each_pass_pulls_the_moved_weights_and_learns_with_the_clipped_term():
    worker, link, info = make_worker(epochs=3)
    worker.link.pull(worker.model)
    rollout = worker.collect()
    start = [p.detach().clone() for p in worker.model.parameters()]
    obs, resets = torch.from_numpy(rollout.obs), torch.from_numpy(rollout.resets)
    with torch.no_grad():
        first_logits, _ = worker.model.replay(obs, rollout.start_state, resets)
    actions = torch.from_numpy(rollout.actions).flatten()
    first = Categorical(2).log_prob(first_logits.flatten(0, 1), actions)
    returns, advantages = targets(rollout, worker.cfg)
    link.calls.clear()

    assert worker.learner.learn(rollout)
    assert link.calls == ["push", "pull", "push", "pull", "push"]
    assert len(link.updates) == 1  # progress.csv keeps one row of A3C's losses per rollout

    # Each pass: the clipped gradient of the loss at the weights the passes before it left.
    reference = build_model(info.obs_shape, info.distribution, worker.cfg)
    weights = start
    for done, pushed in enumerate(link.pushed):
        with torch.no_grad():
            for p, w in zip(reference.parameters(), weights):
                p.copy_(w)
        reference.zero_grad()
        logits, values = reference.replay(obs, rollout.start_state, resets)
        logits = logits.flatten(0, 1)
        old = None if done == 0 else first
        a3c_loss(logits, values.flatten(), actions, advantages, returns, old_log_probs=old,
                 ratio_clip=0.1).total.backward()
        torch.nn.utils.clip_grad_norm_(list(reference.parameters()), worker.cfg.max_grad_norm)
        for p_fast, p_ref in zip(pushed, reference.parameters()):
            torch.testing.assert_close(p_fast, p_ref.grad, rtol=1e-4, atol=1e-5)
        if done:  # some samples moved past the clip the way their advantage pushes: their term is cut
            ratios = torch.exp(Categorical(2).log_prob(logits.detach(), actions) - first)
            assert (((ratios > 1.1) & (advantages > 0)) | ((ratios < 0.9) & (advantages < 0))).any()
        weights = [w - 2.0 * g for w, g in zip(weights, pushed)]


def test_one_epoch_is_a3c_unchanged_and_the_first_of_several_is_a3cs_update():
    single, single_link, _ = make_worker(epochs=1)
    single.run_rollout()
    assert single_link.calls == ["pull", "push"]
    several, several_link, _ = make_worker(epochs=2)
    several.run_rollout()
    assert several_link.calls == ["pull", "push", "pull", "push"]
    for a, b in zip(single_link.pushed[0], several_link.pushed[0]):
        assert torch.equal(a, b)
    assert single_link.updates == several_link.updates


def test_later_passes_replay_with_the_statistics_the_rollout_was_acted_with():
    # The weights do not move (lr 0) but the shared observation statistics do (this rollout was
    # merged into them after acting): a later pass must still see r = 1, so A3C's very gradient.
    worker, link, _ = make_worker(epochs=2, lr=0.0, normalize_obs=True)
    worker.run_rollout()
    assert link.calls == ["pull", "merge_statistics", "push", "pull", "push"]
    assert not torch.equal(link.model.obs_norm.mean, worker.model.obs_norm.mean)  # the shared ones moved on
    for first, second in zip(*link.pushed):
        torch.testing.assert_close(first, second, rtol=0, atol=0)


class PoisoningLink(SgdLink):
    """A push that leaves the shared weights non-finite, as a diverged update would."""

    def push(self, local_model):
        super().push(local_model)
        with torch.no_grad():
            next(self.model.parameters()).fill_(float("nan"))


def test_a_non_finite_later_pass_is_skipped_and_ends_the_passes():
    cfg = Config(env="tests.envs:VaryingLength-v0", num_workers=1, envs_per_worker=2, rollout_steps=4, lstm_size=8,
                 epochs=3)
    info = describe_env(cfg.env, cfg.env_kwargs)
    link = PoisoningLink(build_model(info.obs_shape, info.distribution, cfg), 0.1)
    worker = Worker(0, cfg, info, link, seed=3)
    link.pull(worker.model)
    assert not worker.learner.learn(worker.collect())
    assert link.calls == ["pull", "push", "pull"]  # pass 2 pulled NaN weights and pushed nothing
    assert link.counts == ["skipped_updates"] and len(link.updates) == 1


@pytest.mark.parametrize("flags,message", [
    (["--epochs", "0"], "--epochs must be an integer from 1 to 16 (got 0)"),
    (["--epochs", "2", "--ratio-clip", "1.5"], "--ratio-clip must be a number between 0 and 1"),
    (["--ratio-clip", "nan"], "--ratio-clip must be a finite number (got nan)"),
])
def test_bad_epochs_or_ratio_clip_are_one_line_before_any_run_starts(tmp_path, capsys, flags, message):
    run_dir = tmp_path / "run"
    assert train.main(["--env", "CartPole-v1", *flags, "--max-steps", "10", "--no-progress",
                       "--run-dir", str(run_dir)]) != 0
    assert message in one_error_line(capsys)
    assert not run_dir.exists()
