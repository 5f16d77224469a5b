"""The acting backends: ONNX Runtime's step is torch's step, with the weights of every pull."""
import json

import numpy as np
import pandas as pd
import pytest
import torch

import tests.envs  # noqa: F401 - registers the test envs
from hogwild_a3c import train
from hogwild_a3c.acting import onnx_backend, onnx_graph
from hogwild_a3c.acting.actor import TorchActor, make_actor, request_problem, resolve
from hogwild_a3c.acting.onnx_backend import OnnxRuntimeActor, trial_difference, trial_steps
from hogwild_a3c.children.evaluator import play_episodes
from hogwild_a3c.children.reports import InProcessReports
from hogwild_a3c.children.shared import HogwildLink, SharedState
from hogwild_a3c.children.worker import Worker
from hogwild_a3c.config import Config
from hogwild_a3c.envs.make import describe_env, make_env
from hogwild_a3c.learning.model import build_model
from hogwild_a3c.learning.optim import LrSchedule
from hogwild_a3c.run.prepare import ConfigError, prepare


def conv_worker(act_backend="onnxruntime", learn_precision="float32", env="tests.envs:CueImage-v0", epochs=1):
    # CueImage-v0: an 8x8 RGB image (a conv encoder), episodes of 8 steps, so rollouts of 6 cross episode ends.
    # ALE/Pong-v5: 42x42 grey frames, universe's ConvEncoder: what the atari preset learns from.
    cfg = Config(env=env, num_workers=0, envs_per_worker=3, rollout_steps=6, lstm_size=16,
                 normalize_obs=True, act_backend=act_backend, learn_precision=learn_precision, epochs=epochs)
    info = describe_env(cfg.env, cfg.env_kwargs)
    torch.manual_seed(0)
    shared = SharedState.create(build_model(info.obs_shape, info.distribution, cfg, info.layout), 1, "adam",
                                LrSchedule(1e-3))
    return Worker(0, cfg, info, HogwildLink(shared, 0, InProcessReports()), seed=1), shared


def spy_on(actor):
    """Record the action parameters (logits) of every acting call."""
    calls = []
    original = actor.step

    def spy(obs, state, into=()):
        out = original(obs, state, into)
        calls.append(out[0].clone())
        return out

    actor.step = spy
    return calls


def test_the_actions_log_probabilities_are_torchs_after_every_pull():
    worker, shared = conv_worker()
    assert isinstance(worker.actor, OnnxRuntimeActor)
    calls = spy_on(worker.actor)
    generator = torch.Generator().manual_seed(1)
    restarts = 0
    for pull in range(4):
        with torch.no_grad():  # what the other workers' updates do to the shared weights meanwhile
            for p in shared.model.parameters():
                p.add_(torch.randn(p.shape, generator=generator) * 0.2)
            shared.model.obs_norm.mean.uniform_(0.0, 0.3, generator=generator)
        before = [p.detach().clone() for p in worker.model.parameters()]
        worker.link.pull(worker.model)
        assert any(not torch.equal(a, b) for a, b in zip(before, worker.model.parameters()))
        calls.clear()
        rollout = worker.collect()
        steps = worker.cfg.rollout_steps
        acted = torch.stack(calls[:steps])  # [T, K, A]; the calls after are bootstraps
        with torch.no_grad():  # torch's own forward, with the weights this pull brought
            logits, values = worker.model.replay(torch.from_numpy(rollout.obs), rollout.start_state,
                                                 torch.from_numpy(rollout.resets))
        actions = torch.from_numpy(rollout.actions).unsqueeze(-1)
        logp_onnx = torch.log_softmax(acted, -1).gather(-1, actions)
        logp_torch = torch.log_softmax(logits, -1).gather(-1, actions)
        assert float((logp_onnx - logp_torch).abs().max()) <= 1e-5, pull
        # the behaviour log-probabilities the rollout keeps are those of the actions taken
        assert np.abs(rollout.log_probs - logp_torch.squeeze(-1).numpy()).max() <= 1e-5
        assert np.abs(rollout.values - values.numpy()).max() <= 1e-5
        restarts += int(rollout.resets.any())
    assert restarts > 0  # the LSTM state was zeroed mid-rollout on some pulls, in acting and in replay


def test_acting_with_stale_weights_would_fail_the_check():
    """The check above can tell: without the refresh after a pull, the log-probabilities differ."""
    worker, shared = conv_worker()
    with torch.no_grad():
        for p in shared.model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    worker.link.pull(worker.model)
    worker.actor.refresh = lambda: None  # the bug: the session keeps the weights of the first build
    calls = spy_on(worker.actor)
    rollout = worker.collect()
    with torch.no_grad():
        logits, _ = worker.model.replay(torch.from_numpy(rollout.obs), rollout.start_state,
                                        torch.from_numpy(rollout.resets))
    acted = torch.stack(calls[:worker.cfg.rollout_steps])
    assert float((torch.log_softmax(acted, -1) - torch.log_softmax(logits, -1)).abs().max()) > 1e-3


@pytest.mark.parametrize("env", ["tests.envs:Image-v0", "tests.envs:CueImage-v0", "tests.envs:CueDict-v0",
                                 "CartPole-v1"])
def test_every_encoder_exports_and_agrees_with_torch(env):
    # conv, small grid, image + vector parts, and the MLP with an LSTM
    cfg = Config(env=env, lstm_size=24, normalize_obs=True)
    info = describe_env(cfg.env, cfg.env_kwargs)
    model = build_model(info.obs_shape, info.distribution, cfg, info.layout)
    assert trial_difference(model, batch=5) <= 1e-5


@pytest.mark.parametrize("encoder, size", [("nature", 84), ("impala", 42)])
def test_the_larger_frame_encoders_export_and_agree_with_torch(encoder, size):
    # These encoders reach the LSTM through many more float32 roundings (IMPALA's: 15 convs), in an order that
    # differs between oneDNN's kernels and ONNX Runtime's and with the CPU: on a Xeon with AMX the cell state
    # (|c| ~2.3) differed by 1.0e-5. So each output is held to 1e-5 of its own size (at least 1e-5); a wrong
    # export moves outputs by orders of magnitude more. The log-probabilities, which choose the actions, to 1e-5.
    torch.manual_seed(4)
    model = build_model((1, size, size), 6, Config(env="ALE/Pong-v5", lstm_size=24, encoder=encoder,
                                                   normalize_obs=True))
    expected, got = trial_steps(model, batch=5)
    for name, want, have in (("logits", expected[0], got[0]), ("value", expected[1], got[1]),
                             ("h", expected[2][0], got[2][0]), ("c", expected[2][1], got[2][1])):
        assert float((want - have).abs().max()) <= 1e-5 * max(1.0, float(want.abs().max())), name
    log_probs = torch.log_softmax(expected[0], -1), torch.log_softmax(got[0], -1)
    assert float((log_probs[0] - log_probs[1]).abs().max()) <= 1e-5


def test_the_evaluator_plays_the_same_episodes_through_either_backend():
    cfg = Config(env="tests.envs:CueDict-v0", lstm_size=16)
    info = describe_env(cfg.env, cfg.env_kwargs)
    torch.manual_seed(3)
    model = build_model(info.obs_shape, info.distribution, cfg, info.layout)
    results = []
    for actor in (TorchActor(model), OnnxRuntimeActor(model)):
        envs = [make_env(cfg.env) for _ in range(3)]
        for k, env in enumerate(envs):
            env.reset(seed=10 + k)
        results.append(play_episodes(model, envs, np.random.default_rng(5), 7, step=actor.step))
    assert results[0] == results[1] and len(results[0]) == 7


def test_auto_takes_onnxruntime_for_conv_models_and_torch_for_the_rest():
    conv = build_model((1, 42, 42), 6, Config(lstm_size=16))
    mlp = build_model((4,), 2, Config(lstm_size=16))
    assert resolve("auto", conv)[0] == "onnxruntime"
    assert resolve("auto", mlp) == ("torch", "acting in torch (--act-backend auto: the model has no conv encoder "
                                             "with an LSTM core, where ONNX Runtime gains)")
    assert resolve("torch", conv)[0] == "torch"
    assert isinstance(make_actor("auto", mlp), TorchActor)


def test_a_machine_without_onnxruntime_acts_in_torch_and_says_so(monkeypatch):
    monkeypatch.setattr(onnx_backend, "installed", lambda: False)
    conv = build_model((1, 42, 42), 6, Config(lstm_size=16))
    name, line = resolve("auto", conv)
    assert name == "torch" and "onnxruntime is not installed" in line and "hogwild-a3c[onnx]" in line
    problem = request_problem("onnxruntime", conv)
    assert problem is not None and problem.startswith("--act-backend onnxruntime: onnxruntime is not installed")


def test_a_step_that_fails_or_differs_falls_back_to_torch(monkeypatch):
    conv = build_model((1, 42, 42), 6, Config(lstm_size=16))
    monkeypatch.setattr(onnx_backend, "trial_difference", lambda model: 0.5)
    name, line = resolve("auto", conv)
    assert name == "torch" and "differs from torch's by 0.5" in line

    def broken(model):
        raise RuntimeError("no kernel for Elu")

    monkeypatch.setattr(onnx_backend, "trial_difference", broken)
    assert resolve("onnxruntime", conv) == ("torch", "acting in torch: ONNX Runtime could not run this model's step "
                                                     "(RuntimeError: no kernel for Elu)")


def test_asking_for_onnxruntime_where_it_cannot_act_is_one_line_before_anything_starts(tmp_path):
    with pytest.raises(ConfigError) as caught:
        prepare(["--env", "tests.envs:Image-v0", "--core", "mlp", "--act-backend", "onnxruntime",
                 "--run-dir", str(tmp_path / "run")])
    assert caught.value.errors == ["--act-backend onnxruntime: it acts for models with the lstm core only "
                                   "(--core lstm); use --act-backend torch or auto"]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("backend, line, precision", [("auto", "acting in onnxruntime", "bf16"),
                                                      ("torch", "acting in torch (--act-backend torch)", "float32")])
def test_a_real_run_acts_through_the_backend_in_its_workers_and_evaluator(tmp_path, backend, line, precision):
    """Two worker processes and the evaluator build their actors from the name the main process
    chose; an actor that failed to build or to step would stop the run with exit 1. The workers
    learn in the precision asked for (bf16 emulated where the CPU lacks it)."""
    run_dir = tmp_path / "run"
    code = train.main(["--env", "tests.envs:CueImage-v0", "--lstm-size", "16", "--num-workers", "2",
                       "--act-backend", backend, "--learn-precision", precision,
                       "--max-steps", "10000000", "--target-return", "-1",
                       "--eval-interval", "1", "--eval-episodes", "2", "--no-progress", "--run-dir", str(run_dir)])
    assert code == 0
    log = (run_dir / "train.log").read_text()
    assert line in log and f"learning with the encoder in {precision} (--learn-precision {precision}" in log
    assert len(pd.read_csv(run_dir / "episodes.csv")) > 0 and len(pd.read_csv(run_dir / "eval.csv")) >= 2
    assert json.loads((run_dir / "config.json").read_text())["act_backend"] == backend  # what was asked for


def test_every_parameter_reaches_the_optimized_graph_on_its_own():
    """Each parameter changed alone (the value head's one-element bias included) changes ONNX
    Runtime's step exactly as torch's: none was taken for a constant of the optimized graph."""
    cfg = Config(lstm_size=16, normalize_obs=True)
    model = build_model((1, 42, 42), 6, cfg)
    actor = OnnxRuntimeActor(model)
    generator = torch.Generator().manual_seed(2)
    obs = torch.rand(4, 1, 42, 42, generator=generator)
    state = (torch.randn(1, 4, 16, generator=generator), torch.randn(1, 4, 16, generator=generator))
    for name, param in model.named_parameters():
        with torch.no_grad():
            param.add_(0.2)
            expected = model.step(obs, state)
        stale = actor.step(obs, state)
        actor.refresh()
        got = actor.step(obs, state)
        for a, b in zip((expected[0], expected[1], *expected[2]), (got[0], got[1], *got[2])):
            assert float((a - b).abs().max()) <= 1e-5, name
        assert any(float((a - old).abs().max()) > 1e-6 for a, old in zip(expected[:2], stale[:2])), name
        with torch.no_grad():
            param.sub_(0.2)
        actor.refresh()


def test_elu_as_onnx_runtime_runs_it_is_torchs_elu():
    """The step graph's ELUs are rewritten as max(x, exp(min(x, 0)) - 1) for ONNX Runtime's vector
    kernels: the same numbers as torch's ELU, from -inf to inf; an ELU of another alpha, for which
    the identity does not hold, is left as it is."""
    import onnxruntime
    from onnx import TensorProto, helper

    values = helper.make_tensor_value_info
    graph = helper.make_model(
        helper.make_graph([helper.make_node("Elu", ["x"], ["y"], alpha=1.0),
                           helper.make_node("Elu", ["y"], ["z"], alpha=2.0)], "elus",
                          [values("x", TensorProto.FLOAT, [None])], [values("z", TensorProto.FLOAT, [None])]),
        opset_imports=[helper.make_opsetid("", 17)])
    onnx_graph.elu_from_exp(graph)
    assert [node.op_type for node in graph.graph.node] == ["Min", "Exp", "Sub", "Max", "Elu"]
    x = np.concatenate([np.linspace(-100, 100, 200_001), [0.0, -0.0, 1e-30, -1e-30, -1e-7, 88.0, 1e30, -1e30,
                                                         np.inf, -np.inf]]).astype(np.float32)
    session = onnxruntime.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(None, {"x": x})[0]
    expected = torch.nn.functional.elu(torch.nn.functional.elu(torch.from_numpy(x)), alpha=2.0).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=2e-7)


def test_the_step_graph_of_every_elu_encoder_has_no_elu_left():
    for env in ("tests.envs:Image-v0", "tests.envs:CueImage-v0", "CartPole-v1"):  # conv, small grid, MLP
        cfg = Config(env=env, lstm_size=16)
        info = describe_env(cfg.env, cfg.env_kwargs)
        graph = onnx_backend.export_step_graph(build_model(info.obs_shape, info.distribution, cfg, info.layout))
        assert "Elu" not in {node.op_type for node in graph.graph.node}, env


@pytest.mark.parametrize("also_out", [None, "a", "b"], ids=["none", "conv-output", "elu-output-handed-out"])
def test_elus_between_convs_work_in_the_blocked_layout_with_the_same_values(also_out):
    """Conv -> ELU -> conv, optimized for this CPU: the reorders around the ELU are dropped, and
    the values are those of the graph as exported. Where the conv's plain output is also read
    elsewhere (here: a graph output), the reorders stay. Where the ELU's output is one the caller
    keeps, it is handed out by a reorder of its own, channels-last, declared so."""
    import onnxruntime
    from onnx import helper, numpy_helper

    values = helper.make_tensor_value_info
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.normal(0, 0.3, (32, c, 3, 3)).astype(np.float32), f"w{i}")
               for i, c in enumerate((3, 32))]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Elu", ["a"], ["b"], alpha=1.0),
             helper.make_node("Conv", ["b", "w1"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2])]
    outputs = [values("y", 1, None)] + ([values(also_out, 1, [None, 32, 11, 11])] if also_out else [])
    exported = helper.make_model(helper.make_graph(nodes, "convs", [values("x", 1, [None, 3, 21, 21])], outputs,
                                                   weights), opset_imports=[helper.make_opsetid("", 17)])
    x = {"x": rng.normal(0, 1, (4, 3, 21, 21)).astype(np.float32)}
    options = onnx_graph.session_options("ORT_DISABLE_ALL")
    expected = onnxruntime.InferenceSession(exported.SerializeToString(), options,
                                            providers=["CPUExecutionProvider"]).run(None, x)
    onnx_graph.elu_from_exp(exported)
    graph = onnx_graph.optimized_for_this_cpu(exported)
    onnx_graph.elementwise_in_blocked_layout(graph, frozenset({"b"}))
    reorders = [node.op_type for node in graph.graph.node if node.op_type.startswith("Reorder")]
    assert (reorders.count("ReorderOutput"), reorders.count("ReorderInput")) == {None: (1, 0), "a": (2, 1),
                                                                                 "b": (2, 0)}[also_out]
    assert onnx_graph.channels_last_outputs(graph) == ({"b"} if also_out == "b" else set())
    got = onnxruntime.InferenceSession(graph.SerializeToString(), onnx_graph.session_options("ORT_DISABLE_ALL"),
                                       providers=["CPUExecutionProvider"]).run(None, x)
    if also_out == "b":
        declared = [dim.dim_value for dim in graph.graph.output[1].type.tensor_type.shape.dim]
        assert got[1].shape == (4, 11, 11, 32) and declared[1:] == [11, 11, 32]
        got[1] = got[1].transpose(0, 3, 1, 2)  # NHWC -> NCHW, to compare
    for want, have in zip(expected, got):
        np.testing.assert_allclose(have, want, rtol=1e-5, atol=1e-5)


def torch_elu_outputs(model, obs):
    """Each encoder ELU's output for `obs`, computed by torch."""
    outputs, x = [], model.normalized(obs)
    with torch.no_grad():
        for module in model.encoder.children():
            x = module(x)
            if isinstance(module, torch.nn.ELU):
                outputs.append(x.clone())
    return outputs


def test_a_workers_onnx_actor_keeps_the_encoders_activations_as_torch_computes_them():
    worker, _ = conv_worker(env="ALE/Pong-v5")
    assert worker.actor.keeps_activations
    # On an x86 CPU ONNX Runtime runs these convs blocked, and the ELUs between them are handed out channels-last.
    assert worker.actor.activations_nhwc == [True, True, True, False]
    for _ in range(2):  # the second rollout overwrites the first's arrays
        rollout = worker.collect()
        assert len(rollout.activations) == len(worker.actor.activations_nhwc) == 4
        for t in range(worker.cfg.rollout_steps):
            expected = torch_elu_outputs(worker.model, torch.from_numpy(rollout.obs[t]))
            for array, nhwc, want in zip(rollout.activations, worker.actor.activations_nhwc, expected):
                got = torch.from_numpy(array[t])
                torch.testing.assert_close(got.permute(0, 3, 1, 2) if nhwc else got, want, rtol=1e-5, atol=1e-5)
    # The evaluator's actor keeps none: its graph hands out nothing it would not read.
    evaluator_actor = make_actor("onnxruntime", worker.model)
    assert not evaluator_actor.keeps_activations and evaluator_actor._prepared.activations == []
    assert not make_actor("torch", worker.model, keep_activations=True).keeps_activations


@pytest.mark.parametrize("epochs", [1, 2])
def test_the_learn_step_takes_the_first_pass_from_the_kept_activations(monkeypatch, epochs):
    """The encoder is not run again, and the gradient is the replay's. With --epochs 2 every pass
    replays: the later passes pulled new weights, and their ratios are taken against the first
    pass's replay, which must be the same computation."""
    worker, _ = conv_worker(env="ALE/Pong-v5", epochs=epochs)
    assert worker.actor.keeps_activations == (epochs == 1)
    rollout = worker.collect()
    batch = torch.from_numpy(rollout.obs)

    def gradients(kept):
        worker.model.zero_grad()
        features = None if kept is None else features_from_activations(
            conv_elu_chain(worker.model.encoder), worker.model.normalized(batch.flatten(0, 1)), kept)
        logits, values = worker.model.replay(batch, rollout.start_state, torch.from_numpy(rollout.resets),
                                             features=features)
        (torch.log_softmax(logits, -1).sum() + values.square().sum()).backward()
        return [p.grad.clone() for p in worker.model.parameters()]

    from hogwild_a3c.learning.encoder_grad import KeptActivations, conv_elu_chain, features_from_activations

    if epochs == 1:
        expected = gradients(None)
        got = gradients(KeptActivations.of_rollout(rollout.activations, worker.actor.activations_nhwc, torch.float32))
        for g, e in zip(got, expected):
            torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5 * float(e.abs().max()))
    else:
        assert rollout.activations == []  # acting wrote nothing no pass would read

    encoder_runs = []
    original = type(worker.model.encoder).forward
    monkeypatch.setattr(type(worker.model.encoder), "forward",
                        lambda self, x: encoder_runs.append(len(x)) or original(self, x))
    assert worker.learner.learn(rollout)
    assert encoder_runs == ([] if epochs == 1 else [batch.shape[0] * batch.shape[1]] * epochs)


@pytest.mark.parametrize("precision", ["float32", "bf16"])
def test_a_workers_learn_step_takes_the_gradient_of_a_float32_replay(precision):
    """Through the worker's learner as a run calls it: the gradient from kept activations against the
    float32 replay's, equal in float32, and within bf16's rounding (but not equal) in bf16."""
    import dataclasses
    from contextlib import suppress

    from hogwild_a3c.learning.precision import encoder_context, learn_dtype

    worker, _ = conv_worker(env="ALE/Pong-v5", learn_precision=precision)
    rollout = worker.collect()

    class Taken(Exception):
        pass

    def gradient(seen):
        grads = []

        def grab(phase):
            if phase == "backward":
                grads.append(torch.cat([p.grad.flatten() for p in worker.learner.params]))
                raise Taken  # before the optimizer step, which would move the shared weights

        with suppress(Taken):
            worker.learner.learn(seen, phase_done=grab)
        return grads[0].double()

    got = gradient(rollout)
    worker.learner.encoder_context, worker.learner.learn_dtype = encoder_context("float32"), learn_dtype("float32")
    expected = gradient(dataclasses.replace(rollout, activations=[]))
    distance = float((got - expected).norm() / expected.norm())
    if precision == "float32":
        assert distance < 1e-5
    else:
        assert 1e-7 < distance < 0.02  # bf16 was used, and it stays near float32's gradient
        assert torch.nn.functional.cosine_similarity(got, expected, dim=0) > 0.999
