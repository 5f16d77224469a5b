"""How a worker and the evaluator run the model's acting forward (`ActorCritic.step`).

`--act-backend torch` calls the model itself. `--act-backend onnxruntime` runs the same step as
an ONNX graph in ONNX Runtime, whose optimizer puts the convs in its blocked (NCHWc) layout and
fuses what torch runs op by op. The learn step stays in torch either way.

Hogwild's semantics: a worker acts with the weights it pulled at the start of its rollout, so
`refresh()` is called right after each pull. Three ways to give ORT fresh weights were measured
(`make bench-act-backend`, atari model, batch 8, one thread, Zen 4 EPYC, 2026-12-05):

- weights baked in, session rebuilt at each refresh: 0.72 ms a forward, but 8 ms a refresh, so
  a rollout of 11 forwards costs more than torch's (15.9 ms against 11.7);
- weights as plain graph inputs: no rebuild, but the optimizer cannot reorder filters it does
  not know, and the forward is torch's speed (1.12 ms);
- what runs here (`PreparedStep`): the graph optimized once, the optimized graph's weight-holding
  initializers made inputs, and a refresh gathering the model's weights into that layout (0.14 ms):
  0.83 ms a forward, 9.2 ms a rollout.

`auto`, the default, takes ONNX Runtime for models with a conv encoder and an LSTM core when it
is installed, and torch otherwise: small MLPs gain nothing from it.

A worker's ONNX Runtime actor also hands out its encoder's ELU outputs (for a conv + ELU encoder),
so that the learn step takes the encoder's gradient from them instead of running its forward again
(`encoder_grad`): the learn step 16.9 -> 14.3 ms a rollout, acting ~1.5 ms dearer (Xeon with AMX).
"""
from __future__ import annotations

import contextlib
import copy
import importlib.util
import io
import os
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import numpy as np
import torch

from ..learning.encoder_grad import conv_elu_chain
from ..learning.model import ActorCritic, State, has_conv_encoder

BACKENDS = ("auto", "torch", "onnxruntime")


class Actor(Protocol):
    name: str
    keeps_activations: bool  # whether `step` writes the encoder's ELU outputs where it is told
    activation_shapes: list[tuple[int, ...]]  # of each, for one frame; empty when none are kept
    activations_nhwc: list[bool]  # whether each is written channels-last (NHWC) rather than NCHW

    def refresh(self) -> None:
        """Take the model's current weights (after a pull); until the next call, `step` uses them."""

    def step(self, obs: torch.Tensor, state: State, into: Sequence[np.ndarray] = ()
             ) -> tuple[torch.Tensor, torch.Tensor, State]:
        """What `ActorCritic.step` returns, for the weights of the last `refresh`; an actor that
        keeps activations writes them into `into` when given (arrays [B, *activation_shapes[i]])."""


class TorchActor:
    name = "torch"
    keeps_activations = False

    def __init__(self, model: ActorCritic):
        self.model = model
        self.activation_shapes: list[tuple[int, ...]] = []
        self.activations_nhwc: list[bool] = []

    def refresh(self) -> None:
        pass  # the model is the weights

    def step(self, obs: torch.Tensor, state: State, into: Sequence[np.ndarray] = ()
             ) -> tuple[torch.Tensor, torch.Tensor, State]:
        return self.model.step(obs, state)


def onnxruntime_installed() -> bool:
    return all(importlib.util.find_spec(name) is not None for name in ("onnxruntime", "onnx"))


def unsupported_by_onnx(model: ActorCritic) -> str | None:
    """Why the ONNX backend cannot act for this model, or None."""
    if model.lstm is None:
        return "it acts for models with the lstm core only (--core lstm)"
    if model.value_encoder is not None:
        return "it does not take a separate value network (--value-net shared)"
    return None


class _StepGraph(torch.nn.Module):
    """`ActorCritic.step` with the state as two tensors, which is what the exporter traces; with
    `keep_activations`, each encoder ELU's output as well (`activation0`, ...)."""

    def __init__(self, model: ActorCritic, keep_activations: bool = False):
        super().__init__()
        self.model = model
        self.keep_activations = keep_activations

    def forward(self, obs: torch.Tensor, h: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, ...]:
        with elu_outputs(self.model) as kept:
            logits, value, (h_next, c_next) = self.model.step(obs, (h, c))
        return (logits, value, h_next, c_next, *(kept if self.keep_activations else []))


@contextlib.contextmanager
def elu_outputs(model: ActorCritic) -> Iterator[list[torch.Tensor]]:
    """Collects each encoder ELU's output, in order, while the block runs one forward of `model`."""
    outputs: list[torch.Tensor] = []
    hooks = [module.register_forward_hook(lambda _module, _input, output: outputs.append(output))
             for module in model.encoder.children() if isinstance(module, torch.nn.ELU)]
    try:
        yield outputs
    finally:
        for hook in hooks:
            hook.remove()


def activation_names(model: ActorCritic) -> list[str]:
    """The step graph's outputs that keep the encoder's ELU outputs, for a conv + ELU encoder."""
    convs = conv_elu_chain(model.encoder)
    return [] if convs is None else [f"activation{i}" for i in range(len(convs))]


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


def export_step_graph(model: ActorCritic, keep_activations: bool = False) -> Any:
    """The acting step as an ONNX ModelProto with a dynamic batch: inputs obs, h, c and the
    observation statistics (by state-dict name), the parameters as initializers named as the
    state dict; with `keep_activations`, outputs `activation_names(model)` too. Exported from a copy
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
    kept = activation_names(model) if keep_activations else []
    buffer = io.BytesIO()
    with warnings.catch_warnings():  # the TorchScript exporter's deprecation notice, once per process
        warnings.simplefilter("ignore")
        torch.onnx.export(
            _StepGraph(twin, keep_activations), example, buffer,  # type: ignore[arg-type]  # a file object is taken too
            input_names=["obs", "h", "c"],
            output_names=["logits", "value", "h_next", "c_next", *kept], dynamo=False, do_constant_folding=False,
            dynamic_axes={"obs": {0: "batch"}, "h": {1: "batch"}, "c": {1: "batch"}, "logits": {0: "batch"},
                          "value": {0: "batch"}, "h_next": {1: "batch"}, "c_next": {1: "batch"},
                          **{name: {0: "batch"} for name in kept}},
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

    Why: ONNX Runtime's Elu kernel is scalar code, 1.8 ns a value (201 us of the atari model's
    938 us forward at batch 8 on a Xeon, its largest op), while its Exp, Min, Max and Sub are
    vectorized. The identity holds because e^x - 1 >= x for every x, with equality at 0 only;
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


def _elementwise_in_blocked_layout(graph: Any, channels_last_outputs: frozenset[str] = frozenset()) -> None:
    """Drop, in an optimized graph, each pair of reorders that takes a conv's output out of ONNX
    Runtime's blocked (NCHWc) layout only to feed ops that compute every value on its own (an ELU
    written by `elu_from_exp`) and then puts the result back into it for the next conv. Such ops
    give the same values in any memory order, so they can work on the blocked tensor itself.
    Why: the optimizer keeps in the blocked layout only the ops it knows (Relu, Add, ...); for
    the atari model the six reorders it adds around three ELUs took ~90 us of a 0.69 ms forward
    at batch 8 (Xeon). A result that is also one of `channels_last_outputs` is given to the
    caller by a reorder of its own, into channels-last (NHWC, the shape declared so): one reorder
    instead of two, into the layout the learn step's conv backward reads. In place."""
    import onnx
    from onnx import helper

    nodes = list(graph.graph.node)
    producer = {name: node for node in nodes for name in node.output}
    consumers: dict[str, list[Any]] = {}
    for node in nodes:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    scalars = {init.name for init in graph.graph.initializer if not init.dims}
    graph_outputs = {out.name for out in graph.graph.output}
    dropped: list[Any] = []
    added: list[tuple[Any, Any]] = []
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
        result = reorder_in.input[0]
        handed_out = result in graph_outputs and result in channels_last_outputs
        if not readers_ok or (inside - {result} if handed_out else inside) & graph_outputs:
            continue  # a value of the region is also read elsewhere, in the plain layout
        blocked, plain = reorder_out.input[0], reorder_out.output[0]
        for node in region:
            node.input[:] = [blocked if name == plain else name for name in node.input]
        kept_blocked = f"{result}/blocked" if handed_out else result
        for reader in consumers.get(reorder_in.output[0], []):
            reader.input[:] = [kept_blocked if name == reorder_in.output[0] else name for name in reader.input]
        if handed_out:
            last = producer[result]
            last.output[:] = [kept_blocked if name == result else name for name in last.output]
            to_caller = helper.make_node("ReorderOutput", [kept_blocked], [result], name=f"{result}/to_nhwc",
                                         domain=reorder_out.domain, channels_last=1,
                                         channels=helper.get_attribute_value(
                                             next(a for a in reorder_out.attribute if a.name == "channels")))
            added.append((last, to_caller))
            declared = next(out for out in graph.graph.output if out.name == result).type.tensor_type.shape.dim
            nchw = [onnx.TensorShapeProto.Dimension() for _ in range(4)]
            for dim, source in zip(nchw, declared):
                dim.CopyFrom(source)
            for dim, source in zip(declared, (nchw[0], nchw[2], nchw[3], nchw[1])):
                dim.CopyFrom(source)
        dropped += [reorder_out, reorder_in]
    kept = [node for node in nodes if all(node is not gone for gone in dropped)]
    for last, to_caller in added:  # each right after the op that computes its input
        kept.insert(next(i for i, node in enumerate(kept) if node is last) + 1, to_caller)
    del graph.graph.node[:]
    graph.graph.node.extend(kept)


def channels_last_outputs(graph: Any) -> set[str]:
    """The outputs of an optimized graph that a reorder hands out channels-last (NHWC)."""
    from onnx import helper

    outputs = {out.name for out in graph.graph.output}
    return {node.output[0] for node in graph.graph.node
            if node.op_type == "ReorderOutput" and node.output[0] in outputs
            and any(a.name == "channels_last" and helper.get_attribute_value(a) == 1 for a in node.attribute)}


class PreparedStep:
    """The step graph optimized once for this CPU, with every initializer that holds weights (as
    given or rearranged: the convs' reordered filters) turned into a graph input, and for each such
    input the positions of the parameters it gathers.

    Why: ONNX Runtime's fast convs need their filters in its blocked layout, which it builds from
    constant weights while building a session (3.7 ms for the atari model on a Zen 4 EPYC, plus
    the serialization: ~6 ms a rollout). Fed as plain inputs the weights skip those rewrites and
    the forward is barely faster than torch's. Here the rewrites are done once, and a refresh is
    a numpy gather of the new weights into the layout the optimized graph expects.

    How the positions are found: the graph is optimized twice, its parameters labelled 1..N and
    then with the same labels rotated by N/2, so that no position keeps its label. An initializer
    equal in both is a constant of the graph. Any other must hold, in both, the labels of one
    gather of the parameters, or the graph is refused (ValueError): a rewrite that does arithmetic
    on weights cannot be refreshed by a gather."""

    def __init__(self, model: ActorCritic, keep_activations: bool = False):
        import onnx
        from onnx import numpy_helper

        graph = export_step_graph(model, keep_activations)
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
        kept = activation_names(model) if keep_activations else []
        _elementwise_in_blocked_layout(optimized[0], frozenset(kept))
        nhwc = channels_last_outputs(optimized[0])
        self.activations = [(name, name in nhwc) for name in kept]  # (output, handed out NHWC)
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


STEP_OUTPUTS = ["logits", "value", "h_next", "c_next"]


class OnnxRuntimeActor:
    """With `keep_activations` (a worker's actor, for a conv + ELU encoder), `step` also writes
    each encoder ELU's output where the caller says, so that the learn step need not
    compute them again (`encoder_grad`); the evaluator's actor keeps none, and its graph hands out
    none. They are written through an IOBinding into the caller's arrays, which a worker reuses
    rollout after rollout: fresh output arrays held for a rollout cost page faults at every step."""

    name = "onnxruntime"

    def __init__(self, model: ActorCritic, keep_activations: bool = False):
        import onnxruntime

        problem = unsupported_by_onnx(model)
        if problem:
            raise ValueError(f"--act-backend onnxruntime: {problem}")
        self.keeps_activations = keep_activations and conv_elu_chain(model.encoder) is not None
        self._prepared = PreparedStep(model, self.keeps_activations)
        # Optimized once already: building it again must not rewrite it.
        self._session = onnxruntime.InferenceSession(self._prepared.graph_bytes, _session_options("ORT_DISABLE_ALL"),
                                                     providers=["CPUExecutionProvider"])
        self._binding = self._session.io_binding() if self.keeps_activations else None
        self._weights: dict[str, np.ndarray] = {}
        self.refresh()
        # What step writes for one frame: each activation's shape as handed out, and
        # whether it is handed out channels-last (NHWC) rather than NCHW.
        self.activations_nhwc = [nhwc for _, nhwc in self._prepared.activations]
        self.activation_shapes: list[tuple[int, ...]] = []
        if self.keeps_activations:
            trial = self._session.run([name for name, _ in self._prepared.activations], self._feeds(
                torch.zeros(1, *model.obs_shape), model.initial_state(1)))
            self.activation_shapes = [array.shape[1:] for array in trial]

    def refresh(self) -> None:
        self._weights = self._prepared.weights()
        if self._binding is not None:
            for name, array in self._weights.items():
                self._binding.bind_cpu_input(name, array)

    def _feeds(self, obs: torch.Tensor, state: State) -> dict[str, np.ndarray]:
        return {"obs": np.ascontiguousarray(obs.numpy(), dtype=np.float32),
                "h": np.ascontiguousarray(state[0].numpy()), "c": np.ascontiguousarray(state[1].numpy()),
                **self._weights}

    def step(self, obs: torch.Tensor, state: State, into: Sequence[np.ndarray] = ()
             ) -> tuple[torch.Tensor, torch.Tensor, State]:
        """With `into` (an actor that keeps activations), each encoder ELU's output is written into
        `into[i]`, float32 C-contiguous arrays [B, *activation_shapes[i]]."""
        binding = self._binding
        if not into or binding is None:
            logits, value, h, c = self._session.run(STEP_OUTPUTS, self._feeds(obs, state))
            return torch.from_numpy(logits), torch.from_numpy(value), (torch.from_numpy(h), torch.from_numpy(c))
        if len(into) != len(self.activation_shapes) or not all(
                array.dtype == np.float32 and array.flags.c_contiguous and array.shape[1:] == shape
                for array, shape in zip(into, self.activation_shapes)):
            raise ValueError(f"into: {len(self.activation_shapes)} float32 C-contiguous arrays [B, *shape] for "
                             f"shapes {self.activation_shapes}")
        # The weights stay bound from the last refresh.
        binding.bind_cpu_input("obs", np.ascontiguousarray(obs.numpy(), dtype=np.float32))
        binding.bind_cpu_input("h", np.ascontiguousarray(state[0].numpy()))
        binding.bind_cpu_input("c", np.ascontiguousarray(state[1].numpy()))
        for name in STEP_OUTPUTS:
            binding.bind_output(name, "cpu")
        for (name, _), array in zip(self._prepared.activations, into):
            binding.bind_output(name, "cpu", 0, np.float32, list(array.shape), array.ctypes.data)
        self._session.run_with_iobinding(binding)
        logits, value, h, c = (torch.from_numpy(value.numpy()) for value in binding.get_outputs()[:len(STEP_OUTPUTS)])
        return logits, value, (h, c)


def chosen_backend(requested: str, model: ActorCritic) -> tuple[str, str]:
    """The backend `requested` resolves to for this model, and why, in words for train.log."""
    if requested == "torch":
        return "torch", "--act-backend torch"
    problem = unsupported_by_onnx(model)
    if requested == "onnxruntime":
        return "onnxruntime", "--act-backend onnxruntime"
    if problem is not None or not has_conv_encoder(model):
        return "torch", "--act-backend auto: the model has no conv encoder with an LSTM core, where ONNX Runtime gains"
    if not onnxruntime_installed():
        return "torch", ("--act-backend auto: onnxruntime is not installed, so acting runs in torch, about 1.3x "
                         "slower a forward on Atari frames (pip install 'hogwild-a3c[onnx]')")
    return "onnxruntime", "--act-backend auto: a conv encoder with an LSTM core, and onnxruntime is installed"


def request_problem(requested: str, model: ActorCritic) -> str | None:
    """A one-line error for a backend asked for by name that cannot act for this run, or None."""
    if requested != "onnxruntime":
        return None
    if not onnxruntime_installed():
        return ("--act-backend onnxruntime: onnxruntime is not installed (pip install 'hogwild-a3c[onnx]'); "
                "or use --act-backend torch or auto")
    problem = unsupported_by_onnx(model)
    return None if problem is None else f"--act-backend onnxruntime: {problem}; use --act-backend torch or auto"


# The trial forward at start-up must agree with torch's this closely, or acting stays in torch.
TRIAL_TOLERANCE = 1e-4


def resolve(requested: str, model: ActorCritic) -> tuple[str, str]:
    """The backend every child of this run acts with, and the train.log line that says why. An
    ONNX backend is tried once here, on a fresh model of the run's shape and random inputs, against
    torch: a model it cannot export or that it computes differently falls back to torch."""
    name, why = chosen_backend(requested, model)
    if name != "onnxruntime":
        return name, f"acting in torch ({why})"
    try:
        difference = trial_difference(model)
    except Exception as exc:  # noqa: BLE001 - any export or runtime failure means: act in torch
        return "torch", f"acting in torch: ONNX Runtime could not run this model's step ({type(exc).__name__}: {exc})"
    if not difference <= TRIAL_TOLERANCE:
        return "torch", (f"acting in torch: ONNX Runtime's step differs from torch's by {difference:.2g} "
                         f"(more than {TRIAL_TOLERANCE:g})")
    import onnxruntime

    return name, f"acting in onnxruntime {onnxruntime.__version__} ({why})"


def _trial(model: ActorCritic, batch: int) -> tuple[tuple[torch.Tensor, torch.Tensor, State],
                                                    tuple[torch.Tensor, torch.Tensor, State],
                                                    list[tuple[torch.Tensor, torch.Tensor]]]:
    """Torch's step and ONNX Runtime's on the same random inputs (a fixed seed), ONNX Runtime's as a
    worker runs it (keeping the encoder's activations where it can), and each kept activation
    beside torch's (none when it keeps none)."""
    generator = torch.Generator().manual_seed(0)
    obs = torch.rand(batch, *model.obs_shape, generator=generator)
    state = (torch.randn(1, batch, model.lstm_size, generator=generator),
             torch.randn(1, batch, model.lstm_size, generator=generator))
    with torch.no_grad(), elu_outputs(model) as expected_activations:
        expected = model.step(obs, state)
    actor = OnnxRuntimeActor(model, keep_activations=True)
    into = [np.zeros((batch, *shape), dtype=np.float32) for shape in actor.activation_shapes]
    got = actor.step(obs, state, into)
    kept = [torch.from_numpy(array).permute(0, 3, 1, 2) if nhwc else torch.from_numpy(array)
            for array, nhwc in zip(into, actor.activations_nhwc)]
    return expected, got, list(zip(expected_activations, kept)) if actor.keeps_activations else []


def trial_steps(model: ActorCritic, batch: int = 3) -> tuple[tuple[torch.Tensor, torch.Tensor, State],
                                                               tuple[torch.Tensor, torch.Tensor, State]]:
    """Torch's step and ONNX Runtime's (a worker's) on the same random inputs (a fixed seed)."""
    expected, got, _ = _trial(model, batch)
    return expected, got


def trial_difference(model: ActorCritic, batch: int = 3) -> float:
    """The largest absolute difference between torch's step and ONNX Runtime's, on random inputs,
    the encoder activations a worker's actor keeps included."""
    expected, got, activations = _trial(model, batch)
    return max([step_difference(expected, got)] + [float((a - b).abs().max()) for a, b in activations])


def step_difference(expected: tuple[torch.Tensor, torch.Tensor, State],
                    got: tuple[torch.Tensor, torch.Tensor, State]) -> float:
    """The largest absolute difference between two steps' logits, values and LSTM states."""
    pairs = [(expected[0], got[0]), (expected[1], got[1]), (expected[2][0], got[2][0]), (expected[2][1], got[2][1])]
    return max(float((torch.as_tensor(a) - torch.as_tensor(b)).abs().max()) for a, b in pairs)


def make_actor(requested: str, model: ActorCritic, keep_activations: bool = False) -> Actor:
    """The actor for `model` (a worker's or the evaluator's local copy). Children get the name
    `resolve` chose in the main process, so "auto" is resolved here only when called directly.
    `keep_activations`: a worker's, whose learn step can use them; an ONNX Runtime actor keeps
    them, torch's (the fallback) does not, and its learn step replays the encoder."""
    name = chosen_backend(requested, model)[0] if requested == "auto" else requested
    if name == "onnxruntime":
        return OnnxRuntimeActor(model, keep_activations)
    return TorchActor(model)
