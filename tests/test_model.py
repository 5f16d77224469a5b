import math

import numpy as np
import pytest
import torch

from hogwild_a3c.learning.encoders import ConvEncoder, GridEncoder
from hogwild_a3c.learning.model import ActorCritic


def steps_agree_with_replay(model, obs):
    """Acting step by step from zeros gives the logits and values of one replay of obs [T, B, ...];
    returns the replay's, with their graph."""
    logits, values = model.replay(obs, model.initial_state(obs.shape[1]))
    state = model.initial_state(obs.shape[1])
    for t in range(len(obs)):
        step_logits, step_values, state = model.step(obs[t], state)
        torch.testing.assert_close(step_logits, logits[t], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(step_values, values[t], rtol=1e-5, atol=1e-6)
    return logits, values


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
    torch.testing.assert_close(model.action_head.weight.norm(dim=1), torch.full((6,), 0.01))
    torch.testing.assert_close(model.value.weight.norm(dim=1), torch.ones(1))
    assert torch.all(model.action_head.bias == 0) and torch.all(model.value.bias == 0)
    forget = slice(256, 512)  # torch's gate order: input, forget, cell, output
    assert torch.all(model.lstm.bias_ih_l0[forget] == 1.0) and torch.all(model.lstm.bias_hh_l0 == 0)
    others = torch.cat([model.lstm.bias_ih_l0[:256], model.lstm.bias_ih_l0[512:]])
    assert torch.all(others == 0)


def _basic_lstm_cell(x, h, c, kernel, forget_bias):
    """TF 1.x BasicLSTMCell, written from its definition: zero bias, gates [i, j, f, o] from one
    matmul of [x, h], and `forget_bias` added to f inside the sigmoid."""
    i, j, f, o = np.split(np.concatenate([x, h], axis=1) @ kernel, 4, axis=1)
    sigmoid = lambda z: 1.0 / (1.0 + np.exp(-z))  # noqa: E731
    new_c = c * sigmoid(f + forget_bias) + sigmoid(i) * np.tanh(j)
    return sigmoid(o) * np.tanh(new_c), new_c


def test_fresh_lstm_computes_what_the_seeds_basic_lstm_cell_computes():
    torch.manual_seed(1)
    size, inputs = 16, 288
    model = ActorCritic((1, 42, 42), 6, lstm_size=size)
    w_ih, w_hh = model.lstm.weight_ih_l0.detach().double().numpy(), model.lstm.weight_hh_l0.detach().double().numpy()
    # The same weights as TF's kernel [inputs + size, 4 * size], its gate blocks in TF's order (i, j, f, o).
    blocks = lambda w: np.split(w, 4, axis=0)  # noqa: E731 - torch's order: i, f, g(=j), o
    (wi, wf, wg, wo), (ui, uf, ug, uo) = blocks(w_ih), blocks(w_hh)
    kernel = np.concatenate([np.concatenate([wi, wg, wf, wo]).T, np.concatenate([ui, ug, uf, uo]).T], axis=0)
    x = np.random.default_rng(0).normal(size=(3, inputs))
    h = np.random.default_rng(1).normal(size=(3, size))
    c = np.random.default_rng(2).normal(size=(3, size))
    expected_h, expected_c = _basic_lstm_cell(x, h, c, kernel, forget_bias=1.0)
    with torch.no_grad():
        _, (got_h, got_c) = model.lstm(
            torch.tensor(x, dtype=torch.float32)[None],
            (torch.tensor(h, dtype=torch.float32)[None], torch.tensor(c, dtype=torch.float32)[None]),
        )
    np.testing.assert_allclose(got_h[0].numpy(), expected_h, atol=1e-5)
    np.testing.assert_allclose(got_c[0].numpy(), expected_c, atol=1e-5)
    # The old init (forget bias 0) is a different function: the check above can tell them apart.
    old_h, _ = _basic_lstm_cell(x, h, c, kernel, forget_bias=0.0)
    assert np.abs(old_h - expected_h).max() > 1e-3
    zero = ActorCritic((1, 42, 42), 6, lstm_size=size, lstm_forget_bias=0.0)
    assert torch.all(zero.lstm.bias_ih_l0 == 0)


@pytest.mark.parametrize("value_net", ["shared", "mlp"])
def test_step_by_step_equals_replay_including_resets(value_net):
    torch.manual_seed(1)
    model = ActorCritic((3,), 4, lstm_size=16, value_net=value_net, normalize_obs=True)
    model.obs_norm.merge_(np.random.default_rng(0).normal(2.0, 3.0, size=(50, 3)))
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


def test_a_value_mlp_beside_the_lstm_sees_the_observation_not_the_state():
    """value_net="mlp": the policy reads the LSTM, the value a feed-forward MLP of its own, so
    the value loss cannot shape the LSTM and the value does not depend on the carried state."""
    torch.manual_seed(0)
    model = ActorCritic((3,), 2, lstm_size=8, value_net="mlp", hidden_size=16)
    assert model.value_encoder is not None and model.value.in_features == 16
    obs = torch.randn(4, 3)
    state_a = model.initial_state(4)
    state_b = (torch.randn(1, 4, 8), torch.randn(1, 4, 8))
    logits_a, values_a, _ = model.step(obs, state_a)
    logits_b, values_b, _ = model.step(obs, state_b)
    torch.testing.assert_close(values_a, values_b)
    assert not torch.allclose(logits_a, logits_b)
    _, values = model.replay(obs[None], state_b)
    values.sum().backward()
    assert all(p.grad is None or not p.grad.any() for p in model.lstm.parameters())
    # "separate" keeps its meaning: with the lstm core the value is read from the LSTM, as saved runs expect.
    assert ActorCritic((3,), 2, lstm_size=8, value_net="separate").value_encoder is None


def test_initial_state_is_zero_and_independent():
    model = ActorCritic((2,), 2, lstm_size=8)
    h, c = model.initial_state(2)
    assert not h.any() and not c.any()
    h += 1
    assert not c.any()
    assert np.shares_memory(h.numpy(), c.numpy()) is False


def test_frames_with_observation_normalization_act_and_replay_alike_and_constant_pixels_give_zero():
    """The atari preset normalizes frames per pixel: Pong's background never changes, so its
    variance is 0; those pixels must reach the encoder as 0, not as NaN or 0 / 0 noise."""
    torch.manual_seed(0)
    model = ActorCritic((1, 42, 42), 6, lstm_size=16, normalize_obs=True)
    frames = torch.full((40, 1, 42, 42), 0.34)
    frames[:, 0, 10:14, 20] = torch.rand(40, 4)  # a "ball" column moving over a fixed background
    model.obs_norm.merge_(frames.numpy())
    normalized = model.obs_norm.normalize(frames)
    assert torch.isfinite(normalized).all()
    assert normalized[:, 0, :10].abs().max() == 0 and normalized[:, 0, 10:14, 20].std() > 0.5
    steps_agree_with_replay(model, frames[:30].view(10, 3, 1, 42, 42))


@pytest.mark.parametrize("encoder, size, features", [("universe", 84, 32 * 6 * 6), ("nature", 84, 512),
                                                      ("nature", 42, 512), ("impala", 42, 256), ("impala", 84, 256)])
def test_every_image_encoder_acts_and_replays_alike_and_every_weight_learns(encoder, size, features):
    torch.manual_seed(0)
    model = ActorCritic((1, size, size), 6, lstm_size=32, encoder=encoder)
    assert model.encoder.out_features == features
    logits, values = steps_agree_with_replay(model, torch.rand(4, 2, 1, size, size))
    (logits.logsumexp(-1).sum() + values.square().sum()).backward()
    for name, param in model.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all() and param.grad.abs().sum() > 0, name


@pytest.mark.parametrize("encoder, size", [("universe", 42), ("nature", 42), ("nature", 84), ("impala", 42),
                                           ("impala", 84)])
def test_every_image_encoder_starts_with_features_the_lstm_can_take(encoder, size):
    """Frames reach the encoder normalized to unit variance. An encoder whose first features are
    tens of units large saturates the LSTM's gates (the IMPALA encoder's orthogonal init did:
    RMS 32, a dead LSTM within 80k steps); its gates must start mostly unsaturated."""
    torch.manual_seed(0)
    model = ActorCritic((1, size, size), 6, encoder=encoder)
    frames = torch.randn(64, 1, size, size)
    with torch.no_grad():
        features = model.encoder(frames)
        gates = torch.nn.functional.linear(features, model.lstm.weight_ih_l0,
                                           model.lstm.bias_ih_l0 + model.lstm.bias_hh_l0)
    assert 0.05 < features.square().mean().sqrt() < 2.0
    assert (gates.abs() > 4).float().mean() < 0.01  # sigmoid' and tanh' below 0.02 there: no gradient through


@pytest.mark.parametrize("encoder, size", [("impala", 42), ("nature", 84)])
def test_a_deep_encoder_bounds_what_reaches_the_lstm_however_its_layers_grow(encoder, size):
    """Training grew the IMPALA stacks' gain until real frames gave features of RMS ~450 and the
    LSTM died, and the Nature CNN's ReLU features killed it too; here every layer's weights are
    tripled (a gain of ~3 per layer, 15 deep in IMPALA's, 4 in the Nature CNN)."""
    torch.manual_seed(0)
    model = ActorCritic((1, size, size), 6, encoder=encoder)
    with torch.no_grad():
        for layer in (m for m in model.encoder.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))):
            layer.weight.mul_(3.0)
        features = model.encoder(torch.randn(64, 1, size, size))
        gates = torch.nn.functional.linear(features, model.lstm.weight_ih_l0,
                                           model.lstm.bias_ih_l0 + model.lstm.bias_hh_l0)
    assert features.square().mean().sqrt() < 2.0
    assert (gates.abs() > 4).float().mean() < 0.01


def test_the_impala_encoder_is_its_paper_written_out():
    """Three stacks of conv, max-pool and two residual blocks, computed here with torch's
    functions from the module's weights, in the paper's order, then our LayerNorm."""
    torch.manual_seed(2)
    encoder = ActorCritic((1, 42, 42), 6, lstm_size=8, encoder="impala").encoder
    convs = [m for m in encoder.modules() if isinstance(m, torch.nn.Conv2d)]
    linear = next(m for m in encoder.modules() if isinstance(m, torch.nn.Linear))
    assert len(convs) == 15 and [c.out_channels for c in convs[::5]] == [16, 32, 32]
    x = torch.rand(3, 1, 42, 42)
    out = x
    for stack in range(3):
        conv, *blocks = convs[5 * stack: 5 * stack + 5]
        out = torch.nn.functional.conv2d(out, conv.weight, conv.bias, padding=1)
        out = torch.nn.functional.max_pool2d(out, 3, 2, 1)
        for first, second in (blocks[:2], blocks[2:]):
            inner = torch.nn.functional.conv2d(torch.relu(out), first.weight, first.bias, padding=1)
            out = out + torch.nn.functional.conv2d(torch.relu(inner), second.weight, second.bias, padding=1)
    expected = torch.relu(torch.nn.functional.linear(torch.relu(out).flatten(1), linear.weight, linear.bias))
    expected = torch.nn.functional.layer_norm(expected, (256,))  # ours: keeps the LSTM's gates unsaturated
    torch.testing.assert_close(encoder(x), expected, rtol=1e-5, atol=1e-6)


def test_the_nature_encoder_is_the_papers_network_before_an_mlp_core_and_normalized_before_an_lstm():
    """The feed-forward core runs the network as the PPO peers do; the LSTM gets a LayerNorm of
    the same 512 features."""
    torch.manual_seed(3)
    feed_forward = ActorCritic((4, 84, 84), 6, core="mlp", encoder="nature")
    recurrent = ActorCritic((4, 84, 84), 6, encoder="nature")
    assert not any(isinstance(m, torch.nn.LayerNorm) for m in feed_forward.encoder.modules())
    recurrent.encoder.load_state_dict(feed_forward.encoder.state_dict(), strict=False)
    x = torch.randn(3, 4, 84, 84)
    with torch.no_grad():
        expected = torch.nn.functional.layer_norm(feed_forward.encoder(x), (512,),
                                                  recurrent.encoder[-1].weight, recurrent.encoder[-1].bias)
        torch.testing.assert_close(recurrent.encoder(x), expected)


def test_the_nature_encoder_refuses_images_too_small_for_its_kernels():
    with pytest.raises(ValueError, match="at least 36x36"):
        ActorCritic((1, 30, 30), 6, encoder="nature")


@pytest.mark.parametrize("encoder", [ConvEncoder(1, 42), GridEncoder(3, 7, 7)], ids=["universe", "grid"])
def test_the_in_place_elus_give_the_gradients_of_plain_ones(encoder):
    # The reference: the same convs with out-of-place ELUs, whose backward reads the input.
    assert all(m.inplace for m in encoder if isinstance(m, torch.nn.ELU))
    frames = torch.randn(5, *((1, 42, 42) if isinstance(encoder, ConvEncoder) else (3, 7, 7)),
                         generator=torch.Generator().manual_seed(0))
    encoder(frames).square().sum().backward()
    in_place = [p.grad.clone() for p in encoder.parameters()]
    encoder.zero_grad()
    x = frames
    for conv in (m for m in encoder if isinstance(m, torch.nn.Conv2d)):
        x = torch.nn.functional.elu(conv(x))
    x.flatten(1).square().sum().backward()
    for got, expected in zip(in_place, (p.grad for p in encoder.parameters())):
        # float32's rounding apart: exp(x) = y + 1 is rounded once more than exp(x)
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6 * float(expected.abs().max()))
