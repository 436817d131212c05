"""The layer graph: one node per layer (embedding, each block, head) with its memory and traffic.

Activation bytes are the bytes a layer keeps from its forward pass for its backward pass, per
micro-batch, in training precision, without recomputation: the union over the layer's operators of
the tensors that operator's backward needs (rules in `saved_tensors`), each tensor counted once.
Only tensors produced by operators count; parameters, buffers and model inputs do not. Dropout
masks take one byte per element. A gated unit's product keeps its gate and its other operand, not
the gate's activation (Megatron-Core's bias-SwiGLU/GeGLU fusion and Transformer Engine's gated
activations rebuild act(gate) in the backward from the gate; eager PyTorch, unfused, would keep it
too: a simplification for an unfused framework). For a GPT block of width t this is Korthikanti et al.'s
s·b·h·(10 + 24/t) + 5·a·s²·b/t bytes, of which s·b·h·10 are replicated over the tensor-parallel
ranks (what sequence parallelism splits) and 5·a·s²·b/t belong to the attention core (what
selective recomputation drops); see `graph_extract.regions`. With a fused attention kernel
(`graph_extract.attention`) the core keeps only Q, K, V and the softmax statistics: Korthikanti et
al.'s figure without its 5·a·s²·b/t. In FP8 training (Transformer Engine) the weight products of the blocks keep
their inputs in FP8: one byte an element instead of two. A block's recompute modules
(`graph_extract.regions.recompute_modules`) each record what re-running them changes
(`RecomputedModule`): the saved tensors made inside the module, which recomputing it drops (an
output-discarding module frees its output, a checkpointed one everything it made; the inputs they
read from outside are kept either way), and the collectives it runs again. A mixture's routed tokens
at the model's width are counted apart (`Layer.dispatched_activation_bytes`,
`Layer.combined_activation_bytes`): traced as if the experts were split over the t ranks, each rank
holding every token, while a rank keeps of them what the expert tensor-parallel width gives it
(`solver.training_step.memory`).

Under JAX's `jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims` (MaxText's remat_policy
`minimal`, maxtext MaxText/layers/models.py @ 76bd53b0f) a remat'd block saves the outputs of its dot
products without batch dimensions, its weight products, and the block's input; every other tensor
its backward needs is rebuilt from those (`product_outputs`): the attention core's products (batch
dimensions: batch and heads) and every element-wise operator run again. The products kept are the
ones a saved tensor is rebuilt from, not all of them (JAX saves a residual only where the backward
reads it: a product feeding only the block's output, the last down projection, is not kept); a
product's partial sums and the forward all-reduce completing them are one product to JAX, whose
output XLA keeps in the layout the program gives it (replicated here, split by sequence parallelism
as MaxText's tensor axis splits it); a dropout mask is drawn again from its random key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from graph_extract.attention import attention_kernels
from graph_extract.opgraph import EXPERT_TENSOR, OpGraph, OpNode, weight_sizes
from graph_extract.regions import (attention_core, block_weight_products, expert_outputs, input_derived, made_by,
                                   recompute_modules, replicated_outputs)

#: Elementwise operators whose backward needs their output, and those that need their input.
_SAVE_OUTPUT = {"relu", "tanh", "sigmoid", "exp", "rsqrt", "sqrt"}
_SAVE_INPUT = {"gelu", "silu", "log", "pow", "cos", "sin"}
#: Activations a gated unit (SwiGLU, GeGLU) fuses with its product.
_GATE_ACTIVATIONS = {"gelu", "silu"}
#: Operators whose backward needs one specific, non-differentiable input (a mask or an index).
_SAVE_ARGUMENT = {"masked_fill": 1, "where": 0, "gather": 1, "embedding": 0, "index_select": 1}


#: Layer kinds: the layer before the first block, a transformer block, the layers after the last; a
#: group of operators of a model without blocks (`graph_extract.operator_layers`).
LAYER_KINDS = ("embedding", "block", "head", "operators")


@dataclass(frozen=True)
class RecomputedModule:
    """One of Megatron-Core's recompute modules of a block (`name`, `graph_extract.regions`), bytes per
    micro-batch on one rank of the tensor-parallel group: the saved tensors made inside it, which
    recomputing it drops (with their replicated part, the part only weight products keep and the
    routed tokens, as `Layer`'s), and its forward collectives, which run again when it is recomputed
    (tensor-parallel all-reduces, the routed experts' all-reduces, the token all-to-alls)."""

    name: str
    activation_bytes: int
    replicated_activation_bytes: int = 0
    matrix_input_activation_bytes: int = 0
    replicated_matrix_input_activation_bytes: int = 0
    forward_collective_bytes: tuple[int, ...] = ()
    expert_forward_collective_bytes: tuple[int, ...] = ()
    all_to_all_bytes: tuple[int, ...] = ()
    # with a fused attention kernel, where they differ (a module making the kernel's Q, K, V:
    # mla_up_proj): what it drops then, and the replicated part of it (None: as without)
    fused_attention_activation_bytes: int | None = None
    fused_replicated_activation_bytes: int | None = None
    dispatched_activation_bytes: int = 0
    combined_activation_bytes: int = 0


@dataclass(frozen=True)
class Layer:
    """One pipeline-placeable unit: its parameters, saved activations, traffic and forward work.

    Bytes are per micro-batch on one rank of the tensor-parallel group. `replicated_*` parts are
    identical on every rank; `attention_core_activation_bytes` is what selective recomputation
    re-creates; `input_bytes` is what enters the layer from other layers (what full recomputation
    keeps). `*_collective_bytes` are the tensor-parallel all-reduces of the forward and backward
    pass, one entry each (empty at width 1). A mixture-of-experts block also has its experts'
    share of `parameter_bytes` (all experts here; expert parallelism divides them), the bytes of
    each token all-to-all of its forward pass (dispatch, combine; the backward pass mirrors them) and
    `expert_*_collective_bytes`: the routed experts' all-reduces, traced at width t and priced at the
    expert tensor-parallel width.

    `fused_attention_activation_bytes` is `activation_bytes` with the attention core run as a fused
    kernel (its Q, K, V and softmax statistics kept instead of the s × s tensors), and
    `fused_replicated_activation_bytes` its replicated part where it differs (an attention core
    whole on every rank, as a plan that does not split it leaves it: the tensors made inside the core
    are replicated and the kernel keeps none of them; None: `replicated_activation_bytes`);
    `matrix_input_activation_bytes` (and its replicated part) are the saved tensors only a block's
    weight products keep (FP8 keeps them in one byte an element); `matrix_parameter_bytes` are the
    weights those products read (FP8 adds an 8-bit copy of them); `key_value_bytes` are the keys and
    values its attention cores read (what context parallelism's ring passes on);
    `dispatched_activation_bytes` (of the replicated part) are the routed tokens only the experts'
    products keep (their input at the model's width h: E·C·h elements for E experts of C token
    slots, s·b·k·h at capacity factor 1, as traced with every rank holding all s·b tokens and each
    expert split over the t ranks); `combined_activation_bytes` (of the rest) what the combine keeps
    of the experts' outputs at width h (the partial sums it weighs by the router's probabilities,
    s·b·k·h elements as traced); `solver.training_step.memory` prices what a rank keeps of both;
    `recompute_modules` what recomputing each of its recompute modules changes;
    `parameter_tensors` the elements of each weight tensor it reads (per rank: what a framework
    gathering each tensor apart issues one collective for); `product_output_bytes` (and its
    replicated part) the outputs of the weight products a block keeps besides its input when only
    those are saved (`product_outputs`: JAX's checkpoint_dots_with_no_batch_dims).
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
    fused_attention_activation_bytes: int = 0
    fused_replicated_activation_bytes: int | None = None
    matrix_input_activation_bytes: int = 0
    replicated_matrix_input_activation_bytes: int = 0
    matrix_parameter_bytes: int = 0
    key_value_bytes: int = 0
    expert_forward_collective_bytes: tuple[int, ...] = ()
    expert_backward_collective_bytes: tuple[int, ...] = ()
    recompute_modules: tuple[RecomputedModule, ...] = ()
    parameter_tensors: tuple[int, ...] = ()
    product_output_bytes: int = 0
    replicated_product_output_bytes: int = 0
    dispatched_activation_bytes: int = 0
    combined_activation_bytes: int = 0

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
class TiedWeight:
    """A weight read by two layers (a tied embedding: the word table and the logits' product): held
    once when both are on one device. Bytes per rank."""

    first: int
    second: int
    bytes: int


@dataclass(frozen=True)
class LayerGraph:
    layers: tuple[Layer, ...]
    edges: tuple[LayerEdge, ...]
    tensor_parallel_width: int
    tied: tuple[TiedWeight, ...] = ()

    def layer(self, layer_id: int) -> Layer:
        return next(layer for layer in self.layers if layer.id == layer_id)


def _is_gate_activation(graph: OpGraph, source: int | None) -> bool:
    """`source` is an activation that keeps its own input (`_GATE_ACTIVATIONS`)."""
    return source is not None and graph.nodes[source].op in _GATE_ACTIVATIONS


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
        # each operand is needed for the other's gradient, which exists if that one is trained; a
        # gated unit's activation (act(gate) · up) is fused with its product: rebuilt from the gate
        # its activation keeps, not kept
        trained = [source is not None for source in node.inputs] + [True] * len(node.weight_shapes)
        return [item for position in range(len(node.inputs)) if sum(trained) - trained[position] > 0
                and not (node.op == "mul" and _is_gate_activation(graph, node.inputs[position]))
                for item in produced(position)]
    return []  # add, sub, neg, comparisons, sum, amax (a detached shift in the loss), shape ops, collectives


def _layer_name(nodes: tuple[OpNode, ...]) -> str:
    parts = nodes[0].module_path.split(".")
    return ".".join(parts[:2]) if parts[0] == "layers" else parts[0]


def _layer_kind(name: str) -> str:
    return "block" if name.startswith("layers.") else "embedding" if name == "embedding" else "head"


def _collective_bytes(nodes: tuple[OpNode, ...], direction: str, group: str = "tensor") -> tuple[int, ...]:
    return tuple(node.output_bytes for node in nodes
                 if node.kind == "allreduce" and node.attr("group_size", 1) > 1 and node.attr("direction") == direction
                 and node.attr("group", "tensor") == group)


def _expert_weights(nodes: tuple[OpNode, ...]) -> set[str]:
    """Names of the experts' weights: those of the per-expert products."""
    return {name for node in nodes if node.op == "grouped_linear" for name in node.weight_names}


def _saved(graph: OpGraph, nodes: tuple[OpNode, ...], matrix: tuple[bool, ...], skipped: frozenset[int] = frozenset()
           ) -> tuple[dict, set]:
    """(tensor key -> bytes saved for the backward pass, keys only block weight products keep), over
    the layer's operators not in `skipped`."""
    saved: dict[tuple[str, int], int] = {}
    others: set[tuple[str, int]] = set()
    for node in nodes:
        if node.id in skipped:
            continue
        for key, size in saved_tensors(node, graph):
            saved[key] = size
            if not matrix[node.id]:
                others.add(key)
    return saved, set(saved) - others


def _routed(graph: OpGraph, nodes: tuple[OpNode, ...], saved: dict, replicated: tuple[bool, ...],
            returned: frozenset[int]) -> tuple[set, set]:
    """Keys of the layer's saved tensors holding its routed tokens at the model's width: (the
    replicated ones only the experts' products keep, those the combine keeps of the experts'
    outputs `returned`, not replicated)."""
    keepers: dict[tuple[str, int], set[str]] = {}
    for node in nodes:
        for key, _ in saved_tensors(node, graph):
            keepers.setdefault(key, set()).add(node.op)
    dispatched = {key for key, ops in keepers.items() if ops == {"grouped_linear"} and replicated[key[1]]}
    return dispatched, {key for key in saved if key[1] in returned and not replicated[key[1]]}


def _recomputed(graph: OpGraph, nodes: tuple[OpNode, ...], module: frozenset[int], saved: dict, matrix_inputs: set,
                replicated: tuple[bool, ...], name: str, fused: dict, kernels, routed: tuple[set, set]
                ) -> RecomputedModule:
    """What recomputing the operators `module` of a layer (its `nodes`, its `saved` tensors; with
    fused attention `kernels`, the `fused` ones and the kernels' inputs; its `routed` keys,
    dispatched and combined) changes: the saved tensors whose storage the module made (a view of its
    input stays its input)."""
    dropped = [key for key in saved if made_by(graph, key[1]) in module]
    inside = tuple(node for node in nodes if node.id in module)
    made = [(size, replicated[key[1]]) for key, size in fused.items() if made_by(graph, key[1]) in module] + [
        (size, replicated[source]) for kernel in kernels for source, size in kernel.inputs
        if made_by(graph, source) in module]
    unfused = sum(saved[key] for key in dropped)
    fused_bytes = sum(size for size, _ in made)
    return RecomputedModule(
        name=name,
        activation_bytes=unfused,
        replicated_activation_bytes=sum(saved[key] for key in dropped if replicated[key[1]]),
        matrix_input_activation_bytes=sum(saved[key] for key in dropped if key in matrix_inputs),
        replicated_matrix_input_activation_bytes=sum(saved[key] for key in dropped
                                                     if key in matrix_inputs and replicated[key[1]]),
        forward_collective_bytes=_collective_bytes(inside, "forward"),
        expert_forward_collective_bytes=_collective_bytes(inside, "forward", EXPERT_TENSOR),
        all_to_all_bytes=tuple(node.output_bytes for node in inside if node.kind == "alltoall"),
        fused_attention_activation_bytes=None if fused_bytes == unfused else fused_bytes,
        fused_replicated_activation_bytes=None if fused_bytes == unfused else sum(
            size for size, copied in made if copied),
        dispatched_activation_bytes=sum(saved[key] for key in dropped if key in routed[0]),
        combined_activation_bytes=sum(saved[key] for key in dropped if key in routed[1]))


def product_outputs(graph: OpGraph, layer_id: int, saved: dict, matrix: tuple[bool, ...],
                    derived: tuple[bool, ...]) -> frozenset[int]:
    """The operators of layer `layer_id` whose outputs a block keeps when only its weight products'
    outputs and its input are saved (module docstring): walking back from each tensor of `saved` (what
    the backward reads) through the operators that rebuild it, the weight products (`matrix`) and the
    forward all-reduces completing their partial sums met first. The walk stops at another layer's
    tensor (the block's input, kept anyway), at one built from the model's inputs alone (`derived`:
    positions, masks, rotary tables) and at a dropout mask (drawn again)."""
    kept: set[int] = set()
    seen: set[int] = set()
    stack = [node for kind, node in saved if kind == "out"]
    while stack:
        node_id = stack.pop()
        if node_id in seen:
            continue
        seen.add(node_id)
        node = graph.nodes[node_id]
        if node.layer != layer_id or derived[node_id]:
            continue
        if matrix[node_id] or (node.kind == "allreduce" and node.attr("direction") == "forward"):
            kept.add(node_id)
            continue
        stack.extend(source for source in node.inputs if source is not None)
    return frozenset(kept)


def _replicated_bytes(saved: dict, replicated: tuple[bool, ...]) -> int:
    """The bytes of `saved` (tensor key -> bytes) identical on every rank."""
    return sum(size for (_, node), size in saved.items() if replicated[node])


def _fused_replicated(fused: dict, kernels, replicated: tuple[bool, ...], unfused: int) -> int | None:
    """The replicated part of a layer's saved tensors with its attention cores fused (`fused`: those
    outside the kernels; a kernel's Q, K, V and statistics replicated where its inputs are); None
    where it is `unfused`, the replicated part without fused kernels."""
    made = _replicated_bytes(fused, replicated) + sum(
        kernel.saved_bytes for kernel in kernels if all(replicated[source] for source, _ in kernel.inputs))
    return None if made == unfused else made


def build_layer_graph(graph: OpGraph, dtype_bytes: int = 2) -> LayerGraph:
    """Contract the op graph into layers; parameters are counted once per layer that reads them (a
    weight two layers read is also in `tied`). An edge between layers carries the tensors one layer
    computes and another reads, but those built from the inputs alone (`input_derived`)."""
    replicated, core = replicated_outputs(graph), attention_core(graph)
    modules = recompute_modules(graph)
    kernels = attention_kernels(graph)
    matrix_products = block_weight_products(graph)
    returned = expert_outputs(graph)
    crossing: dict[tuple[int, int], dict[int, int]] = {}
    built_by_every_stage = input_derived(graph)
    for source, dest in graph.edges:
        pair = (graph.nodes[source].layer, graph.nodes[dest].layer)
        if pair[0] != pair[1] and not built_by_every_stage[source]:
            crossing.setdefault(pair, {})[source] = graph.nodes[source].output_bytes
    layers, first_reader, tied = [], {}, []
    for layer_id in graph.layers:
        nodes = graph.layer_nodes(layer_id)
        weights, experts = weight_sizes(nodes), _expert_weights(nodes)
        saved, matrix_inputs = _saved(graph, nodes, matrix_products)
        routed = _routed(graph, nodes, saved, replicated, returned)
        layer_kernels = [kernel for kernel in kernels if kernel.layer == layer_id]
        skipped = frozenset().union(*(kernel.members for kernel in layer_kernels))
        fused, _ = _saved(graph, nodes, matrix_products, skipped)
        fused_bytes = sum(fused.values()) + sum(kernel.saved_bytes for kernel in layer_kernels)
        replicated_saved = _replicated_bytes(saved, replicated)
        inputs = {source: size for (_, dest), sizes in crossing.items() if dest == layer_id for source, size in sizes.items()}
        matrix = {name for node in nodes if matrix_products[node.id] for name in node.weight_names}
        for name, size in weights.items():
            if name in first_reader:
                tied.append(TiedWeight(first_reader[name], layer_id, size * dtype_bytes))
            else:
                first_reader[name] = layer_id
        name = _layer_name(nodes)
        products = product_outputs(graph, layer_id, saved, matrix_products, built_by_every_stage)
        layers.append(
            Layer(
                id=layer_id,
                name=name,
                kind=_layer_kind(name),
                parameter_bytes=sum(weights.values()) * dtype_bytes,
                parameter_tensors=tuple(weights.values()),
                activation_bytes=sum(saved.values()),
                replicated_activation_bytes=replicated_saved,
                attention_core_activation_bytes=sum(size for (_, node), size in saved.items() if node in core),
                input_bytes=sum(inputs.values()),
                replicated_input_bytes=sum(size for source, size in inputs.items() if replicated[source]),
                tensor_parallel=any(
                    node.kind == "allreduce" and node.attr("group_size", 1) > 1 for node in nodes
                ),
                forward_flops=sum(node.flops for node in nodes),
                forward_collective_bytes=_collective_bytes(nodes, "forward"),
                backward_collective_bytes=_collective_bytes(nodes, "backward"),
                expert_forward_collective_bytes=_collective_bytes(nodes, "forward", EXPERT_TENSOR),
                expert_backward_collective_bytes=_collective_bytes(nodes, "backward", EXPERT_TENSOR),
                expert_parameter_bytes=sum(size for name, size in weights.items() if name in experts) * dtype_bytes,
                all_to_all_bytes=tuple(node.output_bytes for node in nodes if node.kind == "alltoall"),
                fused_attention_activation_bytes=fused_bytes,
                fused_replicated_activation_bytes=_fused_replicated(fused, layer_kernels, replicated, replicated_saved),
                matrix_input_activation_bytes=sum(saved[key] for key in matrix_inputs),
                replicated_matrix_input_activation_bytes=sum(saved[key] for key in matrix_inputs if replicated[key[1]]),
                matrix_parameter_bytes=sum(size for name, size in weights.items() if name in matrix) * dtype_bytes,
                key_value_bytes=sum(kernel.key_value_bytes for kernel in layer_kernels),
                recompute_modules=tuple(
                    _recomputed(graph, nodes, ids, saved, matrix_inputs, replicated, name, fused, layer_kernels, routed)
                    for name, ids in modules.items() if any(node.id in ids for node in nodes)),
                product_output_bytes=sum(graph.nodes[node].output_bytes for node in products),
                replicated_product_output_bytes=sum(graph.nodes[node].output_bytes for node in products
                                                    if replicated[node]),
                dispatched_activation_bytes=sum(saved[key] for key in routed[0]),
                combined_activation_bytes=sum(saved[key] for key in routed[1]),
            )
        )
    edges = tuple(LayerEdge(src, dst, sum(sizes.values())) for (src, dst), sizes in crossing.items())
    return LayerGraph(layers=tuple(layers), edges=edges, tensor_parallel_width=graph.tensor_parallel_width,
                      tied=tuple(tied))
