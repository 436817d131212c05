"""Lower bounds on a layer's makespan, for one chip (`lower_bound(problem)`) or for many candidate
chips at once (arrays [operators x candidates]): one implementation for both, so the search's
bounds and the scheduler's proofs agree (up to the order of a sum's terms, a few units in the last
place: `solver.bounds.FLOAT_MARGIN` covers them).

Two bounds:

* `path_and_work_bound`: the critical path on each operator's shorter latency, and the work of each
  core type spread over all its cores (a parallel run keeps every core of its type for its time).
* `mode_bound` (the scheduler's and the search's): the same reasoning once some operators are
  forced into their parallel mode. Parallel runs overlap no other core operator, nor one another,
  and no parallel run overlaps a one-core run: so under a makespan T an operator whose one-core
  latency exceeds T minus the time of the runs forced already must run parallel too (the forced
  set grows from the largest one-core latency down until it stops). T is then at least the forced
  runs' summed time plus, along any path, the shorter latencies of its unforced core operators; at
  least their summed time plus each core type's unforced work over its cores; and at least the
  critical path with the forced operators at their parallel latency. The forced set only grows as
  T falls, so the least T that meets these conditions is found by one scan over the one-core
  latencies from the largest down. On a layer whose matrix products are far slower on one core
  than on all (a chip of many small tensor cores) it closes most of the gap `path_and_work_bound`
  leaves: those products run one after another, each on every core.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from solver.schedule.problem import ScheduleProblem

TENSOR_CORE_TYPES = ("TC", "TCandVC")
VECTOR_CORE_TYPES = ("VC", "TCandVC")


@dataclass(frozen=True, kw_only=True)
class LayerShape:
    """What the bounds read of a layer besides its latencies: per operator (numbered in a topological
    order) whether it runs on tensor and on vector cores, and its predecessors."""

    uses_tc: np.ndarray  # [operators] bool
    uses_vc: np.ndarray
    predecessors: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, core_types: Sequence[str], edges: Sequence[tuple[int, int]]) -> LayerShape:
        """The shape of operators of these core types (`solver.schedule.CORE_TYPES`), joined by edges
        (i, j) with i < j."""
        predecessors: list[list[int]] = [[] for _ in core_types]
        for source, dest in edges:
            predecessors[dest].append(source)
        return cls(uses_tc=np.array([kind in TENSOR_CORE_TYPES for kind in core_types], dtype=bool),
                   uses_vc=np.array([kind in VECTOR_CORE_TYPES for kind in core_types], dtype=bool),
                   predecessors=tuple(tuple(sorted(before)) for before in predecessors))


def _problem_arrays(problem: ScheduleProblem) -> tuple[LayerShape, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(shape, latency, parallel latency, TCs, VCs) of one problem: its operators in topological order."""
    order = problem.topological_order
    position = {old: new for new, old in enumerate(order)}
    shape = LayerShape.of([problem.ops[i].core for i in order],
                          [(position[i], position[j]) for i, j in problem.edges])
    latency = np.array([[problem.ops[i].latency] for i in order], dtype=float).reshape(len(order), 1)
    parallel = np.array([[problem.ops[i].parallel_latency] for i in order], dtype=float).reshape(len(order), 1)
    return shape, latency, parallel, np.array([float(problem.num_tc)]), np.array([float(problem.num_vc)])


def longest_path(shape: LayerShape, weight: np.ndarray) -> np.ndarray:
    """The heaviest path's weight (an operator's weight counted once), per candidate."""
    finish = weight.copy()
    for op, before in enumerate(shape.predecessors):
        if len(before) == 1:
            finish[op] += finish[before[0]]
        elif before:
            finish[op] += finish[list(before)].max(axis=0)
    return finish.max(axis=0) if len(finish) else np.zeros(weight.shape[1:])


def _core_work(shape: LayerShape, latency: np.ndarray, parallel: np.ndarray, num_tc: np.ndarray,
               num_vc: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per core type that the layer uses: (its core count, each operator's one-core work on it, no more
    than all its cores' time at the parallel latency: [operators x candidates], 0 for the others)."""
    return [(np.where(cores > 0, cores, 1.0), np.where(uses[:, None], np.minimum(latency, cores * parallel), 0.0))
            for cores, uses in ((num_tc, shape.uses_tc), (num_vc, shape.uses_vc)) if uses.any()]


def path_and_work_bound(shape: LayerShape, latency: np.ndarray, parallel: np.ndarray, num_tc: np.ndarray,
                        num_vc: np.ndarray) -> np.ndarray:
    """The critical path on the shorter latencies and the work per core type over its cores [s], per
    candidate (arrays [operators x candidates]; core counts [candidates])."""
    bound = longest_path(shape, np.minimum(latency, parallel))
    for cores, work in _core_work(shape, latency, parallel, num_tc, num_vc):
        bound = np.maximum(bound, work.sum(axis=0) / cores)
    return bound


def mode_bound(shape: LayerShape, latency: np.ndarray, parallel: np.ndarray, num_tc: np.ndarray,
               num_vc: np.ndarray) -> np.ndarray:
    """The least makespan [s] the forced parallel runs allow (module docstring), per candidate; never
    below `path_and_work_bound`."""
    core = (shape.uses_tc | shape.uses_vc)[:, None] & (latency > 0)
    flexible = core & (parallel < latency)
    shortest = np.minimum(latency, parallel)
    works = _core_work(shape, latency, parallel, num_tc, num_vc)
    # one-core latencies of the operators that may run parallel, largest first (-inf below them)
    levels = -np.sort(-np.where(flexible, latency, -np.inf), axis=0)
    columns = np.arange(latency.shape[1])  # the candidates of the working arrays
    best = np.full(latency.shape[1], np.inf)
    above = np.full(latency.shape[1], np.inf)  # the forced set is the scanned one only for T below this
    going = np.ones(latency.shape[1], dtype=bool)  # whose scan goes on
    for forced_count in range(len(latency) + 1):
        forced = flexible & (latency >= levels[forced_count - 1]) if forced_count else np.zeros_like(flexible)
        forced_time = np.where(forced, parallel, 0.0).sum(axis=0)
        # the forced set is exactly this one from `start` on: the next operator's one-core run then fits
        # beside the forced runs
        start = np.where(flexible & ~forced, latency, 0.0).max(axis=0) + forced_time
        needed = np.maximum(longest_path(shape, np.where(forced, parallel, shortest)),
                            forced_time + longest_path(shape, np.where(forced | ~core, 0.0, shortest)))
        for cores, work in works:
            needed = np.maximum(needed, forced_time + np.where(forced, 0.0, work).sum(axis=0) / cores)
        # T in [start, above) with this forced set: possible from max(start, needed) on
        least = np.maximum(start, needed)
        best[columns] = np.where(going & (least < above), np.minimum(best[columns], least), best[columns])
        # a larger forced set is only for T below min(above, start), and needs more than `needed`
        above = np.minimum(above, start)
        going &= (needed < above) & (forced.sum(axis=0) < flexible.sum(axis=0))
        if not going.any():
            break
        if going.sum() < 0.75 * len(going):  # work on the candidates still scanned only
            kept = going
            columns, above, going, levels = columns[kept], above[kept], going[kept], levels[:, kept]
            latency, parallel, shortest, core, flexible = (array[:, kept] for array in
                                                           (latency, parallel, shortest, core, flexible))
            works = [(cores[kept], work[:, kept]) for cores, work in works]
    return best


def lower_bound(problem: ScheduleProblem) -> float:
    """No schedule of the problem is shorter [s] (`mode_bound`)."""
    if not problem.ops:
        return 0.0
    return float(mode_bound(*_problem_arrays(problem))[0])


def critical_path_and_work(problem: ScheduleProblem) -> float:
    """`path_and_work_bound` of one problem [s]."""
    if not problem.ops:
        return 0.0
    return float(path_and_work_bound(*_problem_arrays(problem))[0])
