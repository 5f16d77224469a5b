"""`make bench-act-backend`: the acting forward (`ActorCritic.step`, the atari preset's model on
1x42x42 frames) in each runtime that could run it, one thread, at the batch sizes the presets act
with (1: universe, 8: atari and the evaluator) and at 80 (a whole atari rollout), with the cost of
taking fresh weights after a pull. Hogwild acts with the weights pulled at each rollout's start,
so a runtime that bakes the weights in pays a rebuild per rollout; the figure that decides is the
cost of one atari rollout: one refresh + (rollout_steps + 1) forwards at its batch.

Backends measured, interleaved repeat by repeat so that a busy minute hits them all alike:

- torch: the model's own `step` (eager), which reads the weights live;
- torch-compile: `torch.compile(model.step)` (inductor's C++ on CPU), weights read live;
- torch-freeze: `torch.jit.trace`, `torch.jit.freeze`, `optimize_for_inference` (weights baked);
- torch-onednn: the same frozen graph with oneDNN graph fusion on (`torch.jit.enable_onednn_fusion`);
- onnxruntime (what `--act-backend onnxruntime` runs in the evaluator): the step as an ONNX graph,
  optimized once for this CPU, its weights gathered into the optimized layout at each refresh and
  fed as inputs (`acting.onnx_backend.PreparedStep`);
- onnxruntime-rebuild: the weights baked in as initializers, the session rebuilt per refresh;
- onnxruntime-inputs: the exported graph with the weights as plain inputs, fed every call;
- openvino: the ONNX graph read and compiled by OpenVINO on its CPU plugin, one inference
  thread, recompiled per refresh; openvino-inputs: weights as plain inputs, fed every call.

Each backend's outputs are checked against torch's (largest absolute difference of logits,
value and state) after a weight change; a backend that cannot be installed or run keeps its row
with the error. Writes experiments/results/act-backend/<date>-<name>.md.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path

from benchlib import header, markdown_table, write_dated_result


def measure(call: Callable[[], object], seconds: float) -> float:
    """Median ms of one call, over blocks of calls filling `seconds`."""
    call()
    per_block, start = 0, time.perf_counter()
    while time.perf_counter() - start < 0.05:
        call()
        per_block += 1
    blocks = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        for _ in range(per_block):
            call()
        blocks.append((time.perf_counter() - t0) / per_block * 1e3)
    return statistics.median(blocks)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 80])
    parser.add_argument("--seconds", type=float, default=0.6, help="measuring time per backend, batch and repeat")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--backends", nargs="+", default=list(BUILDERS))
    parser.add_argument("--name", default="act-backend", help="results file: <date>-<name>.md")
    args = parser.parse_args()
    unknown = sorted(set(args.backends) - set(BUILDERS))
    if unknown:
        parser.error(f"--backends: {', '.join(unknown)} unknown; choose from {', '.join(BUILDERS)}")

    from hogwild_a3c.children.process import one_thread_per_child

    one_thread_per_child()
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    torch.set_num_threads(1)
    from hogwild_a3c.acting.onnx_backend import step_difference
    from hogwild_a3c.config import Config
    from hogwild_a3c.learning.model import build_model
    from hogwild_a3c.run.presets import load_preset

    cfg = Config(**load_preset("atari")[0])
    torch.manual_seed(0)
    model = build_model((1, 42, 42), 6, cfg)
    model.eval()
    rollout_batch, rollout_steps = cfg.envs_per_worker, cfg.rollout_steps

    def inputs(batch: int, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        return (torch.rand(batch, 1, 42, 42, generator=g), (torch.randn(1, batch, cfg.lstm_size, generator=g),
                                                           torch.randn(1, batch, cfg.lstm_size, generator=g)))

    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model.step(*inputs(1))
    flops_per_sample = counter.get_total_flops()

    def pull():
        """What a pull does to the local weights: other workers' updates arrive."""
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.01)
            if model.obs_norm is not None:
                model.obs_norm.mean.uniform_(0.0, 0.3)
                model.obs_norm.var.uniform_(0.5, 1.5)

    rows, built, errors = {}, {}, {}
    for name in args.backends:
        try:
            t0 = time.perf_counter()
            backend = BUILDERS[name](model, cfg)
            first_build = (time.perf_counter() - t0) * 1e3
            for batch in args.batches:  # a first call per shape: compilers specialize on it
                backend.step(*inputs(batch))
            pull()
            backend.refresh()
            obs, state = inputs(3, seed=7)
            with torch.no_grad():
                expected = model.step(obs, state)
            difference = step_difference(expected, backend.step(obs, state))
            built[name] = backend
            rows[name] = {"backend": name, "first build ms": first_build, "max |diff| vs torch": difference,
                          "version": backend.version, "samples": {}}
        except Exception as exc:  # noqa: BLE001 - a backend that fails keeps its row, with the error
            errors[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            traceback.print_exc()

    for repeat in range(args.repeats):
        for name, backend in built.items():
            samples = rows[name]["samples"]
            samples.setdefault("refresh", []).append(measure(backend.refresh, args.seconds / 2)
                                                      if backend.refreshes else 0.0)
            for batch in args.batches:
                obs, state = inputs(batch, seed=repeat)
                samples.setdefault(batch, []).append(measure(partial(backend.step, obs, state), args.seconds))
        print(f"repeat {repeat + 1}/{args.repeats} done", flush=True)

    table = []
    for row in rows.values():
        samples = row.pop("samples")
        row["refresh ms"] = statistics.median(samples["refresh"])
        for batch in args.batches:
            ms = statistics.median(samples[batch])
            row[f"ms at {batch}"] = ms
            row[f"GFLOP/s at {batch}"] = flops_per_sample * batch / ms / 1e6
        if rollout_batch in args.batches:
            row["ms per atari rollout"] = row["refresh ms"] + (rollout_steps + 1) * row[f"ms at {rollout_batch}"]
        table.append(row)
    key = "ms per atari rollout" if rollout_batch in args.batches else f"ms at {args.batches[0]}"
    table.sort(key=lambda r: r[key])
    columns = ["backend", "version", "first build ms", "refresh ms"] + [f"ms at {b}" for b in args.batches]
    columns += [c for c in ["ms per atari rollout"] if rollout_batch in args.batches]
    columns += [f"GFLOP/s at {b}" for b in args.batches] + ["max |diff| vs torch"]
    for row in table:
        row["max |diff| vs torch"] = f"{row['max |diff| vs torch']:.1e}"
    command = "make bench-act-backend" + (f" ARGS='{' '.join(sys.argv[1:])}'" if sys.argv[1:] else "")
    text = header("The acting forward in each runtime, one thread", command, {
        "model": f"the atari preset's (4 convs, LSTM {cfg.lstm_size}, frames normalized), "
                 f"{flops_per_sample / 1e6:.2f} MFLOP a sample (torch's flop counter)",
        "per cell": f"median over {args.repeats} interleaved repeats of the median ms of one call "
                    f"({args.seconds} s of calls each); refresh: taking new weights after a pull",
        "atari rollout": f"one refresh + {rollout_steps + 1} forwards at batch {rollout_batch} "
                         f"({rollout_steps} steps and the bootstrap)",
    })
    text += "\n" + markdown_table(table, columns)
    if errors:
        text += "\nBackends that did not run here:\n\n" + "".join(f"- {n}: `{e}`\n" for n, e in errors.items())
    write_dated_result("act-backend", args.name, text)


class TorchEager:
    version = ""
    refreshes = False

    def __init__(self, model, cfg):
        import torch

        self.model, self.version = model, torch.__version__

    def refresh(self):
        pass

    def step(self, obs, state):
        import torch

        with torch.no_grad():
            return self.model.step(obs, state)


class TorchCompile(TorchEager):
    def __init__(self, model, cfg):
        import torch

        super().__init__(model, cfg)
        self.compiled = torch.compile(model.step, dynamic=False)

    def step(self, obs, state):
        import torch

        with torch.no_grad():
            return self.compiled(obs, state)


class TorchFreeze:
    refreshes = True
    onednn = False

    def __init__(self, model, cfg):
        import torch

        self.model, self.version = model, torch.__version__
        self.refresh()

    def refresh(self):
        import torch

        from hogwild_a3c.acting.onnx_backend import _StepGraph

        torch.jit.enable_onednn_fusion(self.onednn)
        example = (torch.zeros(8, *self.model.obs_shape), torch.zeros(1, 8, self.model.lstm_size),
                   torch.zeros(1, 8, self.model.lstm_size))
        with torch.no_grad():
            traced = torch.jit.trace(_StepGraph(self.model).eval(), example, check_trace=False)
            self.graph = torch.jit.optimize_for_inference(torch.jit.freeze(traced))

    def step(self, obs, state):
        import torch

        with torch.no_grad():
            logits, value, h, c = self.graph(obs, state[0], state[1])
        return logits, value, (h, c)


class TorchOneDnn(TorchFreeze):
    onednn = True


class OnnxRuntimePrepared:
    """What `--act-backend onnxruntime` runs: acting.onnx_backend.OnnxRuntimeActor (optimized once, the weights
    gathered into its layout at each refresh and fed as inputs)."""
    refreshes = True

    def __init__(self, model, cfg):
        import onnxruntime

        from hogwild_a3c.acting.onnx_backend import OnnxRuntimeActor

        self.actor, self.version = OnnxRuntimeActor(model), onnxruntime.__version__
        self.refresh, self.step = self.actor.refresh, self.actor.step


class _Exported:
    """The exported step graph with the model's weights either baked in as initializers (written at
    each refresh) or fed as inputs (copied into C order at each refresh); the observation
    statistics are inputs either way."""
    refreshes = True
    baked = True

    def _export(self, model):
        from hogwild_a3c.acting.onnx_backend import _statistics, export_step_graph
        from hogwild_a3c.acting.onnx_graph import initializers_to_inputs

        self.model, self.graph = model, export_step_graph(model)
        self.params = dict(model.named_parameters())
        if not self.baked:
            initializers_to_inputs(self.graph, set(self.params))
        self.statistics = _statistics(model)

    def _take_weights(self):
        import numpy as np

        fed = dict(self.statistics) if self.baked else {**self.params, **self.statistics}
        self.weights = {n: np.ascontiguousarray(t.detach().numpy()) for n, t in fed.items()}
        if self.baked:
            for init in self.graph.graph.initializer:
                if init.name in self.params:
                    init.raw_data = self.params[init.name].detach().numpy().tobytes()

    def _outputs(self, values):
        import torch

        return torch.from_numpy(values[0]), torch.from_numpy(values[1]), (
            torch.from_numpy(values[2]), torch.from_numpy(values[3]))

    def _feeds(self, obs, state):
        return {"obs": obs.numpy(), "h": state[0].numpy(), "c": state[1].numpy(), **self.weights}


class OnnxRuntimeRebuilt(_Exported):
    """Weights baked, the session (and its layout rewrites) rebuilt at every refresh."""

    def __init__(self, model, cfg):
        import onnxruntime

        self.version = onnxruntime.__version__
        self._export(model)
        self.refresh()

    def refresh(self):
        import onnxruntime

        from hogwild_a3c.acting.onnx_graph import session_options

        self._take_weights()
        self.session = onnxruntime.InferenceSession(self.graph.SerializeToString(), session_options("ORT_ENABLE_ALL"),
                                                    providers=["CPUExecutionProvider"])

    def step(self, obs, state):
        return self._outputs(self.session.run(None, self._feeds(obs, state)))


class OnnxRuntimeInputs(OnnxRuntimeRebuilt):
    """Weights as plain inputs of the exported graph, one session for good."""
    baked = False

    def __init__(self, model, cfg):
        super().__init__(model, cfg)
        self.refresh = self._take_weights


class OpenVinoRecompiled(_Exported):
    """The exported graph compiled by OpenVINO's CPU plugin, one inference thread, weights baked
    and the model recompiled at every refresh."""

    def __init__(self, model, cfg):
        import openvino

        self.core, self.version = openvino.Core(), openvino.__version__
        self.dir = Path(tempfile.mkdtemp())
        self._export(model)
        self.refresh()

    def refresh(self):
        self._take_weights()
        path = self.dir / "step.onnx"
        path.write_bytes(self.graph.SerializeToString())
        self.compiled = self.core.compile_model(str(path), "CPU", {"INFERENCE_NUM_THREADS": 1,
                                                                    "PERFORMANCE_HINT": "LATENCY",
                                                                    "INFERENCE_PRECISION_HINT": "f32"})
        self.request = self.compiled.create_infer_request()

    def step(self, obs, state):
        out = self.request.infer(self._feeds(obs, state))
        return self._outputs([out[self.compiled.output(k)].copy() for k in range(4)])


class OpenVinoInputs(OpenVinoRecompiled):
    baked = False

    def __init__(self, model, cfg):
        super().__init__(model, cfg)
        self.refresh = self._take_weights


BUILDERS = {
    "torch": TorchEager, "torch-compile": TorchCompile, "torch-freeze": TorchFreeze, "torch-onednn": TorchOneDnn,
    "onnxruntime": OnnxRuntimePrepared, "onnxruntime-rebuild": OnnxRuntimeRebuilt,
    "onnxruntime-inputs": OnnxRuntimeInputs, "openvino": OpenVinoRecompiled, "openvino-inputs": OpenVinoInputs,
}

if __name__ == "__main__":
    main()
