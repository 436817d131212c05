"""Schedules and list scheduling: serial schedule generation, used by the heuristic, and the
retiming of a solver's schedule on the real latencies."""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

from solver.schedule.problem import ScheduleProblem


@dataclass(frozen=True)
class Schedule:
    """Start time [s] and mode (True = intra-operator parallel) of every operator."""

    start: tuple[float, ...]
    parallel: tuple[bool, ...]

    def makespan(self, problem: ScheduleProblem) -> float:
        ends = (s + op.duration(p) for s, p, op in zip(self.start, self.parallel, problem.ops))
        return max(ends, default=0.0)


class _CoreProfile:
    """Cores kept busy over time, a step function: `usage[k]` holds on [times[k], times[k+1])."""

    def __init__(self, capacity: tuple[int, int]):
        self.capacity = capacity
        self.times = [0.0]
        self.usage = [(0, 0)]

    def _fits(self, k: int, demand: tuple[int, int]) -> bool:
        tc, vc = self.usage[k]
        return tc + demand[0] <= self.capacity[0] and vc + demand[1] <= self.capacity[1]

    def earliest_start(self, ready: float, duration: float, demand: tuple[int, int]) -> float:
        """The earliest start >= ready at which `demand` fits during the whole `duration`."""
        if duration <= 0 or demand == (0, 0):
            return ready
        start = ready
        k = bisect_right(self.times, start) - 1
        while True:
            j = k
            while j < len(self.times) and self.times[j] < start + duration:
                if not self._fits(j, demand):
                    break
                j += 1
            else:
                return start
            start, k = self.times[j + 1], j + 1  # the last segment never conflicts: it is empty

    def _split(self, t: float) -> int:
        k = bisect_right(self.times, t) - 1
        if self.times[k] != t:
            self.times.insert(k + 1, t)
            self.usage.insert(k + 1, self.usage[k])
            k += 1
        return k

    def add(self, start: float, end: float, demand: tuple[int, int]) -> None:
        if end <= start or demand == (0, 0):
            return
        first, last = self._split(start), self._split(end)
        for k in range(first, last):
            tc, vc = self.usage[k]
            self.usage[k] = (tc + demand[0], vc + demand[1])


def list_schedule(
    problem: ScheduleProblem,
    priority: Sequence[float],
    parallel: Sequence[bool] | None = None,
    durations: Sequence[tuple[float, float]] | None = None,
) -> Schedule:
    """Serial schedule generation: take the ready operator of smallest priority, start it as early as
    precedence and cores allow; with `parallel=None` pick per operator the mode that ends first.

    `durations[i]` = (one-core, parallel) duration, by default the operators' latencies.
    """
    ops, demands = problem.ops, problem.demands
    durations = durations or [(op.latency, op.parallel_latency) for op in ops]
    profile = _CoreProfile((problem.num_tc, problem.num_vc))
    n = len(ops)
    start, mode, ready_at = [0.0] * n, [False] * n, [0.0] * n
    waiting = [len(p) for p in problem.predecessors]
    ready = [(priority[i], i) for i, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    while ready:
        _, i = heapq.heappop(ready)
        best = None
        for m in ops[i].modes if parallel is None else (bool(parallel[i]),):
            d = durations[i][m]
            s = profile.earliest_start(ready_at[i], d, demands[i][m])
            if best is None or s + d < best[0]:
                best = (s + d, s, m)
        end, start[i], mode[i] = best
        profile.add(start[i], end, demands[i][mode[i]])
        for j in problem.successors[i]:
            ready_at[j] = max(ready_at[j], end)
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(ready, (priority[j], j))
    return Schedule(tuple(start), tuple(mode))


def retime(
    problem: ScheduleProblem, schedule: Schedule, durations: Sequence[tuple[float, float]] | None = None
) -> Schedule:
    """Re-run a schedule's order (by start time) and modes with the real latencies or `durations`:
    the result is feasible, and no operator starts later than in `schedule` if that was feasible
    (each one, in turn, starts at the earliest feasible time)."""
    rank = {op: position for position, op in enumerate(problem.topological_order)}
    order = sorted(range(len(problem.ops)), key=lambda i: (schedule.start[i], rank[i]))
    priority = [0.0] * len(order)
    for position, i in enumerate(order):
        priority[i] = float(position)
    return list_schedule(problem, priority, schedule.parallel, durations)
