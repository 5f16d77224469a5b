import math

import numpy as np
import torch

from hogwild_a3c.model import ActorCritic


def test_conv_model_shapes_and_feature_size():
    model = ActorCritic((1, 42, 42), 6)
    assert model.encoder.out_features == 288
    obs = torch.rand(3, 1, 42, 42)
    logits, value, (h, c) = model.step(obs, model.initial_state(3))
    assert logits.shape == (3, 6) and value.shape == (3,)
    assert h.shape == c.shape == (1, 3, 256)
    logits, values = model.replay(torch.rand(20, 2, 1, 42, 42), model.initial_state(2))
    assert logits.shape == (20, 2, 6) and values.shape == (20, 2)


def test_mlp_model_for_vector_observations():
    model = ActorCritic((4,), 2, lstm_size=32)
    logits, value, _ = model.step(torch.rand(5, 4), model.initial_state(5))
    assert logits.shape == (5, 2) and value.shape == (5,)


def test_initialisation_follows_the_seed():
    torch.manual_seed(0)
    model = ActorCritic((1, 42, 42), 6)
    for conv in [m for m in model.encoder if isinstance(m, torch.nn.Conv2d)]:
        bound = math.sqrt(6.0 / (conv.in_channels * 9 + 32 * 9))
        assert conv.weight.abs().max() <= bound
        assert conv.weight.abs().max() > 0.9 * bound  # uniform over the whole range, not a narrower init
        assert torch.all(conv.bias == 0)
    torch.testing.assert_close(model.policy.weight.norm(dim=1), torch.full((6,), 0.01))
    torch.testing.assert_close(model.value.weight.norm(dim=1), torch.ones(1))
    assert torch.all(model.policy.bias == 0) and torch.all(model.value.bias == 0)
    assert torch.all(model.lstm.bias_ih_l0 == 0) and torch.all(model.lstm.bias_hh_l0 == 0)


def test_step_by_step_equals_replay_including_resets():
    torch.manual_seed(1)
    model = ActorCritic((3,), 4, lstm_size=16)
    steps, batch = 9, 3
    obs = torch.randn(steps, batch, 3)
    resets = torch.zeros(steps, batch, dtype=torch.bool)
    resets[4, 1] = resets[7, 0] = True
    start = (torch.randn(1, batch, 16), torch.randn(1, batch, 16))
    replay_logits, replay_values = model.replay(obs, start, resets)
    state = start
    for t in range(steps):
        keep = (~resets[t]).float().view(1, batch, 1)
        state = (state[0] * keep, state[1] * keep)
        logits, values, state = model.step(obs[t], state)
        torch.testing.assert_close(logits, replay_logits[t], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(values, replay_values[t], rtol=1e-5, atol=1e-6)


def test_initial_state_is_zero_and_independent():
    model = ActorCritic((2,), 2, lstm_size=8)
    h, c = model.initial_state(2)
    assert not h.any() and not c.any()
    h += 1
    assert not c.any()
    assert np.shares_memory(h.numpy(), c.numpy()) is False
