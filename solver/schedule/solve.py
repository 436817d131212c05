"""`solve`: one entry point for every backend, with the heuristic as the warm start and fallback."""

from __future__ import annotations

import time

from phaze_common.checks import choice, fraction, integer, positive_number
from solver.schedule.check import check_schedule
from solver.schedule.cpsat import solve_cpsat
from solver.schedule.heuristic import heuristic_schedule
from solver.schedule.listsched import retime
from solver.schedule.lower_bound import lower_bound
from solver.schedule.milp import MILP_SOLVERS, solve_milp
from solver.schedule.problem import ScheduleProblem
from solver.schedule.result import PROOF_TOLERANCE, ScheduleResult, make_result

BACKENDS = ("cpsat", "milp", "heuristic")
#: An exact backend gets at least this long [s], even when the heuristic used up the time limit.
MINIMUM_SOLVER_TIME = 0.05


def _check_options(backend: str, time_limit: float, milp_solver: str, relative_gap: float, workers: int) -> None:
    choice("backend", backend, BACKENDS)
    choice("milp_solver", milp_solver, MILP_SOLVERS)
    positive_number("time_limit", time_limit, "seconds")
    fraction("relative_gap", relative_gap, closed_at_zero=True)
    integer("workers", workers, 1)


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
