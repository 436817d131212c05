"""How phaze's exact searches give OR-Tools' CP-SAT its threads: on one worker its portfolio's
subsolvers (search strategies, neighbourhood searches) take turns on the one thread; on more, each
worker runs its own."""

from __future__ import annotations

from ortools.sat.python import cp_model

#: With one worker, this many of CP-SAT's subsolvers take turns on the one thread.
SUBSOLVERS = 8


def portfolio_solver(time_limit: float, workers: int) -> cp_model.CpSolver:
    """A CP-SAT solver stopping after `time_limit` seconds (at least 1 ms) that runs its portfolio on
    `workers` threads, interleaved on one thread when `workers` is 1."""
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(time_limit, 1e-3)
    if workers == 1:
        solver.parameters.interleave_search = True
        solver.parameters.interleave_batch_size = 1
        solver.parameters.num_workers = SUBSOLVERS
    else:
        solver.parameters.num_workers = workers
    return solver
