"""--learn-precision: the learn step's encoder in bf16 gives float32's gradients to bf16's rounding,
with everything after the encoder in float32, and `auto` picks it only where it pays."""
import pytest
import torch

from hogwild_a3c.config import Config
from hogwild_a3c.learning import precision
from hogwild_a3c.learning.model import build_model
from hogwild_a3c.learning.precision import encoder_context, resolve


def gradients(model, obs, state, resets, context):
    for p in model.parameters():
        p.grad = None
    logits, values = model.replay(obs, state, resets, context)
    # A loss that reaches every head and every step, as the A3C loss does.
    (torch.log_softmax(logits, -1)[..., 0].sum() + values.square().sum()).backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def test_the_bf16_encoder_gives_float32s_gradient_to_bf16s_rounding():
    torch.manual_seed(0)
    model = build_model((1, 42, 42), 6, Config(lstm_size=32))
    obs = torch.rand(10, 4, 1, 42, 42)
    state = (torch.randn(1, 4, 32) * 0.1, torch.randn(1, 4, 32) * 0.1)
    resets = torch.zeros(10, 4, dtype=torch.bool)
    resets[6, 1] = True  # a stretch boundary: the LSTM runs twice, on float32 features both times
    exact = gradients(model, obs, state, resets, encoder_context("float32"))
    dtypes = {}
    hooks = [model.encoder[0].register_forward_hook(lambda m, i, o: dtypes.__setitem__("conv", o.dtype)),
             model.lstm.register_forward_pre_hook(lambda m, i: dtypes.__setitem__("lstm", i[0].dtype))]
    rounded = gradients(model, obs, state, resets, encoder_context("bf16"))
    for hook in hooks:
        hook.remove()
    assert dtypes == {"conv": torch.bfloat16, "lstm": torch.float32}
    distance = float((rounded - exact).norm() / exact.norm())
    cosine = float(torch.nn.functional.cosine_similarity(rounded, exact, dim=0))
    # bf16 keeps 8 bits of mantissa (relative rounding 2^-9 ~ 0.2%): the gradient moves by about that.
    assert 1e-5 < distance < 0.05 and cosine > 0.999, (distance, cosine)
    for p in model.parameters():
        assert p.dtype == torch.float32 and p.grad.dtype == torch.float32


def test_auto_picks_bf16_only_for_a_conv_encoder_on_a_cpu_with_native_bf16(monkeypatch):
    conv = build_model((1, 42, 42), 6, Config(lstm_size=16))
    mlp = build_model((4,), 2, Config(lstm_size=16))
    monkeypatch.setattr(precision, "native_bf16", lambda: True)
    assert resolve("auto", conv)[0] == "bf16"
    assert resolve("auto", mlp) == ("float32", "learning in float32 (--learn-precision auto: no conv encoder, "
                                               "where bf16 gains)")
    monkeypatch.setattr(precision, "native_bf16", lambda: False)
    assert resolve("auto", conv) == ("float32", "learning in float32 (--learn-precision auto: this CPU has no "
                                                "AVX-512 BF16 or AMX)")
    name, line = resolve("bf16", mlp)  # asked for by name: granted, and train.log says what it costs here
    assert name == "bf16" and "emulated and slower than float32" in line
    assert resolve("float32", conv) == ("float32", "learning with the encoder in float32 (--learn-precision float32)")


@pytest.mark.parametrize("requested", ["float32", "bf16"])
def test_a_worker_learns_in_either_precision(requested):
    from tests.test_acting import conv_worker

    worker, shared = conv_worker(act_backend="torch", learn_precision=requested)
    before = [p.detach().clone() for p in shared.model.parameters()]
    for _ in range(3):
        worker.link.pull(worker.model)
        assert worker.learner.learn(worker.collect())  # False: skipped as non-finite
    moved = [float((p.detach() - b).abs().max()) for p, b in zip(shared.model.parameters(), before)]
    assert all(torch.isfinite(p).all() for p in shared.model.parameters())
    assert max(moved) > 0
