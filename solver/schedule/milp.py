"""The original's big-M MILP, through PuLP with CBC, HiGHS or gurobipy.

The original (msr-fiddle/phaze at fed7cde) builds it for Gurobi in `Solver/ilp.py`, function `ilp`
(lines 316-489); constraint numbers follow the `# constraint N` comments there. As in the original,
core capacity is first left out; when the solution overloads a core type, the model is solved again
with per-core assignment variables for that type. Three changes, all keeping the optimum: the big-M
and the makespan's upper bound are the heuristic makespan (not the sum of latencies); a TCandVC
operator picks its TC and its VC independently (constraint (17) pairs them by index, the semantics
here are counts, see `problem.py`); collectives and zero-latency operators hold no core, so (11) and
(18) skip them. Time is counted in units of the heuristic makespan, which keeps the coefficients
near 1 for the solvers' tolerances.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from functools import partial
from itertools import permutations
from pathlib import Path

import pulp

from solver.schedule import interruptible
from solver.schedule.check import violations
from solver.schedule.cores import assign_cores
from solver.schedule.listsched import Schedule
from solver.schedule.problem import ScheduleProblem
from solver.schedule.result import BackendOutcome

MILP_SOLVERS = ("cbc", "highs", "gurobi")
#: A solver's objective may exceed the true optimum by its feasibility tolerance (in time units).
SOLVER_TOLERANCE = 1e-6
_BIG_M = 1.0 + SOLVER_TOLERANCE
_CAPACITY = {"tc_capacity": ("uses_tc", "num_tc"), "vc_capacity": ("uses_vc", "num_vc")}
#: gurobipy's GRB.INTERRUPTED: the optimization was stopped (Model.terminate or a Ctrl-C).
_GUROBI_INTERRUPTED = 11


class LicenceLimitError(RuntimeError):
    """gurobipy's size-limited licence cannot solve a model this large."""


def solve_milp(
    problem: ScheduleProblem,
    incumbent: Schedule,
    time_limit: float,
    solver: str = "cbc",
    relative_gap: float = 0.0,
    workers: int = 1,
) -> BackendOutcome:
    """Solve the MILP, adding per-core assignment for each core type the solution overloads."""
    deadline = time.monotonic() + time_limit
    unit = incumbent.makespan(problem)
    constrained: frozenset[str] = frozenset()
    bound = 0.0
    while (remaining := deadline - time.monotonic()) > 0:
        model = _Model(problem, incumbent, unit, constrained)
        outcome = model.solve(solver, remaining, relative_gap, workers)
        bound = max(bound, outcome.lower_bound)  # every model is a relaxation of the full problem
        if outcome.schedule is None:
            break
        found = violations(problem, outcome.schedule.start, outcome.schedule.parallel, relative_tolerance=SOLVER_TOLERANCE)
        overloaded = {v.kind for v in found if v.kind in _CAPACITY} - constrained
        if not overloaded:
            return BackendOutcome(outcome.schedule, bound, outcome.optimal)
        constrained |= overloaded
    return BackendOutcome(None, bound, False)


class _Model:
    """One MILP: variables T, t_i, y_i, x_ij (and z_ic for the constrained core types)."""

    def __init__(self, problem: ScheduleProblem, incumbent: Schedule, unit: float, constrained: frozenset[str]):
        self.problem, self.unit = problem, unit
        n, ops = len(problem.ops), problem.ops
        self.lp = lp = pulp.LpProblem("schedule", pulp.LpMinimize)
        self.makespan = lp.add_variable("T", 0, _BIG_M)
        self.t = [lp.add_variable(f"t{i}", 0, _BIG_M) for i in range(n)]
        self.y = {i: lp.add_variable(f"y{i}", cat="Binary") for i, op in enumerate(ops) if len(op.modes) == 2}
        self.x = {  # 1 = i ends before j starts; fixed where a path orders them (7, 8)
            (i, j): (
                1 if j in problem.descendants[i]
                else 0 if i in problem.descendants[j]
                else lp.add_variable(f"x{i}_{j}", cat="Binary")
            )
            for i, j in permutations(range(n), 2)
        }
        self.z: dict[tuple[str, int, int], pulp.LpVariable] = {}
        self.lp += self.makespan
        self._add_order_constraints()
        for kind in sorted(constrained):
            self._add_capacity(kind)
        self._warm_start(incumbent)

    def _duration(self, i: int):
        op = self.problem.ops[i]
        single = op.latency / self.unit
        return single + (op.parallel_latency / self.unit - single) * self.y[i] if i in self.y else single

    def _add_order_constraints(self) -> None:
        problem, x, t, lp, n = self.problem, self.x, self.t, self.lp, len(self.problem.ops)
        for i in range(n):
            lp += self.makespan >= t[i] + self._duration(i)  # (3)
        free = [(i, j) for (i, j), v in x.items() if not isinstance(v, int)]
        for i, j in free:
            lp += t[i] + self._duration(i) - _BIG_M * (1 - x[i, j]) <= t[j]  # (10)
            if i < j:
                lp += x[i, j] + x[j, i] <= 1  # (5)
            if i in self.y and problem.ops[i].uses_cores and problem.ops[j].uses_cores:
                lp += x[i, j] + x[j, i] >= self.y[i]  # (11)
        for i, j in permutations(range(n), 2):
            if j in problem.descendants[i]:
                lp += t[i] + self._duration(i) <= t[j]  # (7, 8, 9)
        for i, j, k in permutations(range(n), 3):  # (6), rows with a variable that can bind
            terms = (x[i, j], x[j, k], x[i, k])
            fixed = [isinstance(v, int) for v in terms]
            if not all(fixed) and not (fixed[0] and terms[0] == 0) and not (fixed[1] and terms[1] == 0):
                lp += terms[0] + terms[1] - terms[2] <= 1

    def _add_capacity(self, kind: str) -> None:
        uses, count_field = _CAPACITY[kind]
        ops, cores = self.problem.ops, range(getattr(self.problem, count_field))
        users = [i for i, op in enumerate(ops) if getattr(op, uses) and op.uses_cores]
        for i in users:
            for c in cores:
                self.z[kind, i, c] = self.lp.add_variable(f"z_{kind}_{i}_{c}", cat="Binary")
            self.lp += pulp.lpSum(self.z[kind, i, c] for c in cores) + self.y.get(i, 0) == 1  # (12)
        for a, i in enumerate(users):
            for j in users[a + 1 :]:
                if not self.problem.comparable(i, j):
                    for c in cores:
                        self.lp += self.x[i, j] + self.x[j, i] >= self.z[kind, i, c] + self.z[kind, j, c] - 1  # (18)

    def _warm_start(self, schedule: Schedule) -> None:
        """Set every variable from a feasible schedule (used by CBC and Gurobi)."""
        ops, unit = self.problem.ops, self.unit
        start = schedule.start
        end = [s + op.duration(p) for s, p, op in zip(start, schedule.parallel, ops)]
        self.makespan.setInitialValue(max(end, default=0.0) / unit)
        for i, var in enumerate(self.t):
            var.setInitialValue(start[i] / unit)
        for i, var in self.y.items():
            var.setInitialValue(int(schedule.parallel[i]))
        for (i, j), var in self.x.items():
            if not isinstance(var, int):
                before, after = end[i] <= start[j], end[j] <= start[i]
                var.setInitialValue(int(before and (not after or i < j)))
        cores = assign_cores(self.problem, schedule)
        for (kind, i, c), var in self.z.items():
            var.setInitialValue(int(cores[i][0 if kind == "tc_capacity" else 1] == c))

    def solve(self, solver: str, time_limit: float, relative_gap: float, workers: int) -> BackendOutcome:
        """Run one solver; read its schedule and its proven bound (seconds)."""
        stopping = threading.Event()
        backend = _solver(solver, time_limit, relative_gap, workers, stopping)
        try:
            interruptible.run(lambda: self.lp.solve(backend), partial(self._stop, stopping))
            if solver == "gurobi" and self.lp.solverModel.Status == _GUROBI_INTERRUPTED and not stopping.is_set():
                # Gurobi takes SIGINT itself while it optimizes and stops as if asked to; the Ctrl-C
                # goes back to Python's handler (here, in the main thread, it raises at once).
                signal.raise_signal(signal.SIGINT)
            bound = self._bound(solver, relative_gap)
            solution = self.lp.sol_status
            if solver == "gurobi" and solution != pulp.LpSolutionOptimal and self.lp.solverModel.SolCount > 0:
                # PuLP's GUROBI reads the incumbent after a time limit but reports no solution (its
                # TIME_LIMIT maps to LpStatusNotSolved); HiGHS and CBC report it as integer feasible.
                solution = pulp.LpSolutionIntegerFeasible
        except Exception as error:
            if getattr(error, "errno", None) == 10010:  # gurobipy: model too large for the licence
                raise LicenceLimitError(
                    f"milp_solver: gurobipy's size-limited licence allows 2000 variables and 2000 constraints; "
                    f"this model has {self.lp.numVariables()} variables and {self.lp.numConstraints()} "
                    f"constraints; use backend='cpsat', milp_solver='cbc' or 'highs', or a full Gurobi licence"
                ) from error
            raise
        finally:
            if solver == "gurobi":
                backend.close()
        if solution not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
            return BackendOutcome(None, bound, False)
        schedule = Schedule(
            tuple(max(0.0, var.value()) * self.unit for var in self.t),
            tuple(i in self.y and self.y[i].value() > 0.5 for i in range(len(self.t))),
        )
        optimal = solution == pulp.LpSolutionOptimal and relative_gap == 0.0
        return BackendOutcome(schedule, bound, optimal)

    def _stop(self, stopping: threading.Event) -> None:
        """Stop the solver of an interrupted solve: HiGHS polls `stopping` in its interrupt
        callbacks, gurobipy's model is told to terminate, CBC's process is terminated."""
        stopping.set()
        model = getattr(self.lp, "solverModel", None)
        if hasattr(model, "terminate"):
            model.terminate()
        _terminate_children("cbc")

    def _bound(self, solver: str, relative_gap: float) -> float:
        if solver == "highs":
            units = self.lp.solverModel.getInfo().mip_dual_bound
        elif solver == "gurobi":
            units = self.lp.solverModel.ObjBound
        elif self.lp.sol_status == pulp.LpSolutionOptimal:  # CBC reports no bound otherwise
            units = self.makespan.value() * (1 - relative_gap)
        else:
            units = 0.0
        return max(0.0, units - SOLVER_TOLERANCE) * self.unit


def _terminate_children(name: str) -> None:
    """SIGTERM to this process's children running `name` (CBC ignores a Ctrl-C for seconds). Found
    in Linux's /proc; elsewhere they end at their time limit."""
    for listing in Path(f"/proc/{os.getpid()}/task").glob("*/children"):
        try:
            for child in listing.read_text().split():
                if Path(f"/proc/{child}/comm").read_text().strip() == name:
                    os.kill(int(child), signal.SIGTERM)
        except (OSError, ValueError):  # gone meanwhile
            continue


def _highs_interrupt(stopping: threading.Event) -> Callable:
    """A HiGHS callback that asks the solve to stop once `stopping` is set."""

    def callback(kind, message, data_out, data_in, user_data) -> None:
        if data_in is not None and stopping.is_set():
            data_in.user_interrupt = True

    return callback


def _solver(name: str, time_limit: float, relative_gap: float, workers: int,
            stopping: threading.Event) -> pulp.LpSolver:
    gap = relative_gap or None
    if name == "cbc":
        try:
            import cbcbox
        except ImportError:
            raise RuntimeError("milp_solver: 'cbc' needs cbcbox (pip install 'pulp[cbc]'); use 'highs'") from None
        # COIN_CMD on cbcbox's binary, as PuLP 3.3 advises (PULP_CBC_CMD and the CBC bundled with
        # PuLP are deprecated, to be removed in PuLP 4.0); the path, not PATH, finds it in any venv.
        return pulp.COIN_CMD(path=cbcbox.cbc_bin_path(), msg=False, timeLimit=time_limit, gapRel=gap,
                             warmStart=True, threads=workers)
    if name == "highs":
        if not pulp.HiGHS(msg=False).available():
            raise RuntimeError("milp_solver: 'highs' needs highspy, which does not import here; use 'cbc'")
        import highspy

        interrupts = [highspy.cb.HighsCallbackType.kCallbackSimplexInterrupt,
                      highspy.cb.HighsCallbackType.kCallbackIpmInterrupt,
                      highspy.cb.HighsCallbackType.kCallbackMipInterrupt]
        return pulp.HiGHS(msg=False, timeLimit=time_limit, gapRel=gap, threads=workers,
                          callbackTuple=(_highs_interrupt(stopping), None), callbacksToActivate=interrupts)
    # An environment of its own (manageEnv), created with OutputFlag 0, prints nothing, not even the
    # licence banner of gurobipy's default environment; `close` disposes of it and its licence.
    solver = pulp.GUROBI(msg=False, timeLimit=time_limit, gapRel=gap, warmStart=True, manageEnv=True,
                         Threads=workers)
    if not solver.available():
        raise RuntimeError("milp_solver: 'gurobi' needs gurobipy installed and licensed; use 'cbc' or 'highs'")
    return solver
