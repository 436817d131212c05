"""`solve`: one entry point for every backend, with the heuristic as the warm start and fallback."""

from __future__ import annotations

import math
import time

from solver.schedule.cpsat import solve_cpsat
from solver.schedule.heuristic import heuristic_schedule, lower_bound
from solver.schedule.listsched import retime
from solver.schedule.milp import MILP_SOLVERS, solve_milp
from solver.schedule.problem import ScheduleProblem
from solver.schedule.result import PROOF_TOLERANCE, ScheduleResult, make_result
from solver.schedule.check import check_schedule

BACKENDS = ("cpsat", "milp", "heuristic")
#: An exact backend gets at least this long [s], even when the heuristic used up the time limit.
MINIMUM_SOLVER_TIME = 0.05


def _check_options(backend: str, time_limit: float, milp_solver: str, relative_gap: float, workers: int) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend: unknown {backend!r}; allowed: {', '.join(BACKENDS)}")
    if milp_solver not in MILP_SOLVERS:
        raise ValueError(f"milp_solver: unknown {milp_solver!r}; allowed: {', '.join(MILP_SOLVERS)}")
    if not (isinstance(time_limit, (int, float)) and math.isfinite(time_limit) and time_limit > 0):
        raise ValueError(f"time_limit: must be a finite number of seconds > 0, got {time_limit!r}")
    if not (isinstance(relative_gap, (int, float)) and 0 <= relative_gap < 1):
        raise ValueError(f"relative_gap: must be in [0, 1), got {relative_gap!r}")
    if not (isinstance(workers, int) and workers >= 1):
        raise ValueError(f"workers: must be an integer >= 1, got {workers!r}")


def solve(
    problem: ScheduleProblem,
    backend: str = "cpsat",
    time_limit: float = 10.0,
    *,
    milp_solver: str = "cbc",
    relative_gap: float = 0.0,
    workers: int = 1,
) -> ScheduleResult:
    """Schedule one layer: the shortest makespan the backend finds within `time_limit` seconds.

    `relative_gap` lets an exact backend stop once within that fraction of optimal; `workers` is its
    thread count. A backend stopped by the time limit returns its best schedule ("feasible", with
    the gap); the result always passes the validator.
    """
    _check_options(backend, time_limit, milp_solver, relative_gap, workers)
    began = time.perf_counter()
    best = heuristic_schedule(problem)
    bound = lower_bound(problem)
    proven = best.makespan(problem) <= bound * (1 + PROOF_TOLERANCE)
    if backend != "heuristic" and not proven:
        remaining = max(time_limit - (time.perf_counter() - began), MINIMUM_SOLVER_TIME)
        if backend == "cpsat":
            outcome = solve_cpsat(problem, best, remaining, relative_gap, workers)
        else:
            outcome = solve_milp(problem, best, remaining, milp_solver, relative_gap, workers)
        bound = max(bound, outcome.lower_bound)
        if outcome.schedule is not None:
            found = retime(problem, outcome.schedule)
            best = min(best, found, key=lambda schedule: schedule.makespan(problem))
        proven = outcome.optimal or best.makespan(problem) <= bound * (1 + PROOF_TOLERANCE)
    result = make_result(
        problem, best, bound, "optimal" if proven else "feasible", backend, time.perf_counter() - began
    )
    check_schedule(problem, result.start, result.parallel, result.makespan)
    return result
