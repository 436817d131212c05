"""A graph's costs on a mesh: a plan's time per training step (`CostModel.evaluate`) and the tables
the ILP reads (`CostModel.tables`), both from the same per-operator and per-edge rules
(strategies.py, resharding.py).

A plan's time is the sum over operators of compute and weight-gradient synchronisation, over edges
of the forward and backward conversions, and the boundary's conversions (graph.py): a graph input
read under `replicated` arrives Replicate and its reader's gradient is converted back to Replicate;
a graph output under `replicated` is converted to Replicate (its gradient arrives Replicate, which
any placement slices for free), under `any` only its Partial axes are all-reduced. The backward
conversions of a tensor read by several operators are priced once for the tensor (a "gradient
sum", resharding.py: each distinct gradient placement among its readers converted once), not on its
edges; in the ILP's tables a gradient sum whose producer and readers are all in one group is part
of that group's own cost, any other a `GradientSum`. Its memory per device is the sum of the
operators' parameter memory.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .graph import ShardingGraph
from .mesh import DeviceMesh
from .resharding import REPLICATE, TensorPlacement, conversion_cost, gradient_target, gradients_cost
from .shrink import Group, groups
from .strategies import CostSettings, Strategy, StrategyCost, strategies, strategy_cost


@dataclass(frozen=True, kw_only=True)
class PlanCost:
    """A plan's time per step [s] by kind, and its parameter memory per device [bytes]."""

    compute: float
    weight_sync: float
    resharding: float
    memory: float

    @property
    def total(self) -> float:
        return self.compute + self.weight_sync + self.resharding


@dataclass(frozen=True, kw_only=True)
class EdgeTable:
    """The cost of one edge between two groups: `cost[a, b]` with a = `source_class[k]` for the
    source group's choice k and b = `target_class[l]` for the target group's choice l (choices
    with the same placements on the edge, or the same row or column of costs, share a class)."""

    source: int
    target: int
    source_class: np.ndarray
    target_class: np.ndarray
    cost: np.ndarray


@dataclass(frozen=True, kw_only=True)
class GradientSum:
    """The backward conversions of one tensor read by operators of several groups. The producer's
    group `source` (None for a graph input) takes its choice k to the gradient target class
    `source_class[k]` (a graph input: the one class 0); each reader, a pair (group, class per choice
    of that group), to a gradient placement class q (numbered over all readers). The tensor pays
    `cost[a, q]` once for each q held by at least one reader, a its target class."""

    source: int | None
    source_class: np.ndarray
    readers: tuple[tuple[int, np.ndarray], ...]
    cost: np.ndarray

    def total(self, chosen: Sequence[int]) -> float:
        """Seconds under the choice `chosen[g]` of every group g."""
        target = 0 if self.source is None else self.source_class[chosen[self.source]]
        held = {int(classes[chosen[group]]) for group, classes in self.readers}
        return float(sum(self.cost[target, q] for q in held))


@dataclass(frozen=True, kw_only=True)
class Tables:
    """The ILP's data: groups, each choice's own cost [s] and memory [bytes], the edge tables and
    the gradient sums."""

    groups: tuple[Group, ...]
    node_cost: tuple[np.ndarray, ...]
    node_memory: tuple[np.ndarray, ...]
    edges: tuple[EdgeTable, ...]
    sums: tuple[GradientSum, ...] = ()


class CostModel:
    """Strategies and costs of the operators of `graph` on `mesh` (computed once, then looked up)."""

    def __init__(self, graph: ShardingGraph, mesh: DeviceMesh, settings: CostSettings):
        self.graph, self.mesh, self.settings = graph, mesh, settings
        self.strategies: tuple[tuple[Strategy, ...], ...] = tuple(strategies(op, mesh, settings) for op in graph.ops)
        self._costs: dict[tuple[int, int], StrategyCost] = {}
        # (reader op, operand position, producer op or None) for each read of a tensor
        self.reads = tuple((v, p, graph.producer.get(operand.tensor))
                           for v, op in enumerate(graph.ops) for p, operand in enumerate(op.inputs)
                           if not graph.tensor(operand.tensor).parameter)
        self._outputs = frozenset(graph.producer[name] for name in graph.outputs)
        # tensors read by several operators whose gradients are returned: (tensor, producer or None, reads)
        readers: dict[str, list[tuple[int, int]]] = {}
        for v, p, u in self.reads:
            if u is not None or graph.input_boundary == "replicated":
                readers.setdefault(graph.ops[v].inputs[p].tensor, []).append((v, p))
        self.gradient_sums = tuple((name, graph.producer.get(name), tuple(reads))
                           for name, reads in readers.items() if len(reads) > 1)
        self._summed_reads = frozenset(read for _, _, reads in self.gradient_sums for read in reads)

    def cost(self, v: int, k: int) -> StrategyCost:
        if (v, k) not in self._costs:
            self._costs[v, k] = strategy_cost(self.graph, self.graph.ops[v], self.strategies[v][k], self.mesh,
                                              self.settings)
        return self._costs[v, k]

    def _bytes(self, v: int, p: int) -> int:
        return self.graph.tensor(self.graph.ops[v].inputs[p].tensor).bytes

    def own(self, v: int, k: int) -> tuple[float, float, float]:
        """Operator v's compute, weight sync and boundary conversions under its strategy k."""
        graph, cost = self.graph, self.cost(v, k)
        boundary = 0.0
        if graph.input_boundary == "replicated":
            replicated = tuple(REPLICATE for _ in self.mesh.axes)
            for reader, p, producer in self.reads:
                if reader == v and producer is None and (v, p) not in self._summed_reads:
                    boundary += conversion_cost(self.mesh, self._bytes(v, p), cost.gradients[p], replicated)
        if v in self._outputs:
            target = (tuple(REPLICATE for _ in self.mesh.axes) if graph.output_boundary == "replicated"
                      else gradient_target(cost.output))
            boundary += conversion_cost(self.mesh, graph.tensor(graph.ops[v].output.tensor).bytes, cost.output, target)
        return cost.compute, cost.weight_sync, boundary

    def edge(self, u: int, i: int, v: int, j: int, p: int) -> float:
        """The edge from operator u (strategy i) to operand p of operator v (strategy j): forward, and
        backward unless the tensor's gradients are returned together (`gradient_sum`)."""
        reader, output = self.cost(v, j), self.cost(u, i).output
        seconds = conversion_cost(self.mesh, self._bytes(v, p), output, reader.reads[p])
        if (v, p) not in self._summed_reads:
            seconds += conversion_cost(self.mesh, self._bytes(v, p), reader.gradients[p], gradient_target(output))
        return seconds

    def _target(self, u: int | None, i: int | None) -> TensorPlacement:
        """The placement the producer u (strategy i) takes its output's gradient in; Replicate for a graph input."""
        if u is None:
            return tuple(REPLICATE for _ in self.mesh.axes)
        return gradient_target(self.cost(u, i).output)

    def gradient_sum(self, name: str, u: int | None, i: int | None, reads: Sequence[tuple[int, int]],
                     chosen: Sequence[int]) -> float:
        """The backward conversions of tensor `name` written by u (strategy i; None: a graph input) and
        read by `reads` (operator, operand) under their strategies `chosen` (resharding.gradients_cost)."""
        gradients = [self.cost(v, j).gradients[p] for (v, p), j in zip(reads, chosen)]
        return gradients_cost(self.mesh, self.graph.tensor(name).bytes, gradients, self._target(u, i))

    def evaluate(self, plan: Mapping[str, Strategy]) -> PlanCost:
        """The cost of a plan giving every operator's strategy by name."""
        chosen = [self.strategies[v].index(plan[op.name]) for v, op in enumerate(self.graph.ops)]
        compute = sync = resharding = memory = 0.0
        for v, k in enumerate(chosen):
            own = self.own(v, k)
            compute, sync, resharding = compute + own[0], sync + own[1], resharding + own[2]
            memory += self.cost(v, k).memory
        for v, p, u in self.reads:
            if u is not None:
                resharding += self.edge(u, chosen[u], v, chosen[v], p)
        for name, u, reads in self.gradient_sums:
            resharding += self.gradient_sum(name, u, None if u is None else chosen[u], reads,
                                            [chosen[v] for v, _ in reads])
        return PlanCost(compute=compute, weight_sync=sync, resharding=resharding, memory=memory)

    def groups(self, merge: bool) -> tuple[Group, ...]:
        return groups(self.graph, self.strategies, lambda v, k: self.cost(v, k).output, merge)

    def tables(self, merge: bool = True) -> Tables:
        """The ILP's tables over the groups (merged followers when `merge`)."""
        found = self.groups(merge)
        group_of = {v: (g, slot) for g, group in enumerate(found) for slot, v in enumerate(group.members)}
        node_cost = [np.array([sum(sum(self.own(v, k)) for v, k in zip(group.members, choice))
                               for choice in group.choices]) for group in found]
        node_memory = [np.array([sum(self.cost(v, k).memory for v, k in zip(group.members, choice))
                                 for choice in group.choices]) for group in found]
        edges = []
        for v, p, u in self.reads:
            if u is None:
                continue
            (gu, su), (gv, sv) = group_of[u], group_of[v]
            source_choices = [choice[su] for choice in found[gu].choices]
            target_choices = [choice[sv] for choice in found[gv].choices]
            if gu == gv:
                node_cost[gu] += [self.edge(u, i, v, j, p) for i, j in zip(source_choices, target_choices)]
                continue
            source_keys = [self.cost(u, i).output for i in source_choices]
            target_keys = [(self.cost(v, j).reads[p], self.cost(v, j).gradients[p]) for j in target_choices]
            source_class, source_first = _classes(source_keys, source_choices)
            target_class, target_first = _classes(target_keys, target_choices)
            cost = np.array([[self.edge(u, i, v, j, p) for j in target_first] for i in source_first])
            # classes whose rows (columns) of costs are equal are one class
            cost, rows = np.unique(cost, axis=0, return_inverse=True)
            cost, columns = np.unique(cost, axis=1, return_inverse=True)
            source_class, target_class = rows.ravel()[source_class], columns.ravel()[target_class]
            edges.append(EdgeTable(source=gu, target=gv, source_class=source_class, target_class=target_class,
                                   cost=cost))
        sums = []
        for name, u, reads in self.gradient_sums:
            sum_table = self._gradient_sum_table(found, group_of, name, u, reads)
            if isinstance(sum_table, GradientSum):
                sums.append(sum_table)
            else:
                node_cost[sum_table[0]] += sum_table[1]
        return Tables(groups=found, node_cost=tuple(node_cost), node_memory=tuple(node_memory), edges=tuple(edges),
                      sums=tuple(sums))

    def _gradient_sum_table(self, found: tuple[Group, ...], group_of: dict[int, tuple[int, int]], name: str,
                            u: int | None, reads: tuple[tuple[int, int], ...]) -> GradientSum | tuple[int, np.ndarray]:
        """The gradient sum of tensor `name`: (group, cost per choice) when the producer and readers
        are all in one group, else a `GradientSum`."""
        involved = {group_of[v][0] for v, _ in reads} | ({group_of[u][0]} if u is not None else set())
        if len(involved) == 1:
            (g,) = involved
            members = found[g].members
            costs = []
            for choice in found[g].choices:
                strategy = dict(zip(members, choice))
                costs.append(self.gradient_sum(name, u, None if u is None else strategy[u], reads,
                                               [strategy[v] for v, _ in reads]))
            return g, np.array(costs)
        targets: dict[TensorPlacement, int] = {}
        if u is None:
            source, source_class = None, np.zeros(1, dtype=int)
            targets[self._target(None, None)] = 0
        else:
            source, slot = group_of[u]
            source_class = np.array([targets.setdefault(self._target(u, choice[slot]), len(targets))
                                     for choice in found[source].choices])
        gradients: dict[TensorPlacement, int] = {}
        readers = []
        for v, p in reads:
            g, slot = group_of[v]
            readers.append((g, np.array([gradients.setdefault(self.cost(v, choice[slot]).gradients[p], len(gradients))
                                         for choice in found[g].choices])))
        tensor_bytes = self.graph.tensor(name).bytes
        cost = np.array([[conversion_cost(self.mesh, tensor_bytes, gradient, target) for gradient in gradients]
                         for target in targets])
        return GradientSum(source=source, source_class=source_class, readers=tuple(readers), cost=cost)


def _classes(keys: list, choices: list[int]) -> tuple[np.ndarray, list[int]]:
    """Class index of each key (first-seen order) and one strategy index per class."""
    index: dict = {}
    first: list[int] = []
    for key, choice in zip(keys, choices):
        if key not in index:
            index[key] = len(first)
            first.append(choice)
    return np.array([index[key] for key in keys]), first
