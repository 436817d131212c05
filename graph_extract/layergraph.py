"""The layer graph: one node per layer (embedding, each block, head) with its memory and traffic.

Activation bytes are the bytes a layer keeps from its forward pass for its backward pass, per
micro-batch, in training precision, without recomputation: the union over the layer's operators of
the tensors that operator's backward needs (rules in `saved_tensors`), each tensor counted once.
Only tensors produced by operators count; parameters, buffers and model inputs do not. Dropout
masks take one byte per element. For a GPT block of width t this is Korthikanti et al.'s
s·b·h·(10 + 24/t) + 5·a·s²·b/t bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from graph_extract.opgraph import OpGraph, OpNode, weight_sizes

#: Elementwise operators whose backward needs their output, and those that need their input.
_SAVE_OUTPUT = {"relu", "tanh", "sigmoid", "exp", "rsqrt", "sqrt"}
_SAVE_INPUT = {"gelu", "silu", "log", "pow", "cos", "sin"}
#: Operators whose backward needs one specific, non-differentiable input (a mask or an index).
_SAVE_ARGUMENT = {"masked_fill": 1, "where": 0, "gather": 1, "embedding": 0}


@dataclass(frozen=True)
class Layer:
    """One pipeline-placeable unit: its parameters, saved activations and forward work."""

    id: int
    name: str
    parameter_bytes: int
    activation_bytes: int
    tensor_parallel: bool
    forward_flops: int


@dataclass(frozen=True)
class LayerEdge:
    """Activation bytes sent from layer `source` to layer `dest` per micro-batch (forward)."""

    source: int
    dest: int
    bytes: int


@dataclass(frozen=True)
class LayerGraph:
    layers: tuple[Layer, ...]
    edges: tuple[LayerEdge, ...]
    tensor_parallel_width: int

    def layer(self, layer_id: int) -> Layer:
        return next(layer for layer in self.layers if layer.id == layer_id)


def saved_tensors(node: OpNode, graph: OpGraph) -> list[tuple[tuple[str, int], int]]:
    """(tensor key, bytes) of what `node`'s backward needs; key ("out", p) is p's output tensor."""

    def produced(position: int) -> list[tuple[tuple[str, int], int]]:
        if position >= len(node.inputs) or node.inputs[position] is None:
            return []  # a model input or a buffer
        source = graph.nodes[node.inputs[position]]
        return [(("out", source.id), math.prod(node.input_shapes[position]) * source.dtype_bytes)]

    own_output = [(("out", node.id), node.output_bytes)]
    every_input = [item for position in range(len(node.inputs)) for item in produced(position)]
    if node.kind == "gemm" or node.kind == "norm":
        return produced(0)
    if node.kind == "bmm":
        return every_input
    if node.kind == "softmax":
        return own_output
    if node.op in _SAVE_ARGUMENT:
        return produced(_SAVE_ARGUMENT[node.op])
    if node.op == "dropout":
        return [(("mask", node.id), node.output_elements)]
    if node.op in _SAVE_OUTPUT:
        return own_output
    if node.op in _SAVE_INPUT:
        return produced(0)
    if node.op in ("mul", "div"):
        # each operand is needed for the other's gradient, which exists if that one is trained
        trained = [source is not None for source in node.inputs] + [True] * len(node.weight_shapes)
        return [item for position in range(len(node.inputs)) if sum(trained) - trained[position] > 0
                for item in produced(position)]
    return []  # add, sub, neg, comparisons, sum, amax (a detached shift in the loss), shape ops, collectives


def _layer_name(nodes: tuple[OpNode, ...]) -> str:
    parts = nodes[0].module_path.split(".")
    return ".".join(parts[:2]) if parts[0] == "layers" else parts[0]


def build_layer_graph(graph: OpGraph, dtype_bytes: int = 2) -> LayerGraph:
    """Contract the op graph into layers; parameters are counted once per layer that reads them."""
    layers = []
    for layer_id in graph.layers:
        nodes = graph.layer_nodes(layer_id)
        weights = weight_sizes(nodes)
        saved = {key: size for node in nodes for key, size in saved_tensors(node, graph)}
        layers.append(
            Layer(
                id=layer_id,
                name=_layer_name(nodes),
                parameter_bytes=sum(weights.values()) * dtype_bytes,
                activation_bytes=sum(saved.values()),
                tensor_parallel=any(
                    node.kind == "allreduce" and node.attr("group_size", 1) > 1 for node in nodes
                ),
                forward_flops=sum(node.flops for node in nodes),
            )
        )
    crossing: dict[tuple[int, int], dict[int, int]] = {}
    for source, dest in graph.edges:
        pair = (graph.nodes[source].layer, graph.nodes[dest].layer)
        if pair[0] != pair[1]:
            crossing.setdefault(pair, {})[source] = graph.nodes[source].output_bytes
    edges = tuple(LayerEdge(src, dst, sum(sizes.values())) for (src, dst), sizes in crossing.items())
    return LayerGraph(layers=tuple(layers), edges=edges, tensor_parallel_width=graph.tensor_parallel_width)
