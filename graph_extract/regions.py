"""Passes over an op graph that the cost paths need: which tensors are replicated over the
tensor-parallel group, which operators form the attention cores, and which are the blocks' weight
products.

* Replicated (identical on every rank of the group): model inputs and buffers, the output of a
  forward all-reduce, and any operator fed only by replicated tensors and no sharded parameter.
  A column-parallel product, a row-parallel partial sum and anything they feed until the next
  all-reduce are sharded. Sequence parallelism (Korthikanti et al. 2022) splits exactly the
  replicated activations over the t ranks. Simplification: a tensor computed from replicated
  inputs with a rank-dependent constant (the vocabulary offset of an index) counts as replicated.
* Attention core: two activation products (QKᵀ and ·V) and the operators on the paths between
  them (mask, softmax, dropout); what Megatron's selective recomputation re-runs.
* Recompute modules: the operators of each block that Megatron-Core's `--recompute-modules`
  re-runs besides the attention core (`RECOMPUTE_MODULES`; megatron/core/transformer/
  transformer_config.py, `recompute_modules`), found by the block's child module that issued them
  (`recompute_modules`): `layernorm` the block's own norms (input_layernorm and pre_mlp_layernorm),
  `mlp` a dense block's feed-forward network, `moe` a mixture's whole layer (router, dispatch,
  experts, combine, shared experts), `moe_act` the operators between the experts' up and down
  products (their activation function), `shared_experts` the shared experts' network,
  `mla_up_proj` a latent attention's up projections and what runs between the attention's
  products and its core (the rotary embedding's application, the scaling, the joins).
* Routed tokens: the experts' outputs on their way back to their tokens (`expert_outputs`): the
  operators a mixture's down products feed, up to the next weight product, traced at width t as
  partial sums of all s·b tokens on every rank (`graph_extract.layergraph` counts what the combine
  keeps of them apart, with the experts' replicated inputs: a rank keeps a share of them that
  depends on the expert tensor-parallel width).
"""

from __future__ import annotations

from graph_extract.opgraph import OpGraph, OpNode

#: Megatron-Core's recompute modules phaze prices, in alphabetical order: `core_attn` (the attention
#: core, `attention_core`) and the modules `recompute_modules` finds.
RECOMPUTE_MODULES = ("core_attn", "layernorm", "mla_up_proj", "mlp", "moe", "moe_act", "shared_experts")
#: Modules that hold others: recomputing the outer re-runs the inner ones.
NESTED = {"moe": ("moe_act", "shared_experts")}
#: PyTorch's operator-level selective activation checkpointing as torchtitan applies it to each block
#: (torchtitan/distributed/activation_checkpoint.py, `_save_list` and `_get_custom_policy`, with
#: selective_ac_option "op"): the outputs of the attention kernels, of the collectives and of every
#: other matrix product (the 1st, 3rd, ... of the block's forward: torchtitan counts the block's
#: aten.mm calls and recomputes the even ones) are saved; every other operator is re-run
#: (`op_level_operators`).
OP_LEVEL = "op_level"


def block_weight_products(graph: OpGraph) -> tuple[bool, ...]:
    """Per operator (by id): whether it is a weight product of a transformer block (the layers between
    the first, the embedding, and the last, the head): what FP8 training runs in FP8."""
    blocks = set(graph.layers[1:-1])
    return tuple(node.kind == "gemm" and node.layer in blocks for node in graph.nodes)


def _uses_sharded_weight(node: OpNode, sharded: frozenset[str]) -> bool:
    return any(name in sharded for name in node.weight_names)


def replicated_outputs(graph: OpGraph) -> tuple[bool, ...]:
    """Per operator (by id): is its output the same on every rank of the tensor-parallel group?"""
    replicated: list[bool] = []
    for node in graph.nodes:  # program order is a topological order
        inputs = all(source is None or replicated[source] for source in node.inputs)
        if node.kind == "allreduce" and node.attr("direction") == "forward":
            replicated.append(True)
        else:
            replicated.append(inputs and not _uses_sharded_weight(node, graph.sharded_parameters))
    return tuple(replicated)


def expert_outputs(graph: OpGraph) -> frozenset[int]:
    """Ids of the operators a mixture's down products (the grouped products whose output no grouped
    product reads) feed, up to the next weight product: the experts' outputs returned to their tokens,
    weighted and summed (the combine)."""
    successors: dict[int, list[int]] = {}
    for source, dest in graph.edges:
        successors.setdefault(source, []).append(dest)
    found: set[int] = set()
    for node in graph.nodes:
        if node.op != "grouped_linear":
            continue
        after = _reach(node.id, successors, graph)
        if not any(graph.nodes[later].op == "grouped_linear" for later in after):
            found.update(later for later in after if graph.nodes[later].kind not in ("gemm", "bmm"))
    return frozenset(found)


def input_derived(graph: OpGraph) -> tuple[bool, ...]:
    """Per operator (by id): is its output computed from the model's inputs and buffers alone (no
    parameter on any path into it)? Positions, masks and rotary tables are: every pipeline stage
    builds them from the batch it is given, none is sent between stages."""
    derived: list[bool] = []
    for node in graph.nodes:  # program order is a topological order
        derived.append(not node.weight_names and all(source is None or derived[source] for source in node.inputs))
    return tuple(derived)


def attention_cores(graph: OpGraph) -> tuple[frozenset[int], ...]:
    """The operator ids of each attention core: a product of activations, the product that consumes
    it, and the operators on the paths between them (none of them a weight product)."""
    successors: dict[int, list[int]] = {}
    predecessors: dict[int, list[int]] = {}
    for source, dest in graph.edges:
        successors.setdefault(source, []).append(dest)
        predecessors.setdefault(dest, []).append(source)
    products = [node.id for node in graph.nodes if node.kind == "bmm"]
    cores = []
    for first in products:
        reached = _reach(first, successors, graph)
        for second in (node for node in reached if graph.nodes[node].kind == "bmm"):
            between = reached & _reach(second, predecessors, graph)
            cores.append(frozenset(between | {first, second}))
    return tuple(cores)


def attention_core(graph: OpGraph) -> frozenset[int]:
    """Ids of the operators of every attention core (`attention_cores`)."""
    return frozenset().union(*attention_cores(graph))


def _reach(start: int, step: dict[int, list[int]], graph: OpGraph) -> set[int]:
    """Operators reachable from `start` along `step` without passing through a product."""
    found: set[int] = set()
    stack = list(step.get(start, ()))
    while stack:
        node = stack.pop()
        if node in found or graph.nodes[node].layer != graph.nodes[start].layer:
            continue
        found.add(node)
        if graph.nodes[node].kind not in ("gemm", "bmm"):
            stack.extend(step.get(node, ()))
    return found


def made_by(graph: OpGraph, node_id: int) -> int:
    """The operator that made the storage of `node_id`'s output: through the views and layout changes
    of one input and the tensor-parallel copies (identities forward: backward all-reduces)."""
    node = graph.nodes[node_id]
    while (len(node.inputs) == 1 and node.inputs[0] is not None
           and (node.kind == "shape" or (node.kind == "allreduce" and node.attr("direction") == "backward"))):
        node = graph.nodes[node.inputs[0]]
    return node.id


def _block_paths(graph: OpGraph) -> dict[int, tuple[str, ...]]:
    """Each layer's module path (as parts): the longest one every operator of the layer lies under
    (`layers.3` in the zoo, `model.layers.3` in a Hugging Face-style model)."""
    paths: dict[int, tuple[str, ...]] = {}
    for node in graph.nodes:
        parts = tuple(node.module_path.split("."))
        common = paths.get(node.layer, parts)
        length = next((i for i, (a, b) in enumerate(zip(common, parts)) if a != b), min(len(common), len(parts)))
        paths[node.layer] = common[:length]
    return paths


def _child(node: OpNode, blocks: dict[int, tuple[str, ...]]) -> str | None:
    """The path of the child module of its block that issued `node` (`layers.3.mlp`), or None (the
    block's own forward)."""
    block, parts = blocks[node.layer], node.module_path.split(".")
    return ".".join(parts[:len(block) + 1]) if len(parts) > len(block) else None


def recompute_modules(graph: OpGraph) -> dict[str, frozenset[int]]:
    """The operator ids of each recompute module but `core_attn` (module docstring), over every block of
    `graph`; a module no block has is absent. Found by structure, so a model of the zoo and one a
    user's factory builds agree: the norms are the norm operators a block's own children issue (not
    those inside its attention, as Qwen3's QK-norm or a latent's); the feed-forward network is the
    child holding weight products but no attention core, a mixture's the one holding grouped expert
    products; shared experts are its sub-module named so (`shared...`); a latent attention's up
    projections are the products of the attention child fed by a norm of that child (the latents'),
    and `mla_up_proj` holds them with the operators on the paths from its products to its core
    (Megatron-Core has the module for multi-head latent attention only; other attentions: none)."""
    blocks, paths = set(graph.layers[1:-1]), _block_paths(graph)
    each_core = attention_cores(graph)
    core = frozenset().union(*each_core)
    attention = {_child(graph.nodes[node], paths) for node in core}
    products = {_child(node, paths) for node in graph.nodes if node.kind == "gemm" and node.layer in blocks}
    feed_forward = products - attention - {None}
    mixtures = {_child(node, paths) for node in graph.nodes if node.op == "grouped_linear"}
    successors: dict[int, list[int]] = {}
    predecessors: dict[int, list[int]] = {}
    for source, dest in graph.edges:
        successors.setdefault(source, []).append(dest)
        predecessors.setdefault(dest, []).append(source)
    found: dict[str, set[int]] = {}
    for cores in each_core:
        sources = _attention_products(graph, cores, paths)
        if up_projections := _up_projections(graph, sources, paths):
            toward = set().union(*(_reach(node, predecessors, graph) for node in cores if graph.nodes[node].kind == "bmm"))
            found.setdefault("mla_up_proj", set()).update(
                up_projections, *((_reach(source, successors, graph) & toward) - cores for source in sources))
    for node in graph.nodes:
        child = _child(node, paths) if node.layer in blocks else None
        if child is None:
            continue
        if node.kind == "norm" and node.module_path == child:
            found.setdefault("layernorm", set()).add(node.id)
        if child not in feed_forward:
            continue
        found.setdefault("moe" if child in mixtures else "mlp", set()).add(node.id)
        inner = node.module_path[len(child) + 1:].split(".")[0]
        if child in mixtures and inner.startswith("shared"):
            found.setdefault("shared_experts", set()).add(node.id)
        if node.op == "grouped_linear":  # the operators between an up product and the down product it feeds
            after = _reach(node.id, successors, graph)
            for later in (later for later in after if graph.nodes[later].op == "grouped_linear"):
                if between := after & _reach(later, predecessors, graph):
                    found.setdefault("moe_act", set()).update(between)
    if blocks:
        found[OP_LEVEL] = set(op_level_operators(graph, blocks, core))
    return {name: frozenset(ids) for name, ids in found.items()}


def op_level_operators(graph: OpGraph, blocks: set[int], core: frozenset[int]) -> frozenset[int]:
    """The operators of the blocks `blocks` that torchtitan's operator-level selective checkpointing
    re-runs (`OP_LEVEL`): all but the attention core `core` (a fused kernel's saved outputs), the
    collectives and every other weight product, in the order the block's forward issues them (a
    simplification: phaze's products are the traced module's; a model that fuses Q, K and V into one
    product counts one where torchtitan's Llama counts three)."""
    found: set[int] = set()
    for block in blocks:
        members = [node for node in graph.nodes if node.layer == block]
        products = [node.id for node in members if node.kind == "gemm"]
        kept = set(products[0::2])
        found.update(node.id for node in members
                     if node.id not in kept and node.id not in core and node.kind not in ("allreduce", "alltoall"))
    return frozenset(found)


def _attention_products(graph: OpGraph, cores: frozenset[int], paths: dict[int, tuple[str, ...]]) -> list[int]:
    """The weight products of the attention child of a block holding the core `cores` (none outside
    the blocks)."""
    first = graph.nodes[min(cores)]
    if first.layer not in graph.layers[1:-1]:
        return []
    child = _child(first, paths)
    return [node.id for node in graph.nodes
            if node.layer == first.layer and node.kind == "gemm" and _child(node, paths) == child]


def _up_projections(graph: OpGraph, products: list[int], paths: dict[int, tuple[str, ...]]) -> set[int]:
    """Of an attention's weight `products`, its up projections: those whose input a norm of the same
    child makes (through views and copies: a latent's norm); none for an attention without latents."""
    found = set()
    for product in products:
        node = graph.nodes[product]
        if not node.inputs or node.inputs[0] is None:
            continue
        source, child = graph.nodes[made_by(graph, node.inputs[0])], _child(node, paths)
        if source.kind == "norm" and _child(source, paths) == child and source.module_path != child:
            found.add(product)
    return found
