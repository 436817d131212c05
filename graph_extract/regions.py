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
"""

from __future__ import annotations

from graph_extract.opgraph import OpGraph, OpNode


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
