"""The result of scheduling one layer, shared by every backend."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from solver.schedule.listsched import Schedule
from solver.schedule.problem import ScheduleProblem

#: A makespan within this fraction of the lower bound is proven optimal (float rounding).
PROOF_TOLERANCE = 1e-9


@dataclass(frozen=True)
class BackendOutcome:
    """What an exact backend found: its best schedule (None if none within the time limit), a proven
    lower bound on the makespan [s], and whether it proved its schedule optimal."""

    schedule: Schedule | None
    lower_bound: float
    optimal: bool


@dataclass(frozen=True)
class CoreUtilisation:
    """How busy the cores of one type are: the largest busy fraction at any time, and the busy
    core-seconds over cores x makespan."""

    peak: float
    mean: float


@dataclass(frozen=True)
class ScheduleResult:
    """A validated schedule with its makespan [s], energy [J], utilisation and optimality gap.

    `status` is "optimal" when the backend or the lower bound proved it (the CP-SAT backend proves
    it on latencies rounded up to its time resolution, `gap` says how far that is), "feasible"
    otherwise: stopped at the time limit or within `relative_gap`, or the heuristic's schedule.
    `gap` = (makespan - lower_bound) / makespan.
    """

    makespan: float
    start: tuple[float, ...]
    parallel: tuple[bool, ...]
    energy: float
    tc_utilisation: CoreUtilisation
    vc_utilisation: CoreUtilisation
    lower_bound: float
    gap: float
    status: str
    backend: str
    solve_time: float

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ScheduleResult:
        fields = dict(data)
        fields["start"] = tuple(fields["start"])
        fields["parallel"] = tuple(fields["parallel"])
        fields["tc_utilisation"] = CoreUtilisation(**fields["tc_utilisation"])
        fields["vc_utilisation"] = CoreUtilisation(**fields["vc_utilisation"])
        return cls(**fields)


def _utilisation(problem: ScheduleProblem, schedule: Schedule, makespan: float) -> tuple[CoreUtilisation, ...]:
    """Peak and mean busy fraction of TCs and VCs, from the busy cores of every running operator."""
    events: list[tuple[float, int, int]] = []
    core_seconds = [0.0, 0.0]
    for i, op in enumerate(problem.ops):
        duration = op.duration(schedule.parallel[i])
        busy = problem.busy(i, schedule.parallel[i])
        if duration > 0 and busy != (0, 0):
            events += [(schedule.start[i], busy[0], busy[1]), (schedule.start[i] + duration, -busy[0], -busy[1])]
            core_seconds[0] += busy[0] * duration
            core_seconds[1] += busy[1] * duration
    peak, running = [0, 0], [0, 0]
    for _, tc, vc in sorted(events, key=lambda e: (e[0], e[1] + e[2] > 0)):  # ends before starts
        running = [running[0] + tc, running[1] + vc]
        peak = [max(peak[0], running[0]), max(peak[1], running[1])]
    result = []
    for kind, cores in enumerate((problem.num_tc, problem.num_vc)):
        if cores == 0 or makespan == 0:
            result.append(CoreUtilisation(0.0, 0.0))
        else:
            result.append(CoreUtilisation(peak[kind] / cores, core_seconds[kind] / (cores * makespan)))
    return tuple(result)


def make_result(
    problem: ScheduleProblem,
    schedule: Schedule,
    lower_bound: float,
    status: str,
    backend: str,
    solve_time: float,
) -> ScheduleResult:
    """Measure a schedule: makespan and energy from the real latencies, utilisation and the gap."""
    makespan = schedule.makespan(problem)
    lower_bound = min(lower_bound, makespan)  # a solver's bound can exceed it by its tolerance
    tc, vc = _utilisation(problem, schedule, makespan)
    return ScheduleResult(
        makespan=makespan,
        start=schedule.start,
        parallel=schedule.parallel,
        energy=sum(op.energy_of(p) for op, p in zip(problem.ops, schedule.parallel)),
        tc_utilisation=tc,
        vc_utilisation=vc,
        lower_bound=lower_bound,
        gap=(makespan - lower_bound) / makespan if makespan > 0 else 0.0,
        status=status,
        backend=backend,
        solve_time=solve_time,
    )
