"""Operator cuts: the operators of an op graph in `count` consecutive groups, the layers a pipeline's
stages are then made of, for a model without a list of repeated blocks (a straight-line module, a
U-shaped or branching graph), as the operator clustering of Alpa (Zheng et al. OSDI'22, in its
inter-operator pass) and TePDist (Alibaba PAI's HLO-based auto-parallel system, 2023) make layers
of operators.

The problem, over the units of `graph_extract.operator_units` (an operator that costs nothing and
reads one operator follows it; chains joined on request): give each unit u a group g(u) in
0..count-1 such that
* g(a) <= g(b) for every edge a -> b (no edge goes back to an earlier group), and
* every group holds at least one unit;
and minimise the bottleneck B = max over groups k of

    load(k) = sum of seconds(u) over the units u in k
              + seconds_per_byte x sum of bytes(p) over the operators p in groups before k
                                   of which some operator in k reads the output,

seconds(u) being the sum of its operators' costs (`operator_seconds`; by default FLOPs /
`flops_per_second`) and bytes(p) p's output bytes. A tensor enters a group once however many of its
operators read it, and only the groups that read it (it is not relayed through those in between).
Tie-break: among the groupings with the least B, the fewest crossing bytes (bytes(p) summed over
every (p, group it enters)), lexicographically, by a second solve with B held at the first one's: a
single objective B + w x bytes is lexicographic only if w x (all bytes) is below the least step of
B, one tick, and with bytes in the billions w would fall below 1e-9 of a tick, beyond integer
arithmetic. Every tensor read counts, also one built from the model's inputs alone that
`graph_extract.layergraph` leaves off its edges (every stage builds it).

Methods, both exact:
* "consecutive": when every unit feeds the next one (a chain, skip edges allowed) every valid
  grouping is a run of consecutive units per group (and one group is one grouping): two dynamic
  programmes (`graph_extract.operator_cuts_consecutive`), the least B, then the fewest bytes.
* "cp-sat" otherwise (`graph_extract.operator_cuts_cpsat`): booleans z[u, k] = (g(u) <= k) for
  k < count - 1 (z[u, count-1] = 1), z[u, k-1] <= z[u, k], and z[b, k] <= z[a, k] for each edge
  a -> b between units; x[u, k] = z[u, k] - z[u, k-1] (u in group k); sum over u of x[u, k] >= 1;
  for each set t of crossing tensors (producer unit p, reader units R) and group k >= 1 a boolean
  y[t, k] >= x[r, k] - x[p, k] for each r in R (a reader in k and the producer not, hence before
  k); sum over u of seconds(u) x[u, k] + sum over t of seconds_per_byte bytes(t) y[t, k] <= B.
  Minimise B; then, with B at most the optimum found, sum over t, k of bytes(t) y[t, k]. The search
  starts from the best grouping into runs of consecutive units in program order (valid for any
  graph), and implied constraints fix many z. Seconds are whole ticks there (about 1e-9 of the
  greatest possible load): the optimality proven is the rounded problem's. Graphs of a few hundred
  operators in transformer-like blocks take well under a second (`benchmarks/operator_cuts.py`);
  graphs where every grouping crosses many tensors can reach `time_limit`, and the result then says
  so (`optimal`, `gap`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from graph_extract.opgraph import OpGraph
from graph_extract.operator_cuts_consecutive import consecutive_grouping
from graph_extract.operator_cuts_cpsat import cpsat_grouping
from graph_extract.operator_units import Units, shrink
from phaze_common.checks import InputError, is_number, non_negative_number, positive_integer, positive_number

#: Methods: the dynamic programme over runs of consecutive units, CP-SAT.
METHODS = ("consecutive", "cp-sat")


@dataclass(frozen=True, kw_only=True)
class OperatorCuts:
    """A grouping of an op graph's operators: `groups[i]` is operator i's group (0..count-1);
    `group_seconds` each group's load, `bottleneck_seconds` the greatest, `crossing_bytes` the bytes
    entering groups (see the module's docstring); `lower_bound_seconds` a proven lower bound on the
    bottleneck; `optimal` whether the bottleneck and then the crossing bytes are proven least (for
    CP-SAT: of the problem with seconds in whole ticks); `method` one of METHODS; `units` how many
    units the operators shrank into."""

    groups: tuple[int, ...]
    group_seconds: tuple[float, ...]
    bottleneck_seconds: float
    crossing_bytes: int
    lower_bound_seconds: float
    optimal: bool
    method: str
    units: int

    @property
    def gap(self) -> float:
        """(bottleneck - lower bound) / bottleneck: 0 when the bound meets the bottleneck."""
        if self.bottleneck_seconds <= 0:
            return 0.0
        return max(0.0, self.bottleneck_seconds - self.lower_bound_seconds) / self.bottleneck_seconds


def group_loads(units: Units, groups: Sequence[int], count: int, seconds_per_byte: float) -> tuple[list[float], int]:
    """(load of each group in seconds, crossing bytes) of the grouping `groups` (one group per unit)."""
    sizes = [tensors.bytes for tensors in units.tensors]
    loads = units.loads(groups, count, units.seconds, [seconds_per_byte * size for size in sizes])
    return loads, round(sum(units.loads(groups, count, [0] * units.count, sizes)))


def _operator_seconds(graph: OpGraph, operator_seconds: Sequence[float] | None,
                      flops_per_second: float | None) -> list[float]:
    if operator_seconds is None:
        if flops_per_second is None:
            raise InputError("flops_per_second: must be a finite positive number when operator_seconds is not given")
        rate = positive_number("flops_per_second", flops_per_second)
        return [node.flops / rate for node in graph.nodes]
    costs = list(operator_seconds)
    if len(costs) != len(graph.nodes) or not all(is_number(cost) and cost >= 0 for cost in costs):
        raise InputError(f"operator_seconds: must be {len(graph.nodes)} finite numbers >= 0 (one per operator)")
    return [float(cost) for cost in costs]


def cut_operators(
    graph: OpGraph,
    count: int,
    *,
    seconds_per_byte: float,
    operator_seconds: Sequence[float] | None = None,
    flops_per_second: float | None = None,
    chain_seconds: float = 0.0,
    time_limit: float = 10.0,
    workers: int = 1,
) -> OperatorCuts:
    """The operators of `graph` in `count` groups with the least bottleneck, then the fewest crossing
    bytes (see the module's docstring). Costs are `operator_seconds` (one per operator, by id) or
    else each operator's FLOPs / `flops_per_second`; `chain_seconds` joins chains of units up to that
    cost (`graph_extract.operator_units`); CP-SAT runs on `workers` threads for at most `time_limit`
    seconds in all."""
    costs = _operator_seconds(graph, operator_seconds, flops_per_second)
    seconds_per_byte = non_negative_number("seconds_per_byte", seconds_per_byte)
    chain_seconds = non_negative_number("chain_seconds", chain_seconds)
    time_limit = positive_number("time_limit", time_limit, "seconds")
    workers = positive_integer("workers", workers)
    units = shrink(graph, costs, chain_seconds)
    if not (isinstance(count, int) and not isinstance(count, bool) and 1 <= count <= units.count):
        raise InputError(f"count: must be an integer in [1, {units.count}] (the operators' units after shrinking), "
                         f"got {count!r}")
    consecutive = consecutive_grouping(units, count, seconds_per_byte)
    if count == 1 or units.has_unique_order():
        groups, method, optimal, lower_bound = consecutive, "consecutive", True, float("inf")
    else:
        solved = cpsat_grouping(units, count, seconds_per_byte, consecutive, time_limit, workers)
        groups, method, optimal, lower_bound = solved.groups, "cp-sat", solved.optimal, solved.lower_bound_seconds
    loads, crossing = group_loads(units, groups, count, seconds_per_byte)
    return OperatorCuts(
        groups=tuple(groups[unit] for unit in units.unit_of),
        group_seconds=tuple(loads),
        bottleneck_seconds=max(loads),
        crossing_bytes=crossing,
        lower_bound_seconds=min(lower_bound, max(loads)),  # the bottleneck itself when exact
        optimal=optimal,
        method=method,
        units=units.count,
    )


def with_groups_as_layers(graph: OpGraph, cuts: OperatorCuts) -> OpGraph:
    """`graph` with each operator's `layer` its group in `cuts`: what `build_layer_graph` contracts."""
    if len(cuts.groups) != len(graph.nodes):
        raise InputError(f"cuts: must group the graph's {len(graph.nodes)} operators, got {len(cuts.groups)}")
    nodes = tuple(dataclasses.replace(node, layer=group) for node, group in zip(graph.nodes, cuts.groups))
    return dataclasses.replace(graph, nodes=nodes)
