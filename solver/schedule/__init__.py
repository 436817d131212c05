"""Per-layer operator scheduling: the shortest schedule of a layer's fused operators on the TC and
VC cores of one accelerator (exact CP-SAT and MILP backends, a list-scheduling heuristic, bounds,
an independent checker, a cache of solved layers and a Gantt chart)."""

#: Version of the scheduling model (the problem's semantics and the solvers); part of the key of
#: every cached schedule. Bump when the same problem would get a different schedule.
MODEL_VERSION = 1

from solver.schedule.cache import ScheduleCache
from solver.schedule.check import InvalidSchedule, Violation, check_schedule, violations
from solver.schedule.gantt import gantt_figure, plot_gantt
from solver.schedule.heuristic import heuristic_schedule
from solver.schedule.listsched import Schedule
from solver.schedule.lower_bound import LayerShape, critical_path_and_work, lower_bound
from solver.schedule.milp import MILP_SOLVERS, LicenceLimitError
from solver.schedule.problem import CORE_TYPES, Op, ScheduleProblem
from solver.schedule.result import CoreUtilisation, ScheduleResult
from solver.schedule.solve import BACKENDS, solve

__all__ = [
    "MODEL_VERSION",
    "BACKENDS",
    "CORE_TYPES",
    "MILP_SOLVERS",
    "CoreUtilisation",
    "InvalidSchedule",
    "LayerShape",
    "LicenceLimitError",
    "Op",
    "Schedule",
    "ScheduleCache",
    "ScheduleProblem",
    "ScheduleResult",
    "Violation",
    "critical_path_and_work",
    "heuristic_schedule",
    "lower_bound",
    "gantt_figure",
    "plot_gantt",
    "solve",
    "check_schedule",
    "violations",
]
