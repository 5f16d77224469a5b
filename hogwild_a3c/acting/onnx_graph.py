"""ONNX graph surgery for the ONNX Runtime backend (`onnx_backend`): the rewrites of the exported
step graph and of ONNX Runtime's optimized one, and the session options the backend runs with.
Each rewrite keeps the graph's values; tests check each against the graph as exported."""
from __future__ import annotations

import os
import tempfile
from typing import Any

import numpy as np


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


def initializers_to_inputs(graph: Any, names: set[str]) -> None:
    """Make the initializers named in `names` inputs of the graph, fed at every run."""
    import onnx

    kept = [init for init in graph.graph.initializer if init.name not in names]
    for init in graph.graph.initializer:
        if init.name in names:
            graph.graph.input.append(onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    del graph.graph.initializer[:]
    graph.graph.initializer.extend(kept)


def session_options(level: str) -> Any:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    # Each process acts on one core, as torch does with set_num_threads(1).
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = getattr(onnxruntime.GraphOptimizationLevel, level)
    options.log_severity_level = 3  # its notice that an optimized graph suits this CPU only: it never leaves it
    return options


def optimized_for_this_cpu(graph: Any) -> Any:
    """The graph as ONNX Runtime rewrites it for this CPU with every optimization on: convs in its
    blocked (NCHWc) layout with their weights reordered, ops fused."""
    import onnx
    import onnxruntime

    with tempfile.TemporaryDirectory() as folder:
        options = session_options("ORT_ENABLE_ALL")
        options.optimized_model_filepath = os.path.join(folder, "step.onnx")
        onnxruntime.InferenceSession(graph.SerializeToString(), options, providers=["CPUExecutionProvider"])
        return onnx.load(options.optimized_model_filepath)


_LAYOUT_FREE_OPS = {"Min", "Exp", "Sub", "Max"}  # what elu_from_exp writes: each value on its own


def elementwise_in_blocked_layout(graph: Any, channels_last_outputs: frozenset[str] = frozenset()) -> None:
    """Drop, in an optimized graph, each pair of reorders that takes a conv's output out of ONNX
    Runtime's blocked (NCHWc) layout only to feed ops that compute every value on its own (an ELU
    written by `elu_from_exp`) and then puts the result back into it for the next conv. Such ops
    give the same values in any memory order, so they can work on the blocked tensor itself.
    Why: the optimizer keeps in the blocked layout only the ops it knows (Relu, Add, ...), and the
    reorders it adds around each ELU were a measurable part of the atari model's forward. A result
    that is also one of `channels_last_outputs` is given to the caller by a reorder of its own,
    into channels-last (NHWC, the shape declared so): one reorder instead of two, into the layout
    the learn step's conv backward reads. In place."""
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
