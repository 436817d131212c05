"""A lower bound on the makespan that weighs the mode choices, proven with CP-SAT.

While a parallel operator runs, no other core operator runs, so for any mode choice the parallel
runs, which do not overlap one another, add up with
* any path of one-core runs (they do not overlap one another either), or
* the one-core work of a core type spread over its cores;
and the critical path in the chosen modes holds too. The bound is the least makespan these allow
over every mode choice: a small model with one Boolean per operator and no time windows, which
CP-SAT solves far faster than the schedule itself. The same constraints also tighten the full
model (`cpsat.py`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from ortools.sat.python import cp_model

from solver.schedule import interruptible
from solver.schedule.problem import ScheduleProblem


def _longest_path(model: cp_model.CpModel, problem: ScheduleProblem, weight: Callable, horizon: int) -> list:
    """Variables at least the heaviest path (by `weight`) ending at each operator."""
    path = [model.new_int_var(0, horizon, f"path{i}") for i in range(len(problem.ops))]
    for i in problem.topological_order:
        model.add(path[i] >= weight(i))
        for q in problem.predecessors[i]:
            model.add(path[i] >= path[q] + weight(i))
    return path


def add_exclusive_bounds(
    model: cp_model.CpModel,
    problem: ScheduleProblem,
    ticks: Sequence[tuple[int, int]],
    parallel: dict[int, cp_model.IntVar],
    makespan: cp_model.IntVar,
    horizon: int,
) -> None:
    """makespan >= parallel time + any path of one-core runs, and >= parallel time + the one-core
    work of each core type over its cores (durations in ticks, `parallel[i]` the mode literal)."""
    ops = problem.ops

    def single(i: int):
        if not ops[i].uses_cores:
            return 0
        return ticks[i][0] * (1 - parallel[i]) if i in parallel else ticks[i][0]

    parallel_time = sum(ticks[i][1] * var for i, var in parallel.items())
    for path in _longest_path(model, problem, single, horizon):
        model.add(makespan >= parallel_time + path)
    for count, uses in ((problem.num_tc, "uses_tc"), (problem.num_vc, "uses_vc")):
        users = [i for i, op in enumerate(ops) if getattr(op, uses)]
        if users:
            model.add(count * (makespan - parallel_time) >= sum(single(i) for i in users))


def exclusive_bound(
    problem: ScheduleProblem, resolution: float, time_limit: float, workers: int = 1
) -> tuple[float, tuple[bool, ...] | None]:
    """The proven lower bound [s] after at most `time_limit` seconds, and the modes of the best
    value found (a good start for the heuristic), or None.

    Latencies are rounded down to ticks of `resolution` seconds, so the bound holds for the real
    latencies."""
    ops = problem.ops
    ticks = [(math.floor(op.latency / resolution), math.floor(op.parallel_latency / resolution)) for op in ops]
    horizon = sum(max(t) for t in ticks)
    model = cp_model.CpModel()
    parallel = {i: model.new_bool_var(f"parallel{i}") for i, op in enumerate(ops) if len(op.modes) == 2}
    makespan = model.new_int_var(0, horizon, "makespan")

    def duration(i: int):
        return ticks[i][0] + (ticks[i][1] - ticks[i][0]) * parallel[i] if i in parallel else ticks[i][0]

    for path in _longest_path(model, problem, duration, horizon):
        model.add(makespan >= path)
    add_exclusive_bounds(model, problem, ticks, parallel, makespan, horizon)
    model.minimize(makespan)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit
    solver.parameters.num_workers = workers
    status = interruptible.solve(solver, model)
    bound = max(0.0, solver.best_objective_bound) * resolution
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return bound, None
    return bound, tuple(i in parallel and bool(solver.value(parallel[i])) for i in range(len(ops)))
