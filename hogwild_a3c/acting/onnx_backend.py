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

A worker's actor may also hand out its encoder's ELU outputs (`keep_activations`, asked for by a
learner that reads them, `learning/encoder_grad.py`), written channels-last where the optimized
graph has them in its blocked layout, through an IOBinding into the caller's arrays.
"""
from __future__ import annotations

import contextlib
import copy
import importlib.util
import io
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from ..learning.model import ActorCritic, State
from .onnx_graph import (
    channels_last_outputs,
    elementwise_in_blocked_layout,
    elu_from_exp,
    initializers_to_inputs,
    optimized_for_this_cpu,
    session_options,
)

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
    """`ActorCritic.step` with the state as two tensors, which is what the exporter traces; with
    `keep_activations`, each encoder ELU's output as well (`activation0`, ...)."""

    def __init__(self, model: ActorCritic, keep_activations: bool = False):
        super().__init__()
        self.model = model
        self.keep_activations = keep_activations

    def forward(self, obs: torch.Tensor, h: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, ...]:
        with elu_outputs(self.model) as kept:
            action_params, value, (h_next, c_next) = self.model.step(obs, (h, c))
        return (action_params, value, h_next, c_next, *(kept if self.keep_activations else []))


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
    """The step graph's outputs that keep the encoder's ELU outputs: one for each ELU module the
    encoder's forward calls (an MLP encoder applies its activations as functions: none)."""
    with torch.no_grad(), elu_outputs(model) as kept:
        model.step(torch.zeros(1, *model.obs_shape), model.initial_state(1))
    return [f"activation{i}" for i in range(len(kept))]


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
    state dict, outputs `STEP_OUTPUTS` (and `activation_names(model)` with `keep_activations`).
    Exported from a copy
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
            output_names=[*STEP_OUTPUTS, *kept], dynamo=False, do_constant_folding=False,
            dynamic_axes={"obs": {0: "batch"}, "h": {1: "batch"}, "c": {1: "batch"},
                          **{name: {1 if name in ("h_next", "c_next") else 0: "batch"}
                             for name in [*STEP_OUTPUTS, *kept]}},
        )
    graph = onnx.load_from_string(buffer.getvalue())
    for init in graph.graph.initializer:
        init.name = init.name.removeprefix("model.")
    for node in graph.graph.node:
        node.input[:] = [name.removeprefix("model.") for name in node.input]
    missing = sorted(set(_weights_feeding(model)) - {init.name for init in graph.graph.initializer})
    if missing:
        raise RuntimeError(f"the exported step graph does not read {', '.join(missing)} by name")
    initializers_to_inputs(graph, set(_statistics(model)))
    elu_from_exp(graph)
    return graph


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
            optimized.append(optimized_for_this_cpu(labelled))
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
        initializers_to_inputs(optimized[0], set(self.gathers))
        kept = activation_names(model) if keep_activations else []
        elementwise_in_blocked_layout(optimized[0], frozenset(kept))
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


class OnnxRuntimeActor:
    """With `keep_activations` (a worker's actor whose learner reads them), `step` also writes
    each encoder ELU's output where the caller says, so that the learn step need not compute them
    again; the evaluator's actor keeps none, and its graph hands out none. They are written
    through an IOBinding into the caller's arrays, which a worker reuses rollout after rollout:
    fresh output arrays held for a rollout cost page faults at every step."""

    name = "onnxruntime"

    def __init__(self, model: ActorCritic, keep_activations: bool = False):
        import onnxruntime

        problem = unsupported(model)
        if problem:
            raise ValueError(f"--act-backend onnxruntime: {problem}")
        self._prepared = PreparedStep(model, keep_activations)
        # An encoder without ELU modules has none to keep: the graph then hands out nothing.
        self.keeps_activations = bool(self._prepared.activations)
        # Optimized once already: building it again must not rewrite it.
        self._session = onnxruntime.InferenceSession(self._prepared.graph_bytes, session_options("ORT_DISABLE_ALL"),
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
            action_params, value, h, c = self._session.run(STEP_OUTPUTS, self._feeds(obs, state))
            return torch.from_numpy(action_params), torch.from_numpy(value), (torch.from_numpy(h), torch.from_numpy(c))
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
        outputs = binding.get_outputs()[:len(STEP_OUTPUTS)]
        action_params, value, h, c = (torch.from_numpy(output.numpy()) for output in outputs)
        return action_params, value, (h, c)


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
    """The largest absolute difference between two steps' action parameters, values and LSTM states."""
    pairs = [(expected[0], got[0]), (expected[1], got[1]), (expected[2][0], got[2][0]), (expected[2][1], got[2][1])]
    return max(float((torch.as_tensor(a) - torch.as_tensor(b)).abs().max()) for a, b in pairs)
