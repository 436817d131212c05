"""Architecture search strategies over an ordered list of candidate accelerators.

A strategy only sees candidate indices, their areas, an exact `evaluate` (index -> throughput,
0.0 when no placement fits) and, for `bounded`, optimistic throughputs that never under-estimate.
The best is the highest throughput, compared at RESOLUTION_DIGITS significant digits (closer ones
tie), ties going to the smaller area, then to the lower index, so every exact strategy that looks
at the winner returns the same one.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from phaze_common.numbers import round_significant, round_significant_scalar

#: Significant digits at which throughputs are compared: far finer than any model's accuracy, and
#: coarser than what parts a chip's refined bound from its throughput when its schedules meet their
#: lower bounds (float noise, `solver.bounds.FLOAT_MARGIN`; a schedule a few parts in 10^8 above its
#: bound), so a candidate whose bound equals the best's throughput up to that is known not to beat it.
RESOLUTION_DIGITS = 7
#: The largest relative step between two values at RESOLUTION_DIGITS: values closer than this to
#: one another may tie.
RESOLUTION = 10.0 ** (1 - RESOLUTION_DIGITS)
#: `bounded` evaluates a candidate whose final bound is within this fraction of the highest bound
#: at once, ahead of best-first order.
EAGERNESS = 1e-3


def resolved(values):
    """`values` (a number or an array) as the strategies compare them: rounded to RESOLUTION_DIGITS
    significant digits (the same for a number alone as inside an array)."""
    if isinstance(values, np.ndarray):
        return round_significant(values, RESOLUTION_DIGITS)
    return round_significant_scalar(float(values), RESOLUTION_DIGITS)


#: index list -> one value per index (lets a strategy hand out a batch to parallel workers)
BatchFunction = Callable[[list[int]], list[float]]


@dataclass(frozen=True)
class Provisional:
    """A refinement's cheaper bound for a candidate, lower than its last: the candidate keeps its
    level, so the refinement sees it again if it comes back to the top."""

    value: float


@dataclass(frozen=True)
class SearchResult:
    best: int | None  # index of the best candidate, None when no candidate is feasible
    best_throughput: float
    evaluated: tuple[int, ...]  # indices evaluated exactly, in order
    throughputs: tuple[float, ...]  # their throughputs, same order


class _Tracker:
    """Keeps the evaluation order and the best (highest throughput, then smallest area and index)."""

    def __init__(self, areas: Sequence[float] | None, floor: float = 0.0) -> None:
        self.areas = areas
        self.floor = resolved(floor) if floor > 0 else 0.0
        self.evaluated: list[int] = []
        self.throughputs: list[float] = []
        self.best: int | None = None
        self.best_throughput = 0.0
        self._best_resolved = 0.0

    def _before(self, index: int, other: int) -> bool:
        """Does `index` win a tie against `other`?"""
        if self.areas is None:
            return index < other
        return (self.areas[index], index) < (self.areas[other], other)

    def record(self, indices: list[int], throughputs: list[float]) -> None:
        for index, throughput in zip(indices, throughputs, strict=True):
            self.evaluated.append(index)
            self.throughputs.append(throughput)
            if throughput > 0 and self.can_win(index, resolved(throughput)):
                self.best, self.best_throughput, self._best_resolved = index, throughput, resolved(throughput)

    def reachable(self, optimistic: float) -> bool:
        """Could some candidate with this optimistic throughput (`resolved`) beat or tie the best?"""
        if self.best is None:
            return optimistic > 0 and optimistic >= self.floor
        return optimistic >= self._best_resolved

    def can_win(self, index: int, optimistic: float) -> bool:
        """Could a candidate with this optimistic throughput (`resolved`) beat or tie-break the best?"""
        if self.best is None:
            return optimistic > 0 and optimistic >= self.floor
        return optimistic > self._best_resolved or (
            optimistic == self._best_resolved and self._before(index, self.best))

    def result(self) -> SearchResult:
        return SearchResult(self.best, self.best_throughput, tuple(self.evaluated), tuple(self.throughputs))


def exhaustive(
    count: int, evaluate: BatchFunction, batch_size: int = 64, areas: Sequence[float] | None = None
) -> SearchResult:
    """Evaluate every candidate."""
    tracker = _Tracker(areas)
    for start in range(0, count, batch_size):
        indices = list(range(start, min(start + batch_size, count)))
        tracker.record(indices, evaluate(indices))
    return tracker.result()


def area_buckets(areas: Sequence[float], bucket_size: float) -> list[list[int]]:
    """Candidate indices grouped by floor(area / bucket_size), largest bucket first, stable inside."""
    buckets: dict[int, list[int]] = {}
    for index, area in enumerate(areas):
        buckets.setdefault(int(area // bucket_size), []).append(index)
    return [buckets[key] for key in sorted(buckets, reverse=True)]


def phaze_sweep(
    areas: Sequence[float], evaluate: BatchFunction, bucket_size: float = 1e4, hysteresis: int = 5
) -> SearchResult:
    """The original's sweep: area buckets from the largest down, stopping at a bucket boundary once
    the best throughputs of the last `hysteresis` buckets never increase as the area shrinks.

    `bucket_size` is in µm² (the original groups by 10,000 µm²). A bucket with no feasible candidate
    counts with throughput -1, as in the original.
    """
    tracker = _Tracker(areas)
    bucket_best: list[float] = []
    for bucket in area_buckets(areas, bucket_size):
        recent = bucket_best[-hysteresis:]
        if len(recent) >= hysteresis and all(a >= b for a, b in zip(recent, recent[1:])):
            break
        throughputs = evaluate(bucket)
        tracker.record(bucket, throughputs)
        bucket_best.append(max((t for t in throughputs if t > 0), default=-1.0))
    return tracker.result()


def bounded(
    optimistic: np.ndarray,
    refinements: Sequence[BatchFunction],
    evaluate: BatchFunction,
    batch_size: int = 1,
    areas: Sequence[float] | None = None,
    floor: float = 0.0,
) -> SearchResult:
    """Best-first search on upper bounds of the throughput, exact when the bounds are valid.

    `optimistic[i]` bounds candidate i's throughput from above; each refinement is a tighter bound
    that is still an upper bound (or a `Provisional` one, strictly lower than the last, which keeps
    the candidate at its level). A candidate is refined level by level, then evaluated, always
    taking the candidate with the highest bound next, but for one whose last bound is within
    EAGERNESS of the highest: it is evaluated at once (a good throughput found early cuts the
    refinements of the rest). The search stops when no remaining bound can beat the best throughput
    found: bounds are compared `resolved`, as throughputs are, so it goes on through the bounds equal
    to the best's, skipping the candidates that lose the tie-break (larger area, then higher index).
    A batch evaluates one candidate of a run of equal final bounds (the next ones can only win if it
    falls short of its bound). `floor`: a value found elsewhere (another part of a
    larger search); a candidate whose bound is below it is never looked at, so the result is the
    best of those that can reach it (None when none does).
    """
    tracker = _Tracker(areas, floor)
    rank = np.zeros(len(optimistic)) if areas is None else np.asarray(areas, dtype=float)
    evaluation = len(refinements)

    def entry(index: int, bound: float, level: int) -> tuple:
        # (-priority, area, index, level, bound): a final bound is taken as if EAGERNESS higher
        return -(bound * (1 + EAGERNESS) if level == evaluation else bound), float(rank[index]), index, level, bound

    heap = [entry(index, float(value), 0) for index, value in enumerate(optimistic)]
    heapq.heapify(heap)
    stages = [*refinements, evaluate]
    while heap and tracker.reachable(resolved(-heap[0][0])):  # no priority is below its bound
        batch: dict[int, list[int]] = {}
        deferred, evaluated_bound, count = [], None, 0
        while heap and count < batch_size and tracker.reachable(resolved(-heap[0][0])):
            top = heapq.heappop(heap)
            _, _, index, level, bound = top
            bound = resolved(bound)
            if not tracker.can_win(index, bound):
                continue  # it cannot beat the best (nor a later one)
            if level == evaluation:
                if bound == evaluated_bound:
                    deferred.append(top)  # it wins only if the tie's first candidate falls short of its bound
                    count += 1
                    continue
                evaluated_bound = bound if evaluated_bound is None else evaluated_bound
            batch.setdefault(level, []).append(index)
            count += 1
        for top in deferred:
            heapq.heappush(heap, top)
        for level, indices in sorted(batch.items()):
            values = stages[level](indices)
            if level == evaluation:
                tracker.record(indices, values)
            else:
                for index, value in zip(indices, values, strict=True):
                    if isinstance(value, Provisional):
                        heapq.heappush(heap, entry(index, value.value, level))
                    else:
                        heapq.heappush(heap, entry(index, value, level + 1))
    return tracker.result()
