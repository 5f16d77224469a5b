"""The acting forward in ONNX Runtime (`--act-backend onnxruntime`): the model's acting step as an
ONNX graph, whose optimizer puts the convs in its blocked (NCHWc) layout and fuses what torch runs
op by op. The one module that knows about ONNX; `actor` is the seam the rest of the trainer sees.

A worker acts with the weights it pulled at the start of its rollout, so the graph must take fresh
weights at every refresh, cheaply. Three ways were measured (results README, "The acting forward
in a compiled runtime"): weights baked in and the session rebuilt (a fast forward, a refresh
dearer than a rollout), weights as plain graph inputs (no rebuild, but the optimizer cannot
reorder filters it does not know: torch's speed), and what runs here (`PreparedStep`): the graph
optimized once, the optimized graph's weight-holding initializers made inputs, and a refresh
gathering the model's weights into that layout.
"""
from __future__ import annotations

import copy
import importlib.util
import io
import os
import tempfile
import warnings
from typing import Any

import numpy as np
import torch

from ..learning.model import ActorCritic, State

STEP_OUTPUTS = ["action_params", "value", "h_next", "c_next"]


def installed() -> bool:
    return all(importlib.util.find_spec(name) is not None for name in ("onnxruntime", "onnx"))


def version() -> str:
    import onnxruntime

    return f"onnxruntime {onnxruntime.__version__}"


def unsupported(model: ActorCritic) -> str | None:
    """Why this backend cannot act for this model, or None."""
    if model.lstm is None:
        return "it acts for models with the lstm core only (--core lstm)"
    if model.value_encoder is not None:
        return "it does not take a separate value network (--value-net shared)"
    return None


class _StepGraph(torch.nn.Module):
    """`ActorCritic.step` with the state as two tensors, which is what the exporter traces."""

    def __init__(self, model: ActorCritic):
        super().__init__()
        self.model = model

    def forward(self, obs: torch.Tensor, h: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, ...]:
        action_params, value, (h_next, c_next) = self.model.step(obs, (h, c))
        return action_params, value, h_next, c_next


def _weights_feeding(model: ActorCritic) -> dict[str, torch.Tensor]:
    """The tensors the step graph reads, by state-dict name: every parameter and the observation
    statistics. The return statistics and the sample count are not used by `step`."""
    wanted: dict[str, torch.Tensor] = dict(model.named_parameters())
    wanted.update(_statistics(model))
    return wanted


def _statistics(model: ActorCritic) -> dict[str, torch.Tensor]:
    """The observation statistics `step` reads. They are graph inputs, not initializers: the
    optimizer would fold `rsqrt(var + eps)` into a constant no refresh could rewrite."""
    if model.obs_norm is None:
        return {}
    return {"obs_norm.mean": model.obs_norm.mean, "obs_norm.var": model.obs_norm.var}


def export_step_graph(model: ActorCritic) -> Any:
    """The acting step as an ONNX ModelProto with a dynamic batch: inputs obs, h, c and the
    observation statistics (by state-dict name), the parameters as initializers named as the
    state dict, outputs `STEP_OUTPUTS`. Exported from a copy
    whose weights are all distinct random numbers: the exporter merges initializers of equal
    contents (the zero biases of a fresh model), and a merged one could not be told apart by name."""
    import onnx

    twin = copy.deepcopy(model).to(memory_format=torch.contiguous_format)  # type: ignore[call-overload]
    with torch.no_grad():
        for tensor in _weights_feeding(twin).values():
            tensor.uniform_(0.5, 1.5)
    batch = 2
    example = (torch.zeros(batch, *model.obs_shape), torch.zeros(1, batch, model.lstm_size),
               torch.zeros(1, batch, model.lstm_size))
    buffer = io.BytesIO()
    with warnings.catch_warnings():  # the TorchScript exporter's deprecation notice, once per process
        warnings.simplefilter("ignore")
        torch.onnx.export(
            _StepGraph(twin), example, buffer,  # type: ignore[arg-type]  # a file object is taken too
            input_names=["obs", "h", "c"],
            output_names=STEP_OUTPUTS, dynamo=False, do_constant_folding=False,
            dynamic_axes={"obs": {0: "batch"}, "h": {1: "batch"}, "c": {1: "batch"},
                          **{name: {1 if name in ("h_next", "c_next") else 0: "batch"} for name in STEP_OUTPUTS}},
        )
    graph = onnx.load_from_string(buffer.getvalue())
    for init in graph.graph.initializer:
        init.name = init.name.removeprefix("model.")
    for node in graph.graph.node:
        node.input[:] = [name.removeprefix("model.") for name in node.input]
    missing = sorted(set(_weights_feeding(model)) - {init.name for init in graph.graph.initializer})
    if missing:
        raise RuntimeError(f"the exported step graph does not read {', '.join(missing)} by name")
    _initializers_to_inputs(graph, set(_statistics(model)))
    elu_from_exp(graph)
    return graph


def elu_from_exp(graph: Any) -> None:
    """Rewrite each ELU (alpha 1) of `graph` as max(x, exp(min(x, 0)) - 1), in place.

    Why: ONNX Runtime's Elu kernel is scalar code, the atari model's largest op (results README,
    "The ELUs, made cheap where they were dear"), while its Exp, Min, Max and Sub are vectorized.
    The identity holds because e^x - 1 >= x for every x, with equality at 0 only;
    exp(x) - 1 differs from torch's expm1 by at most float32's spacing near 1 (6e-8), well
    inside the 1e-5 the acting backend is held to."""
    from onnx import helper, numpy_helper

    rewritten = []
    for node in graph.graph.node:
        alpha = next((attr.f for attr in node.attribute if attr.name == "alpha"), 1.0)
        if node.op_type != "Elu" or node.domain not in ("", "ai.onnx") or alpha != 1.0:
            rewritten.append(node)
            continue
        x, y, name = node.input[0], node.output[0], node.name or node.output[0]
        rewritten += [helper.make_node("Min", [x, "elu_zero"], [f"{name}/negative"]),
                      helper.make_node("Exp", [f"{name}/negative"], [f"{name}/exp"]),
                      helper.make_node("Sub", [f"{name}/exp", "elu_one"], [f"{name}/expm1"]),
                      helper.make_node("Max", [x, f"{name}/expm1"], [y])]
    if len(rewritten) == len(graph.graph.node):
        return
    graph.graph.initializer.extend([numpy_helper.from_array(np.array(0.0, np.float32), "elu_zero"),
                                    numpy_helper.from_array(np.array(1.0, np.float32), "elu_one")])
    del graph.graph.node[:]
    graph.graph.node.extend(rewritten)


def _initializers_to_inputs(graph: Any, names: set[str]) -> None:
    """Make the initializers named in `names` inputs of the graph, fed at every run."""
    import onnx

    kept = [init for init in graph.graph.initializer if init.name not in names]
    for init in graph.graph.initializer:
        if init.name in names:
            graph.graph.input.append(onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    del graph.graph.initializer[:]
    graph.graph.initializer.extend(kept)


def _session_options(level: str) -> Any:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    # Each process acts on one core, as torch does with set_num_threads(1).
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = getattr(onnxruntime.GraphOptimizationLevel, level)
    options.log_severity_level = 3  # its notice that an optimized graph suits this CPU only: it never leaves it
    return options


def _optimized(graph: Any) -> Any:
    """The graph as ONNX Runtime rewrites it for this CPU with every optimization on: convs in its
    blocked (NCHWc) layout with their weights reordered, ops fused."""
    import onnx
    import onnxruntime

    with tempfile.TemporaryDirectory() as folder:
        options = _session_options("ORT_ENABLE_ALL")
        options.optimized_model_filepath = os.path.join(folder, "step.onnx")
        onnxruntime.InferenceSession(graph.SerializeToString(), options, providers=["CPUExecutionProvider"])
        return onnx.load(options.optimized_model_filepath)


_LAYOUT_FREE_OPS = {"Min", "Exp", "Sub", "Max"}  # what elu_from_exp writes: each value on its own


def _elementwise_in_blocked_layout(graph: Any) -> None:
    """Drop, in an optimized graph, each pair of reorders that takes a conv's output out of ONNX
    Runtime's blocked (NCHWc) layout only to feed ops that compute every value on its own (an ELU
    written by `elu_from_exp`) and then puts the result back into it for the next conv. Such ops
    give the same values in any memory order, so they can work on the blocked tensor itself.
    Why: the optimizer keeps in the blocked layout only the ops it knows (Relu, Add, ...), and the
    reorders it adds around each ELU were a measurable part of the atari model's forward. In place."""
    nodes = list(graph.graph.node)
    producer = {name: node for node in nodes for name in node.output}
    consumers: dict[str, list[Any]] = {}
    for node in nodes:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    scalars = {init.name for init in graph.graph.initializer if not init.dims}
    graph_outputs = {out.name for out in graph.graph.output}
    dropped: list[Any] = []
    for reorder_in in (node for node in nodes if node.op_type == "ReorderInput"):
        region, sources, pending = [], set(), [reorder_in.input[0]]
        while pending:  # walk back from the ReorderInput through layout-free ops to where they start
            name = pending.pop()
            node = producer.get(name)
            if node is None or node.op_type not in _LAYOUT_FREE_OPS:
                sources.add(name)
            elif node not in region:
                region.append(node)
                pending += [value for value in node.input if value not in scalars]
        reorder_out = producer.get(next(iter(sources))) if len(sources) == 1 else None
        if not region or reorder_out is None or reorder_out.op_type != "ReorderOutput":
            continue
        inside = {name for node in region for name in node.output} | set(sources)
        readers_ok = all(reader in region or reader is reorder_in
                         for name in inside for reader in consumers.get(name, []))
        if not readers_ok or inside & graph_outputs:
            continue  # a value of the region is also read elsewhere, in the plain layout
        blocked, plain = reorder_out.input[0], reorder_out.output[0]
        for node in region:
            node.input[:] = [blocked if name == plain else name for name in node.input]
        for reader in consumers.get(reorder_in.output[0], []):
            reader.input[:] = [reorder_in.input[0] if name == reorder_in.output[0] else name for name in reader.input]
        dropped += [reorder_out, reorder_in]
    kept = [node for node in nodes if all(node is not gone for gone in dropped)]
    del graph.graph.node[:]
    graph.graph.node.extend(kept)


class PreparedStep:
    """The step graph optimized once for this CPU, with every initializer that holds weights (as
    given or rearranged: the convs' reordered filters) turned into a graph input, and for each such
    input the positions of the parameters it gathers.

    Why: ONNX Runtime's fast convs need their filters in its blocked layout, which it builds from
    constant weights while building a session, which then costs more than a rollout's acting.
    Fed as plain inputs the weights skip those rewrites and
    the forward is barely faster than torch's. Here the rewrites are done once, and a refresh is
    a numpy gather of the new weights into the layout the optimized graph expects.

    How the positions are found: the graph is optimized twice, its parameters labelled 1..N and
    then with the same labels rotated by N/2, so that no position keeps its label. An initializer
    equal in both is a constant of the graph. Any other must hold, in both, the labels of one
    gather of the parameters, or the graph is refused (ValueError): a rewrite that does arithmetic
    on weights cannot be refreshed by a gather."""

    def __init__(self, model: ActorCritic):
        import onnx
        from onnx import numpy_helper

        graph = export_step_graph(model)
        self.params = list(dict(model.named_parameters()).items())
        sizes = [tensor.numel() for _, tensor in self.params]
        total = sum(sizes)
        if not 2 <= total < 2**24:  # labels must be exact in float32, and two labellings must differ everywhere
            raise ValueError(f"{total:,} parameters: labelled exactly in float32 from 2 to 2**24 only")
        offsets = dict(zip((name for name, _ in self.params), np.cumsum([0, *sizes[:-1]])))
        labels = np.arange(1, total + 1, dtype=np.float32)
        rotated = np.roll(labels, total // 2)
        optimized = []
        for labelling in (labels, rotated):
            labelled = onnx.ModelProto()
            labelled.CopyFrom(graph)
            for init in labelled.graph.initializer:
                if init.name in offsets:
                    start = offsets[init.name]
                    init.raw_data = labelling[start:start + int(np.prod(init.dims))].tobytes()
            optimized.append(_optimized(labelled))
        first, second = ({init.name: numpy_helper.to_array(init) for init in g.graph.initializer} for g in optimized)
        if first.keys() != second.keys() or any(first[n].shape != second[n].shape for n in first):
            raise ValueError("ONNX Runtime rewrote the graph differently for other weights")
        self.gathers: dict[str, tuple[np.ndarray | slice, tuple[int, ...]]] = {}
        for name, a in first.items():
            b = second[name]
            if np.array_equal(a, b):
                continue  # a constant of the graph (shapes, the clip bound)
            index = a.astype(np.int64).ravel() - 1
            if (a.dtype != np.float32 or not np.array_equal(a.ravel(), index + 1) or index.min() < 0
                    or index.max() >= total or not np.array_equal(rotated[index], b.ravel())):
                raise ValueError(f"ONNX Runtime computed {name} from the weights; it cannot be refreshed by a gather")
            runs = index[0] + np.arange(index.size)
            self.gathers[name] = (slice(int(index[0]), int(index[0]) + index.size) if np.array_equal(index, runs)
                                  else index, a.shape)
        _initializers_to_inputs(optimized[0], set(self.gathers))
        _elementwise_in_blocked_layout(optimized[0])
        self.graph_bytes = optimized[0].SerializeToString()
        self.statistics = list(_statistics(model).items())

    def weights(self) -> dict[str, np.ndarray]:
        """The inputs that carry the model's current weights, in the optimized graph's layout."""
        # ravel: C order whatever the tensor's memory layout (channels-last convs); a fresh copy,
        # so later in-place updates of the model do not reach what the graph acts with.
        flat = np.concatenate([tensor.detach().numpy().ravel() for _, tensor in self.params])
        feeds = {name: flat[where].reshape(shape) for name, (where, shape) in self.gathers.items()}
        feeds.update((name, tensor.detach().numpy().copy()) for name, tensor in self.statistics)
        return feeds


class OnnxRuntimeActor:
    name = "onnxruntime"

    def __init__(self, model: ActorCritic):
        import onnxruntime

        problem = unsupported(model)
        if problem:
            raise ValueError(f"--act-backend onnxruntime: {problem}")
        self._prepared = PreparedStep(model)
        # Optimized once already: building it again must not rewrite it.
        self._session = onnxruntime.InferenceSession(self._prepared.graph_bytes, _session_options("ORT_DISABLE_ALL"),
                                                     providers=["CPUExecutionProvider"])
        self._weights: dict[str, np.ndarray] = {}
        self.refresh()

    def refresh(self) -> None:
        self._weights = self._prepared.weights()

    def step(self, obs: torch.Tensor, state: State) -> tuple[torch.Tensor, torch.Tensor, State]:
        feeds = {"obs": np.ascontiguousarray(obs.numpy(), dtype=np.float32),
                 "h": np.ascontiguousarray(state[0].numpy()), "c": np.ascontiguousarray(state[1].numpy()),
                 **self._weights}
        action_params, value, h, c = self._session.run(STEP_OUTPUTS, feeds)
        return torch.from_numpy(action_params), torch.from_numpy(value), (torch.from_numpy(h), torch.from_numpy(c))


def trial_steps(model: ActorCritic, batch: int = 3) -> tuple[tuple[torch.Tensor, torch.Tensor, State],
                                                               tuple[torch.Tensor, torch.Tensor, State]]:
    """Torch's step and ONNX Runtime's on the same random inputs (a fixed seed)."""
    generator = torch.Generator().manual_seed(0)
    obs = torch.rand(batch, *model.obs_shape, generator=generator)
    state = (torch.randn(1, batch, model.lstm_size, generator=generator),
             torch.randn(1, batch, model.lstm_size, generator=generator))
    with torch.no_grad():
        expected = model.step(obs, state)
    return expected, OnnxRuntimeActor(model).step(obs, state)


def trial_difference(model: ActorCritic, batch: int = 3) -> float:
    """The largest absolute difference between torch's step and ONNX Runtime's, on random inputs."""
    return step_difference(*trial_steps(model, batch))


def step_difference(expected: tuple[torch.Tensor, torch.Tensor, State],
                    got: tuple[torch.Tensor, torch.Tensor, State]) -> float:
    """The largest absolute difference between two steps' action parameters, values and LSTM states."""
    pairs = [(expected[0], got[0]), (expected[1], got[1]), (expected[2][0], got[2][0]), (expected[2][1], got[2][1])]
    return max(float((torch.as_tensor(a) - torch.as_tensor(b)).abs().max()) for a, b in pairs)
