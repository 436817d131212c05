"""The layer graph: one node per layer (embedding, each block, head) with its memory and traffic.

Activation bytes are the bytes a layer keeps from its forward pass for its backward pass, per
micro-batch, in training precision, without recomputation: the union over the layer's operators of
the tensors that operator's backward needs (rules in `saved_tensors`), each tensor counted once.
Only tensors produced by operators count; parameters, buffers and model inputs do not. Dropout
masks take one byte per element. For a GPT block of width t this is Korthikanti et al.'s
s·b·h·(10 + 24/t) + 5·a·s²·b/t bytes, of which s·b·h·10 are replicated over the tensor-parallel
ranks (what sequence parallelism splits) and 5·a·s²·b/t belong to the attention core (what
selective recomputation drops); see `graph_extract.regions`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from graph_extract.opgraph import OpGraph, OpNode, weight_sizes
from graph_extract.regions import attention_core, replicated_outputs

#: Elementwise operators whose backward needs their output, and those that need their input.
_SAVE_OUTPUT = {"relu", "tanh", "sigmoid", "exp", "rsqrt", "sqrt"}
_SAVE_INPUT = {"gelu", "silu", "log", "pow", "cos", "sin"}
#: Operators whose backward needs one specific, non-differentiable input (a mask or an index).
_SAVE_ARGUMENT = {"masked_fill": 1, "where": 0, "gather": 1, "embedding": 0, "index_select": 1}


#: Layer kinds: the layer before the first block, a transformer block, the layers after the last.
LAYER_KINDS = ("embedding", "block", "head")


@dataclass(frozen=True)
class Layer:
    """One pipeline-placeable unit: its parameters, saved activations, traffic and forward work.

    Bytes are per micro-batch on one rank of the tensor-parallel group. `replicated_*` parts are
    identical on every rank; `attention_core_activation_bytes` is what selective recomputation
    re-creates; `input_bytes` is what enters the layer from other layers (what full recomputation
    keeps). `*_collective_bytes` are the tensor-parallel all-reduces of the forward and backward
    pass, one entry each (empty at width 1). A mixture-of-experts block also has its experts'
    share of `parameter_bytes` (all experts here; expert parallelism divides them) and the bytes of
    each token all-to-all of its forward pass (dispatch, combine; the backward pass mirrors them).
    """

    id: int
    name: str
    kind: str
    parameter_bytes: int
    activation_bytes: int
    replicated_activation_bytes: int
    attention_core_activation_bytes: int
    input_bytes: int
    replicated_input_bytes: int
    tensor_parallel: bool
    forward_flops: int
    forward_collective_bytes: tuple[int, ...] = ()
    backward_collective_bytes: tuple[int, ...] = ()
    expert_parameter_bytes: int = 0
    all_to_all_bytes: tuple[int, ...] = ()

    @property
    def is_block(self) -> bool:
        """A transformer block: what recomputation re-runs (Megatron checkpoints blocks only) and what
        a pipeline's chunks split."""
        return self.kind == "block"


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


def _layer_kind(name: str) -> str:
    return "block" if name.startswith("layers.") else "embedding" if name == "embedding" else "head"


def _collective_bytes(nodes: tuple[OpNode, ...], direction: str) -> tuple[int, ...]:
    return tuple(node.output_bytes for node in nodes
                 if node.kind == "allreduce" and node.attr("group_size", 1) > 1 and node.attr("direction") == direction)


def _expert_weights(nodes: tuple[OpNode, ...]) -> set[str]:
    """Names of the experts' weights: those of the per-expert products."""
    return {name for node in nodes if node.op == "grouped_linear" for name in node.weight_names}


def build_layer_graph(graph: OpGraph, dtype_bytes: int = 2) -> LayerGraph:
    """Contract the op graph into layers; parameters are counted once per layer that reads them."""
    replicated, core = replicated_outputs(graph), attention_core(graph)
    crossing: dict[tuple[int, int], dict[int, int]] = {}
    for source, dest in graph.edges:
        pair = (graph.nodes[source].layer, graph.nodes[dest].layer)
        if pair[0] != pair[1]:
            crossing.setdefault(pair, {})[source] = graph.nodes[source].output_bytes
    layers = []
    for layer_id in graph.layers:
        nodes = graph.layer_nodes(layer_id)
        weights, experts = weight_sizes(nodes), _expert_weights(nodes)
        saved = {key: size for node in nodes for key, size in saved_tensors(node, graph)}
        inputs = {source: size for (_, dest), sizes in crossing.items() if dest == layer_id for source, size in sizes.items()}
        name = _layer_name(nodes)
        layers.append(
            Layer(
                id=layer_id,
                name=name,
                kind=_layer_kind(name),
                parameter_bytes=sum(weights.values()) * dtype_bytes,
                activation_bytes=sum(saved.values()),
                replicated_activation_bytes=sum(size for (_, node), size in saved.items() if replicated[node]),
                attention_core_activation_bytes=sum(size for (_, node), size in saved.items() if node in core),
                input_bytes=sum(inputs.values()),
                replicated_input_bytes=sum(size for source, size in inputs.items() if replicated[source]),
                tensor_parallel=any(
                    node.kind == "allreduce" and node.attr("group_size", 1) > 1 for node in nodes
                ),
                forward_flops=sum(node.flops for node in nodes),
                forward_collective_bytes=_collective_bytes(nodes, "forward"),
                backward_collective_bytes=_collective_bytes(nodes, "backward"),
                expert_parameter_bytes=sum(size for name, size in weights.items() if name in experts) * dtype_bytes,
                all_to_all_bytes=tuple(node.output_bytes for node in nodes if node.kind == "alltoall"),
            )
        )
    edges = tuple(LayerEdge(src, dst, sum(sizes.values())) for (src, dst), sizes in crossing.items())
    return LayerGraph(layers=tuple(layers), edges=edges, tensor_parallel_width=graph.tensor_parallel_width)
