"""Operator fusion within one layer, on our op graph: the rules of the original program
(msr-fiddle/phaze at fed7cde, `third_party_for_phaze/wham/op_fusion/fusion.py`, `fusion.fuse`).

Free operators (views, embeddings, gathers) are made transparent first: they vanish and the
precedence they carried is kept. Then, in program order, a group grows while
* rule A: the head is a GEMM, its single successor is an activation, injective, norm, dropout or
  masked_fill op, and that successor is fed only by the group; or
* rule B: the head is injective, its single successor is injective, a reduction or a dropout, and
  that successor is fed only by the group.
A GEMM group with fused ops is a TCandVC operator; the fused elementwise work is costed at its
real size on the vector cores. The original adds the fused ops' per-element cycles once, as a
constant, to the GEMM's latency (`wham/perf_wrappers/tensor_core_wrapper.py` lines 776-793), and
costs a fused vector chain by its fused-in ops only, without the head's own cycles
(`wham/perf_wrappers/vector_core_estimator.py` lines 101-127).
"""

from __future__ import annotations

from dataclasses import dataclass

from estimator.work import NOP, TC, TC_AND_VC, core_type, fusion_class
from graph_extract.opgraph import OpGraph

EPILOGUE = ("activation", "injective", "norm", "dropout", "transformation")
CHAIN = ("injective", "reduction", "dropout")
_BOUNDARY = -1  # a graph input or output reached through free operators only


@dataclass(frozen=True)
class FusedOp:
    """Operators executed as one: node ids in execution order, the head (which names it) first."""

    members: tuple[int, ...]
    core_type: str


@dataclass(frozen=True)
class FusedGraph:
    """The fused operators of one layer in forward program order and the forward edges between them."""

    layer: int
    ops: tuple[FusedOp, ...]
    edges: tuple[tuple[int, int], ...]


class _Reach:
    """Neighbours of costly operators once free operators are looked through."""

    def __init__(self, graph: OpGraph) -> None:
        self.graph = graph
        self.free = [core_type(node) == NOP for node in graph.nodes]
        self.succ: list[list[int]] = [[] for _ in graph.nodes]
        self.pred: list[list[int]] = [[] for _ in graph.nodes]
        for src, dst in graph.edges:
            self.succ[src].append(dst)
            self.pred[dst].append(src)

    def _through_free(self, start: int, step: list[list[int]]) -> frozenset[int]:
        found, stack, seen = set(), list(step[start]), set()
        while stack:
            node = stack.pop()
            if node in seen:
                continue
            seen.add(node)
            if not self.free[node]:
                found.add(node)
            elif step[node]:
                stack.extend(step[node])
            else:
                found.add(_BOUNDARY)
        return frozenset(found)

    def successors(self, node: int) -> frozenset[int]:
        return self._through_free(node, self.succ)

    def predecessors(self, node: int) -> frozenset[int]:
        return self._through_free(node, self.pred)


def _fuses(head_class: str, tail: int, reach: _Reach, layer: int) -> int | None:
    """The successor the group ending at `tail` absorbs next, if a rule allows it."""
    successors = reach.successors(tail)
    if len(successors) != 1:
        return None
    (nxt,) = successors
    if nxt == _BOUNDARY or reach.graph.nodes[nxt].layer != layer or reach.predecessors(nxt) != {tail}:
        return None
    allowed = EPILOGUE if head_class == "gemm" else CHAIN if head_class == "injective" else ()
    return nxt if fusion_class(reach.graph.nodes[nxt]) in allowed else None


def _fuse(reach: _Reach, layer: int) -> FusedGraph:
    graph = reach.graph
    costly = [node.id for node in graph.layer_nodes(layer) if not reach.free[node.id]]
    group_of: dict[int, int] = {}
    ops: list[FusedOp] = []
    for node in costly:
        if node in group_of:
            continue
        members, head_class = [node], fusion_class(graph.nodes[node])
        while (nxt := _fuses(head_class, members[-1], reach, layer)) is not None:
            members.append(nxt)
        kind = core_type(graph.nodes[node])
        ops.append(FusedOp(tuple(members), TC_AND_VC if kind == TC and len(members) > 1 else kind))
        group_of.update((member, len(ops) - 1) for member in members)
    edges = {(group_of[member], group_of[succ])
             for op in ops for member in op.members for succ in reach.successors(member)
             if succ in group_of and group_of[succ] != group_of[member]}
    return FusedGraph(layer, tuple(ops), tuple(sorted(edges)))


def fuse_attention(fused: FusedGraph, cores: list[frozenset[int]]) -> tuple[FusedGraph, dict[int, int]]:
    """The layer with the operators of each attention core (`graph_extract.attention`) as one fused
    operator, at the place of the first of them; and, per core (by its position in `cores`), the
    index of its operator."""
    index_of: dict[int, int] = {}
    ops: list[FusedOp] = []
    merged: dict[int, int] = {}
    for old, op in enumerate(fused.ops):
        core = next((position for position, members in enumerate(cores) if op.members[0] in members), None)
        if core is None:
            index_of[old] = len(ops)
            ops.append(op)
        elif core in merged:
            index_of[old] = merged[core]
            kept = ops[merged[core]]
            ops[merged[core]] = FusedOp(kept.members + op.members, TC_AND_VC)
        else:
            index_of[old] = merged[core] = len(ops)
            ops.append(FusedOp(op.members, TC_AND_VC))
    edges = {(index_of[a], index_of[b]) for a, b in fused.edges if index_of[a] != index_of[b]}
    order = _topological(len(ops), edges)  # operators stay numbered in a topological order
    position = {old: new for new, old in enumerate(order)}
    return (FusedGraph(fused.layer, tuple(ops[old] for old in order),
                       tuple(sorted((position[a], position[b]) for a, b in edges))),
            {core: position[index] for core, index in merged.items()})


def _topological(count: int, edges: set[tuple[int, int]]) -> list[int]:
    """The operators in a topological order, each as early in its present order as its inputs allow."""
    waiting = [0] * count
    users: dict[int, list[int]] = {}
    for a, b in edges:
        waiting[b] += 1
        users.setdefault(a, []).append(b)
    ready = [op for op in range(count) if not waiting[op]]
    order: list[int] = []
    while ready:
        op = min(ready)
        ready.remove(op)
        order.append(op)
        for user in users.get(op, ()):
            waiting[user] -= 1
            if not waiting[user]:
                ready.append(user)
    return order


def fuse_layers(graph: OpGraph, layers: tuple[int, ...]) -> tuple[FusedGraph, ...]:
    """Fuse the operators of each layer; free operators are dropped, their precedence kept."""
    reach = _Reach(graph)
    return tuple(_fuse(reach, layer) for layer in layers)
