"""An independent check of a schedule against the problem's rules, on real numbers.

It shares nothing with the solvers: it reads start times and modes and checks, with a tolerance
relative to the schedule's length, precedence, the TC and VC counts, and that an intra-operator
parallel operator overlaps no other core operator.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from solver.schedule.problem import ScheduleProblem

#: Two times closer than this fraction of the schedule's length count as equal.
RELATIVE_TOLERANCE = 1e-9


@dataclass(frozen=True)
class Violation:
    """One broken rule: `kind` is shape, start, mode, precedence, tc_capacity, vc_capacity,
    exclusivity or makespan."""

    kind: str
    message: str


class InvalidSchedule(ValueError):
    """A schedule breaks the problem's rules; the message lists every violation."""


def violations(
    problem: ScheduleProblem,
    start: Sequence[float],
    parallel: Sequence[bool],
    makespan: float | None = None,
    relative_tolerance: float = RELATIVE_TOLERANCE,
) -> list[Violation]:
    """Every rule the schedule breaks (an empty list for a valid schedule)."""
    n = len(problem.ops)
    if len(start) != n or len(parallel) != n:
        return [Violation("shape", f"expected {n} start times and modes, got {len(start)} and {len(parallel)}")]
    end = [s + op.duration(p) for s, p, op in zip(start, parallel, problem.ops)]
    tol = relative_tolerance * max([1e-300, *end])
    found = [Violation("start", f"operator {i} starts at {s!r} < 0") for i, s in enumerate(start) if s < -tol]
    found += [
        Violation("mode", f"operator {i} ({problem.ops[i].core}, latency {problem.ops[i].latency}) cannot be parallel")
        for i in range(n)
        if parallel[i] and not problem.ops[i].uses_cores
    ]
    found += [
        Violation("precedence", f"operator {j} starts at {start[j]!r} before its predecessor {i} ends at {end[i]!r}")
        for i, j in problem.edges
        if start[j] < end[i] - tol
    ]
    running = [i for i in range(n) if problem.ops[i].uses_cores and end[i] - start[i] > tol]
    found += _capacity_violations(problem, start, end, parallel, running, tol)
    found += [
        Violation("exclusivity", f"parallel operator {i} overlaps operator {j}")
        for i in running
        if parallel[i]
        for j in running
        if j != i and min(end[i], end[j]) - max(start[i], start[j]) > tol
    ]
    if makespan is not None and abs(makespan - max(end, default=0.0)) > tol:
        found.append(Violation("makespan", f"makespan {makespan!r} != last end {max(end, default=0.0)!r}"))
    return found


def _capacity_violations(problem, start, end, parallel, running, tol) -> list[Violation]:
    """Count the one-core operators of each type running at every start time."""
    found = []
    for kind, cores, uses in (
        ("tc_capacity", problem.num_tc, lambda op: op.uses_tc),
        ("vc_capacity", problem.num_vc, lambda op: op.uses_vc),
    ):
        users = [i for i in running if not parallel[i] and uses(problem.ops[i])]
        for k in users:
            at = start[k]
            active = [i for i in users if start[i] <= at + tol and end[i] > at + tol]
            if len(active) > cores:
                found.append(Violation(kind, f"{len(active)} operators {active} on {cores} cores at t={at!r}"))
                break
    return found


def check_schedule(
    problem: ScheduleProblem,
    start: Sequence[float],
    parallel: Sequence[bool],
    makespan: float | None = None,
) -> None:
    """Raise InvalidSchedule listing every violation; return None for a valid schedule."""
    found = violations(problem, start, parallel, makespan)
    if found:
        raise InvalidSchedule("invalid schedule: " + "; ".join(f"{v.kind}: {v.message}" for v in found))
