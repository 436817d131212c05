"""Optimistic throughputs of every candidate accelerator at once, from schedule lower bounds.

For each layer the scheduler's lower bound (`solver.schedule.lower_bound`, the same function) is
computed for all candidates as numpy vectors: a layer's forward plus backward bound. The question's
step model turns these into a lower bound on the time per batch of every placement (its
`lower_bound`), and the throughput bound is global batch / the least of them over the widths.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from estimator import CandidateSpace, EstimateTable
from estimator.work import expert_split_graph
from estimator.workload import prepare_layer
from graph_extract import KernelOptions
from solver.layer_costs import DIRECTIONS, SCHEDULE_FIGURES, LayerCost, expert_groups, step_graphs
from solver.question import Axes, Question
from solver.schedule.cache import SCHEDULE_DIGITS
from solver.schedule.lower_bound import LayerShape, mode_bound, path_and_work_bound
from solver.step_models import step_model

#: The bounds are computed on the latencies a schedule is computed on (rounded to SCHEDULE_DIGITS
#: significant digits alike), by the scheduler's own bound function; only the order of a sum's
#: terms differs (a few units in the last place). A throughput bound this much larger covers it.
FLOAT_MARGIN = 1e-12


@dataclass(frozen=True)
class GroupBounds:
    """Schedule lower bounds [s] of every repeat group's representative layer on every candidate,
    arrays [groups x candidates]: forward, backward, and the forward of its attention core (what
    selective recomputation re-runs; 0 without one)."""

    groups: tuple[tuple[int, ...], ...]
    forward: np.ndarray
    backward: np.ndarray
    attention_core: np.ndarray

    def layer_work(self, layer_ids: tuple[int, ...], columns: np.ndarray | None = None) -> np.ndarray:
        """Forward + backward bound of every layer (rows in `layer_ids`' order) on every candidate, or
        on the candidates `columns`."""
        row = {layer: index for index, group in enumerate(self.groups) for layer in group}
        forward, backward = ((self.forward, self.backward) if columns is None
                             else (self.forward[:, columns], self.backward[:, columns]))
        return (forward + backward)[[row[layer] for layer in layer_ids]]

    def costs(self, index: int) -> dict[int, LayerCost]:
        """Layer costs of candidate `index` from the bounds: no schedule is faster (energy etc. zero)."""
        costs = {}
        for group, forward, backward, core in zip(self.groups, self.forward[:, index], self.backward[:, index],
                                                  self.attention_core[:, index]):
            # the weight products take at most the whole layer: the most an overlap could hide
            cost = LayerCost(forward=float(forward), backward=float(backward), attention_core_forward=float(core),
                             **dict.fromkeys(SCHEDULE_FIGURES, 0.0), matrix_forward=float(forward),
                             matrix_backward=float(backward))
            costs.update(dict.fromkeys(group, cost))
        return costs

    def columns(self) -> np.ndarray:
        """Every candidate's bounds, flat: [bounds x candidates]. Equal columns, equal costs; one column
        no larger than another everywhere, costs no larger (and a throughput bound no smaller)."""
        return np.concatenate([self.forward, self.backward, self.attention_core])


def _layer_bounds(prepared, space: CandidateSpace, keep: list[int] | None = None,
                  bound: Callable = mode_bound) -> np.ndarray:
    """`bound` (the scheduler's `lower_bound`, vectorised) of a prepared layer, or of the sub-problem
    of its operators `keep` (the edges among them), on every candidate, its latencies rounded as the
    scheduler rounds them."""
    latency, parallel = prepared.candidate_prices(space, SCHEDULE_DIGITS)
    ops, edges = list(range(len(prepared.ops))), prepared.edges
    if keep is not None:
        position = {old: new for new, old in enumerate(keep)}
        ops, latency, parallel = keep, latency[keep], parallel[keep]
        edges = [(position[a], position[b]) for a, b in edges if a in position and b in position]
    shape = LayerShape.of([prepared.ops[op].core_type for op in ops], edges)
    num_tc, num_vc = space.num_tc.astype(float), space.num_vc.astype(float)
    # a candidate's bound is a function of its column alone: computed once per distinct column
    first, inverse = distinct_columns(np.vstack([latency, parallel, num_tc, num_vc]))
    return bound(shape, latency[:, first], parallel[:, first], num_tc[first], num_vc[first])[inverse]


def distinct_columns(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first, inverse): the position of one column of `values` [rows x columns] per distinct column
    (bit for bit), and each column's index into `first` (values[:, first][:, inverse] is values).
    Columns are told apart by a hash of their bits, and the grouping is checked against the values;
    a collision (never seen) falls back to a lexicographic comparison."""
    bits = np.ascontiguousarray(values, dtype=np.float64).view(np.uint64)
    multipliers = _hash_multipliers(len(bits))
    with np.errstate(over="ignore"):
        hashes = (bits * multipliers[:, None]).sum(axis=0, dtype=np.uint64) if len(bits) else np.zeros(
            bits.shape[1], np.uint64)
    _, first, inverse = np.unique(hashes, return_index=True, return_inverse=True)
    if not np.array_equal(bits[:, first[inverse]], bits):
        _, first, inverse = np.unique(bits, axis=1, return_index=True, return_inverse=True)
    return first, inverse.reshape(-1)


def _hash_multipliers(count: int) -> np.ndarray:
    """`count` fixed odd 64-bit multipliers (a multiplicative hash of each row's bits)."""
    return np.random.default_rng(0x5EED).integers(0, 2**63, count, dtype=np.uint64) * np.uint64(2) + np.uint64(1)


def group_bounds(graphs, space: CandidateSpace, table: EstimateTable, kernels: KernelOptions,
                 splits: tuple[float, ...] = ()) -> GroupBounds:
    """The `GroupBounds` of one extracted width: the vectorised `lower_bound` of each schedule problem
    `solver.layer_costs` builds (the attention core as `core_problem` cuts it); a group holding
    experts takes the least with its expert splits `splits` too, priced as `layer_costs` prices them
    (never below their `critical_path_and_work`), so the bound holds at every expert-parallel width
    searched."""
    rows = {direction: [] for direction in (*DIRECTIONS, "core")}
    experts = expert_groups(graphs)
    shapes = [graphs.op_graph] + [expert_split_graph(graphs.op_graph, split) for split in splits]
    for group in graphs.repeat_groups:
        for direction in DIRECTIONS:
            bounds = [_layer_bounds(prepare_layer(graph, group[0], direction, table, kernels), space,
                                    bound=mode_bound if graph is shapes[0] else path_and_work_bound)
                      for graph in (shapes if group in experts else shapes[:1])]
            rows[direction].append(np.min(bounds, axis=0))
        forward = prepare_layer(graphs.op_graph, group[0], "forward", table, kernels)
        core = kernels.recomputed_core(graphs.attention_core)
        keep = [index for index, op in enumerate(forward.ops) if op.members[0] in core]
        rows["core"].append(_layer_bounds(forward, space, keep) if keep else np.zeros(len(space)))
    return GroupBounds(tuple(graphs.repeat_groups), *(np.array(rows[name]) for name in (*DIRECTIONS, "core")))


def optimistic_throughputs(question: Question, axes: Axes, graphs_by_width, space: CandidateSpace,
                           bounds: dict[int, GroupBounds], columns: np.ndarray | None = None) -> np.ndarray:
    """An upper bound on the throughput [samples/s] of every candidate of `space` (module docstring),
    or of the candidates `columns`, from the group bounds of every width, for the axes' micro-batch
    size and largest HBM size."""
    best_time = np.full(len(space) if columns is None else len(columns), np.inf)
    graphs, model = step_graphs(graphs_by_width, None), step_model(question)
    largest = axes.at(memory_capacity=max(axes.memory_capacities))
    for width, extracted in graphs_by_width.items():
        work = bounds[width].layer_work(tuple(layer.id for layer in extracted.layer_graph.layers), columns)
        time = model.lower_bound(question, largest, graphs, work, width, space.template.hbm_bandwidth)
        best_time = np.minimum(best_time, time)
    with np.errstate(divide="ignore"):
        return question.global_batch_size / best_time * (1 + FLOAT_MARGIN)
