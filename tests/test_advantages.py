"""`--normalize-advantages`: each update's advantages at mean 0 and std 1 over its batch, against
numpy's own mean and std, and the worker's gradient against a reference fed those advantages."""
import numpy as np
import torch

from hogwild_a3c.files.rundir import resolve_new
from hogwild_a3c.learning.algo import a3c_loss, normalized_advantages
from tests.test_epochs import make_worker, targets


def test_advantages_are_scaled_to_mean_0_and_std_1_over_the_batch():
    advantages = np.random.default_rng(0).normal(3.0, 0.05, size=(10, 8)).astype(np.float32)
    scaled = normalized_advantages(advantages)
    assert scaled.shape == advantages.shape and scaled.dtype == np.float32
    expected = (advantages - advantages.mean()) / advantages.std()
    np.testing.assert_allclose(scaled, expected, rtol=1e-4, atol=1e-5)
    assert abs(float(scaled.mean())) < 1e-6 and abs(float(scaled.std()) - 1.0) < 1e-5
    # The order of the samples within the batch is kept: the largest stays the largest.
    assert np.argmax(scaled) == np.argmax(advantages)


def test_a_batch_of_equal_advantages_prefers_no_action():
    np.testing.assert_array_equal(normalized_advantages(np.full((4, 2), 0.7, np.float32)), np.zeros((4, 2)))


def test_the_workers_update_uses_the_normalized_advantages():
    pushed = {}
    for normalize in (False, True):
        worker, link, _ = make_worker(epochs=1, normalize_advantages=normalize)
        link.pull(worker.model)
        rollout = worker.collect()
        start = [p.detach().clone() for p in worker.model.parameters()]
        assert worker.learner.learn(rollout)
        pushed[normalize] = link.pushed[0]
    returns, advantages = targets(rollout, worker.cfg)
    scaled = torch.from_numpy(normalized_advantages(advantages.numpy()))
    with torch.no_grad():
        for p, w in zip(worker.model.parameters(), start):
            p.copy_(w)
    worker.model.zero_grad()
    logits, values = worker.model.replay(torch.from_numpy(rollout.obs), rollout.start_state,
                                         torch.from_numpy(rollout.resets))
    a3c_loss(logits.flatten(0, 1), values.flatten(), torch.from_numpy(rollout.actions).flatten(), scaled,
             returns).total.backward()
    torch.nn.utils.clip_grad_norm_(list(worker.model.parameters()), worker.cfg.max_grad_norm)
    for fast, reference in zip(pushed[True], worker.model.parameters()):
        torch.testing.assert_close(fast, reference.grad, rtol=1e-4, atol=1e-5)
    assert any(not torch.allclose(a, b) for a, b in zip(pushed[True], pushed[False]))


def test_the_flag_turns_it_on_and_the_presets_leave_it_off():
    assert resolve_new({"num_workers": 1, "normalize_advantages": True}).normalize_advantages
    for env in ("ALE/Pong-v5", "CartPole-v1"):  # the atari and vector presets
        assert not resolve_new({"num_workers": 1, "env": env}).normalize_advantages
