"""The default exact backend: CP-SAT with interval variables.

Each operator has an interval per mode it may run in (optional intervals when it has two; each has
its own start variable tied to the operator's start, since CP-SAT 9.15 wrongly reports some models
infeasible when two optional intervals in one no-overlap share their start and end variables).
Precedence is end_i <= start_j; two cumulative constraints hold the TC and VC counts, where a
parallel operator demands every core, which is exactly "nothing else runs alongside"; a collective
demands nothing. Redundant constraints make the proofs fast:
* the parallel intervals do not overlap one another;
* for a core type that its operators could overload (more of them pairwise unordered than cores),
  every one-core run is also put on a named core, with a no-overlap per core that holds every
  parallel interval too (cores are interchangeable: core k is first used after core k-1);
* the exclusive bounds of `bound.py`, whose own small model is solved first: when its bound
  already closes the gap to the heuristic (or to the list schedule in the bound's modes), the full
  model is not built.

The full model is searched from the heuristic's schedule (a hint) twice at most: by CP-SAT's default
search alone for a short deterministic time (enough for most layers), then by its portfolio of
strategies and neighbourhood searches, taking turns on one thread, until the time limit.

CP-SAT needs integers: time is counted in ticks of `resolution` = (heuristic makespan) /
TICKS_PER_HORIZON seconds and every duration is rounded up to whole ticks, so a schedule of the
ticked problem is feasible on the real latencies. Rounding up adds less than one tick per operator:
the ticked optimum is at most n ticks above the real one (shift the real optimum's k-th started
operator k ticks later), hence the real lower bound (ticked bound - n) x resolution.
"""

from __future__ import annotations

import math
import time

from ortools.sat.python import cp_model

from phaze_common.cpsat import portfolio_solver

from solver.schedule import interruptible
from solver.schedule.bound import add_exclusive_bounds, exclusive_bound
from solver.schedule.cores import assign_cores
from solver.schedule.heuristic import improve_modes, schedule_in_modes
from solver.schedule.listsched import Schedule, retime
from solver.schedule.problem import ScheduleProblem
from solver.schedule.result import PROOF_TOLERANCE, BackendOutcome

TICKS_PER_HORIZON = 100_000
#: Share of the time limit for the exclusive bound's model.
BOUND_SHARE = 0.25
#: Without the portfolio, CP-SAT runs its default search alone for this long (in its deterministic
#: time, which does not depend on the machine's load).
QUICK_SEARCH = 0.1


class _Model:
    """The CP-SAT model of one ticked problem, hinted with a feasible ticked schedule."""

    def __init__(self, problem: ScheduleProblem, ticks: list[tuple[int, int]], hint: Schedule):
        self.problem, self.ticks = problem, ticks
        n = len(problem.ops)
        self.horizon = max(int(s) + ticks[i][p] for i, (s, p) in enumerate(zip(hint.start, hint.parallel)))
        self.model = m = cp_model.CpModel()
        self.start = [m.new_int_var(0, self.horizon, f"start{i}") for i in range(n)]
        self.end = [m.new_int_var(0, self.horizon, f"end{i}") for i in range(n)]
        self.parallel = {i: m.new_bool_var(f"parallel{i}") for i, op in enumerate(problem.ops) if len(op.modes) == 2}
        self.makespan = m.new_int_var(0, self.horizon, "makespan")
        self.intervals = [{mode: self._interval(i, mode) for mode in op.modes} for i, op in enumerate(problem.ops)]
        for i, j in problem.edges:
            m.add(self.end[i] <= self.start[j])
        m.add_max_equality(self.makespan, self.end)
        self._add_capacity()
        parallel_runs = [self.intervals[i][True] for i in self.parallel]
        if len(parallel_runs) > 1:
            m.add_no_overlap(parallel_runs)
        for kind, count in enumerate((problem.num_tc, problem.num_vc)):
            users = [i for i, op in enumerate(problem.ops) if op.uses_cores and (op.uses_tc, op.uses_vc)[kind]]
            if problem.width(users) > count:
                self._add_named_cores(kind, users, count, parallel_runs, hint)
        add_exclusive_bounds(m, problem, ticks, self.parallel, self.makespan, self.horizon)
        m.minimize(self.makespan)
        for i in range(n):
            m.add_hint(self.start[i], int(hint.start[i]))
        for i, var in self.parallel.items():
            m.add_hint(var, hint.parallel[i])

    def solution(self, solver: cp_model.CpSolver, resolution: float) -> Schedule:
        """The solver's schedule, in seconds."""
        return Schedule(
            tuple(solver.value(var) * resolution for var in self.start),
            tuple(i in self.parallel and bool(solver.value(self.parallel[i])) for i in range(len(self.start))),
        )

    def _interval(self, i: int, mode: bool, present=None, name: str = ""):
        """Operator i's interval in `mode`, optional on `present` (by default: on running in `mode`,
        if it has two modes)."""
        m, size = self.model, self.ticks[i][mode]
        if present is None and i in self.parallel:
            present = self.parallel[i] if mode else ~self.parallel[i]
        if present is None:
            return m.new_interval_var(self.start[i], size, self.end[i], f"op{i}{name}")
        start = m.new_int_var(0, self.horizon, f"start{i}m{mode:d}{name}")
        m.add(start == self.start[i]).only_enforce_if(present)
        m.add(self.end[i] == self.start[i] + size).only_enforce_if(present)
        return m.new_optional_fixed_size_interval_var(start, size, present, f"op{i}m{mode:d}{name}")

    def _add_capacity(self) -> None:
        for kind, count in enumerate((self.problem.num_tc, self.problem.num_vc)):
            runs = [
                (interval, self.problem.demands[i][mode][kind])
                for i, by_mode in enumerate(self.intervals)
                for mode, interval in by_mode.items()
                if self.problem.demands[i][mode][kind]
            ]
            if runs:
                self.model.add_cumulative([r[0] for r in runs], [r[1] for r in runs], count)

    def _add_named_cores(self, kind: int, users: list[int], count: int, parallel_runs: list, hint: Schedule) -> None:
        m = self.model
        hinted = assign_cores(self.problem, hint)
        on = {}
        for i in users:
            for c in range(count):
                on[i, c] = m.new_bool_var(f"core{kind}_{i}_{c}")
                m.add_hint(on[i, c], hinted[i][kind] == c)
            m.add(sum(on[i, c] for c in range(count)) == (~self.parallel[i] if i in self.parallel else 1))
        for position, i in enumerate(users):
            for c in range(1, count):
                m.add(on[i, c] <= sum(on[j, c - 1] for j in users[:position]))
        for c in range(count):
            runs = [self._interval(i, False, on[i, c], f"core{kind}_{c}") for i in users]
            m.add_no_overlap(runs + parallel_runs)


def _solver(time_limit: float, relative_gap: float, workers: int, portfolio: bool) -> cp_model.CpSolver:
    """`phaze_common.cpsat.portfolio_solver`, or without the portfolio the default search alone on one
    thread for `QUICK_SEARCH`; either stopping at `relative_gap`."""
    if portfolio:
        solver = portfolio_solver(time_limit, workers)
    else:
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = max(time_limit, 1e-3)
        solver.parameters.num_workers = 1
        solver.parameters.max_deterministic_time = QUICK_SEARCH
    solver.parameters.relative_gap_limit = relative_gap
    return solver


def solve_cpsat(
    problem: ScheduleProblem,
    incumbent: Schedule,
    time_limit: float,
    relative_gap: float = 0.0,
    workers: int = 1,
) -> BackendOutcome:
    """Minimise the makespan with CP-SAT, starting from `incumbent` (a feasible schedule): first the
    exclusive bound; unless that closes the gap, the full model, searched alone for a moment (which
    settles most layers), then by CP-SAT's portfolio of strategies and neighbourhood searches."""
    deadline = time.monotonic() + time_limit
    resolution = incumbent.makespan(problem) / TICKS_PER_HORIZON
    bound, modes = exclusive_bound(problem, resolution, BOUND_SHARE * time_limit, workers)
    if modes is not None:
        candidate = improve_modes(problem, schedule_in_modes(problem, modes))
        incumbent = min(incumbent, candidate, key=lambda schedule: schedule.makespan(problem))
    upper = incumbent.makespan(problem)
    proven = upper <= bound * (1 + PROOF_TOLERANCE)
    if proven or upper - bound <= relative_gap * upper:
        return BackendOutcome(incumbent, bound, proven)
    ticks = [(math.ceil(op.latency / resolution), math.ceil(op.parallel_latency / resolution)) for op in problem.ops]
    built = _Model(problem, ticks, retime(problem, incumbent, ticks))
    built.model.add(built.makespan >= math.floor(bound / resolution))
    found = []
    for portfolio in (False, True) if workers == 1 else (True,):  # both from the heuristic's hint
        solver = _solver(deadline - time.monotonic(), relative_gap, workers, portfolio)
        status = interruptible.solve(solver, built.model)
        if status in (cp_model.MODEL_INVALID, cp_model.INFEASIBLE):
            raise RuntimeError(f"CP-SAT returned {solver.status_name(status)} for a model with a feasible hint")
        bound = max(bound, (solver.best_objective_bound - len(problem.ops)) * resolution)
        if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            found.append((solver.objective_value, built.solution(solver, resolution)))
        if status == cp_model.OPTIMAL or time.monotonic() >= deadline:
            break
    best = min(found, key=lambda entry: entry[0])[1] if found else incumbent
    return BackendOutcome(best, bound, status == cp_model.OPTIMAL and relative_gap == 0.0)
