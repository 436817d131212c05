"""Which core runs which one-core operator: a schedule keeps counts, this names the cores."""

from __future__ import annotations

from solver.schedule.check import RELATIVE_TOLERANCE
from solver.schedule.listsched import Schedule
from solver.schedule.problem import ScheduleProblem


def lanes(intervals: list[tuple[float, float]], tolerance: float) -> list[int]:
    """Greedy interval colouring in order of start: each interval takes the lowest lane free at its
    start, which uses as many lanes as intervals ever overlap."""
    free_at: list[float] = []
    lane = [0] * len(intervals)
    for k in sorted(range(len(intervals)), key=lambda k: intervals[k]):
        begin, finish = intervals[k]
        lane[k] = next((n for n, t in enumerate(free_at) if t <= begin + tolerance), len(free_at))
        if lane[k] == len(free_at):
            free_at.append(finish)
        else:
            free_at[lane[k]] = finish
    return lane


def assign_cores(problem: ScheduleProblem, schedule: Schedule) -> tuple[tuple[int | None, int | None], ...]:
    """(TC index, VC index) of every one-core operator; None where it uses no such core or runs
    parallel (then it has them all)."""
    ends = [s + op.duration(p) for s, p, op in zip(schedule.start, schedule.parallel, problem.ops)]
    tolerance = RELATIVE_TOLERANCE * max([1e-300, *ends])
    cores: list[list[int | None]] = [[None, None] for _ in problem.ops]
    for kind, count, uses in ((0, problem.num_tc, "uses_tc"), (1, problem.num_vc, "uses_vc")):
        users = [
            i for i, op in enumerate(problem.ops) if getattr(op, uses) and op.uses_cores and not schedule.parallel[i]
        ]
        for i, lane in zip(users, lanes([(schedule.start[i], ends[i]) for i in users], tolerance)):
            if lane >= count:
                raise ValueError(f"schedule: operator {i} finds no free core among {count}")
            cores[i][kind] = lane
    return tuple((tc, vc) for tc, vc in cores)
