"""The learn step's encoder gradient from acting's kept activations, against autograd's through
the encoder itself (the slow reference: a forward with autograd, then its backward)."""
import pytest
import torch

from hogwild_a3c.config import Config
from hogwild_a3c.learning.encoder_grad import KeptActivations, conv_elu_chain, features_from_activations
from hogwild_a3c.learning.encoders import ConvEncoder, GridEncoder, ImpalaEncoder, NatureEncoder
from hogwild_a3c.learning.learner import A3CLearner
from hogwild_a3c.learning.model import ActorCritic, build_model


def elu_outputs(encoder, frames):
    """Each ELU's output, as acting computes them (no autograd)."""
    outputs, x = [], frames
    with torch.no_grad():
        for conv in conv_elu_chain(encoder):
            x = torch.nn.functional.elu(conv(x))
            outputs.append(x.clone())
    return outputs


def kept_of(encoder, frames, dtype, steps=1, nhwc=False):
    """What acting keeps of `frames` taken as `steps` steps of a batch: arrays [T, B, ...], NCHW or
    NHWC as the graph hands them out, read in the learn precision."""
    per_step = [elu_outputs(encoder, chunk) for chunk in frames.chunk(steps)]
    arrays = [torch.stack([kept[layer] for kept in per_step]).numpy() for layer in range(len(per_step[0]))]
    if nhwc:
        arrays = [array.transpose(0, 1, 3, 4, 2).copy() for array in arrays]
    return KeptActivations.of_rollout(arrays, [nhwc] * len(arrays), dtype)


def relative_l2(got, expected):
    return float((got - expected).norm() / expected.norm())


@pytest.mark.parametrize("nhwc", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("encoder", [ConvEncoder(1, 42), GridEncoder(3, 7, 7)], ids=["universe", "grid"])
def test_the_gradients_from_kept_activations_are_autograds_through_the_encoder(encoder, nhwc):
    encoder = encoder.to(memory_format=torch.channels_last)
    encoder.zero_grad(set_to_none=True)  # the parametrized encoder is shared by the layouts' runs
    shape = (1, 42, 42) if isinstance(encoder, ConvEncoder) else (3, 7, 7)
    generator = torch.Generator().manual_seed(0)
    frames = torch.randn(6, *shape, generator=generator)
    head = torch.randn(encoder.out_features, generator=generator)

    (encoder(frames) @ head).square().sum().backward()
    expected = [p.grad.clone() for p in encoder.parameters()]
    encoder.zero_grad()

    kept = kept_of(encoder, frames, torch.float32, 3, nhwc)
    features = features_from_activations(conv_elu_chain(encoder), frames, kept)
    torch.testing.assert_close(features, encoder(frames).detach())
    (features @ head).square().sum().backward()
    for got, want in zip((p.grad for p in encoder.parameters()), expected):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6 * float(want.abs().max()))


def test_in_bf16_the_gradients_are_those_of_the_bf16_autocast_replay():
    # The reference of the bf16 path is what the learn step computed before: the encoder's
    # forward and backward under bf16 autocast. Both are compared with float32's gradient.
    encoder = ConvEncoder(1, 42).to(memory_format=torch.channels_last)
    generator = torch.Generator().manual_seed(1)
    frames = torch.rand(40, 1, 42, 42, generator=generator)
    head = torch.randn(encoder.out_features, generator=generator)

    def gradients(features):
        encoder.zero_grad()
        (features.float() @ head).square().sum().backward()
        return torch.cat([p.grad.flatten() for p in encoder.parameters()])

    float32 = gradients(encoder(frames))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast = gradients(encoder(frames))
    kept = gradients(features_from_activations(conv_elu_chain(encoder), frames,
                                               kept_of(encoder, frames, torch.bfloat16, 5)))
    assert relative_l2(autocast, float32) < 0.05  # the yardstick: bf16's own distance
    assert relative_l2(kept, float32) <= 1.5 * relative_l2(autocast, float32)
    assert torch.nn.functional.cosine_similarity(kept, float32, dim=0) > 0.999


def test_a_replay_from_kept_activations_takes_the_gradient_of_a_full_replay():
    torch.manual_seed(0)
    model = build_model((1, 42, 42), 6, 64)
    obs = torch.rand(5, 3, 1, 42, 42)
    resets = torch.zeros(5, 3, dtype=torch.bool)
    resets[2, 1] = True
    state = (torch.randn(1, 3, 64), torch.randn(1, 3, 64))

    def gradients(kept=None):
        model.zero_grad()
        features = None if kept is None else features_from_activations(
            conv_elu_chain(model.encoder), model.normalized(obs.flatten(0, 1)), kept)
        logits, values = model.replay(obs, state, resets, features=features)
        (logits.square().sum() + values.square().sum()).backward()
        return logits.detach(), [p.grad.clone() for p in model.parameters()]

    expected_logits, expected = gradients()
    kept = kept_of(model.encoder, model.normalized(obs.flatten(0, 1)), torch.float32, 5)
    logits, got = gradients(kept)
    torch.testing.assert_close(logits, expected_logits)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-6 * float(e.abs().max()))


@pytest.mark.parametrize("name, encoder", [("nature", NatureEncoder(1, 84)), ("impala", ImpalaEncoder(1, 42))],
                         ids=["nature", "impala"])
def test_encoders_that_are_not_a_conv_elu_chain_are_replayed(name, encoder):
    assert conv_elu_chain(encoder) is None
    model = ActorCritic((1, 42, 42), 4, 32, encoder=name)
    assert conv_elu_chain(model.encoder) is None
    # so its learner asks the actor for nothing, and replays the encoder
    assert not A3CLearner(model, link=None, cfg=Config(lstm_size=32, encoder=name)).reads_activations
    assert A3CLearner(ActorCritic((1, 42, 42), 4, 32), link=None, cfg=Config(lstm_size=32)).reads_activations
    assert not A3CLearner(ActorCritic((1, 42, 42), 4, 32), link=None, cfg=Config(epochs=2)).reads_activations
