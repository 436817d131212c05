"""Shrinking the graph before the ILP (Alpa, Zheng et al. OSDI'22, Sec. 4.2; CFP's repeated-segment
sharing): the ILP stays exact on the shrunk graph, whose space is a subset of the full one.

- Followers: an operator that is not a product (element-wise, normalise, view, route: its cost is
  small next to the products') is merged into the operator that writes its first operand written by
  an operator (its "leader"): for each strategy of the leader it takes the strategy that splits,
  over each axis, the dim its operand is sharded on in the leader's output placement (none where
  that output is Replicate or Partial, or where the dim is fixed or not divisible by the axis).
  Chains of followers follow the first non-follower. A group is a leader and its followers; one
  ILP variable vector per group. This assumes a follower never gains by a placement of its own:
  e.g. after a Partial output it reads the tensor Replicate (all-reduce), never as a Shard
  (reduce-scatter, as in sequence parallelism), which the unshrunk search may find.
- Repeated layers: structurally equal layer graphs (the same operators, dims, sizes and boundaries,
  names aside) take one plan, found once. Exact when each layer's boundary placements are fixed
  (`replicated`: layers then do not interact); with `any` boundaries, sharing is a restriction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from phaze_common.checks import InputError

from .graph import ShardingGraph
from .resharding import Shard, TensorPlacement
from .strategies import Strategy


@dataclass(frozen=True, kw_only=True)
class Group:
    """A leader operator and its followers (operator indices, the leader first); `choices[k]` is
    each member's strategy index when the leader takes its strategy k."""

    members: tuple[int, ...]
    choices: tuple[tuple[int, ...], ...]


def follow(strategies: Sequence[Strategy], operand_dims: tuple[str, ...], leader_output: TensorPlacement) -> int:
    """Index of the strategy (among a follower's `strategies`) that splits the dims its operand is
    sharded on in `leader_output`, where it can."""
    index = {strategy.splits: k for k, strategy in enumerate(strategies)}
    wanted = tuple(operand_dims[p.dim] if isinstance(p, Shard) else None for p in leader_output)
    if wanted in index:
        return index[wanted]
    # drop the dims the follower cannot split (fixed, not divisible), one axis at a time
    allowed = [{s.splits[axis] for s in strategies} for axis in range(len(wanted))]
    return index[tuple(dim if dim in allowed[axis] else None for axis, dim in enumerate(wanted))]


def groups(graph: ShardingGraph, table: Sequence[Sequence[Strategy]], outputs, merge: bool) -> tuple[Group, ...]:
    """The groups of `graph` (one per operator when `merge` is False); `table[v]` holds operator v's
    strategies and `outputs(v, k)` its output placement under strategy k."""
    leader_of: dict[int, int] = {}
    built: dict[int, list] = {}
    for v, op in enumerate(graph.ops):
        written = [(p, graph.producer[o.tensor]) for p, o in enumerate(op.inputs) if o.tensor in graph.producer]
        if merge and not op.heavy and written:
            position, u = written[0]
            leader = leader_of[u]
            members, choices = built[leader]
            slot = members.index(u)
            members.append(v)
            for choice in choices:
                choice.append(follow(table[v], op.inputs[position].dims, outputs(u, choice[slot])))
            leader_of[v] = leader
        else:
            leader_of[v] = v
            built[v] = [[v], [[k] for k in range(len(table[v]))]]
    return tuple(Group(members=tuple(members), choices=tuple(tuple(c) for c in choices))
                 for members, choices in built.values())


def _signature(graph: ShardingGraph) -> tuple:
    names: dict[str, int] = {}

    def canonical(name: str) -> int:
        return names.setdefault(name, len(names))

    tensors = {t.name: (t.shape, t.element_bytes, t.parameter) for t in graph.tensors}
    ops = tuple((op.kind, op.sizes, op.fixed, op.flops,
                 tuple((canonical(o.tensor), tensors[o.tensor], o.dims) for o in op.inputs),
                 (canonical(op.output.tensor), tensors[op.output.tensor], op.output.dims))
                for op in graph.ops)
    return graph.input_boundary, graph.output_boundary, ops


def representative(layers: Sequence[ShardingGraph]) -> ShardingGraph:
    """The first of structurally equal layer graphs (names aside); InputError if they differ."""
    if not layers:
        raise InputError("layers: must hold at least one layer graph")
    first = _signature(layers[0])
    for index, layer in enumerate(layers[1:], start=1):
        if _signature(layer) != first:
            raise InputError(f"layers[{index}]: must be structurally equal to layers[0]")
    return layers[0]
