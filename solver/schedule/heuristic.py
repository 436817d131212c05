"""The list-scheduling heuristic: an upper bound, and the exact backends' warm start."""

from __future__ import annotations

from collections.abc import Sequence

from solver.schedule.listsched import Schedule, list_schedule
from solver.schedule.problem import ScheduleProblem


def _tail_lengths(problem: ScheduleProblem, parallel: Sequence[bool] | None = None) -> list[float]:
    """For each operator, the longest path from its start to the end: in the given modes, or in the
    shortest mode of each operator."""
    tail = [0.0] * len(problem.ops)
    for i in reversed(problem.topological_order):
        op = problem.ops[i]
        duration = min(op.duration(m) for m in op.modes) if parallel is None else op.duration(parallel[i])
        tail[i] = duration + max((tail[j] for j in problem.successors[i]), default=0.0)
    return tail


def schedule_in_modes(problem: ScheduleProblem, parallel: Sequence[bool]) -> Schedule:
    """List schedule in the given modes, longest remaining path first."""
    return list_schedule(problem, [-t for t in _tail_lengths(problem, parallel)], parallel)


def improve_modes(problem: ScheduleProblem, schedule: Schedule,
                  tried: dict[tuple[bool, ...], Schedule] | None = None) -> Schedule:
    """Hill-climb on the modes: switch one operator's mode, or that of an operator together with every
    operator in the same mode that precedence lets run alongside it (so that a group of independent
    operators can go from parallel runs in a row to one-core runs side by side, or back). `tried`
    holds the schedules of the modes tried so far (a list schedule is a function of its modes): a
    climb that comes back to them, or another climb on the same problem, schedules them once."""
    tried = {} if tried is None else tried
    flexible = [i for i, op in enumerate(problem.ops) if len(op.modes) == 2]
    best, best_makespan = schedule, schedule.makespan(problem)
    improved = True
    while improved:
        improved = False
        modes = best.parallel
        groups = {
            frozenset(j for j in flexible if j == i or (modes[j] == modes[i] and not problem.comparable(i, j)))
            for i in flexible
        }
        moves = [[i] for i in flexible] + [sorted(g) for g in groups if len(g) > 1]
        for move in moves:
            trial = list(best.parallel)
            for j in move:
                trial[j] = not trial[j]
            candidate = tried.get(tuple(trial))
            if candidate is None:
                candidate = tried[tuple(trial)] = schedule_in_modes(problem, trial)
            if candidate.makespan(problem) < best_makespan * (1 - 1e-12):
                best, best_makespan, improved = candidate, candidate.makespan(problem), True
    return best


def heuristic_schedule(problem: ScheduleProblem) -> Schedule:
    """List schedules by a few rules (longest tail first or input order; modes chosen per operator
    by earliest end, all one-core, or all parallel where that is faster), then a hill-climb on the
    modes from the best of them and from all one-core; the best schedule found."""
    tail = _tail_lengths(problem)
    priorities = ([-t for t in tail], [float(p) for p in range(len(problem.ops))])
    mode_rules = (None, [False] * len(problem.ops), [len(op.modes) == 2 for op in problem.ops])
    rules = [list_schedule(problem, pr, modes) for pr in priorities for modes in mode_rules]
    starts = (min(rules, key=lambda s: s.makespan(problem)), schedule_in_modes(problem, [False] * len(problem.ops)))
    tried: dict[tuple[bool, ...], Schedule] = {}
    return min((improve_modes(problem, s, tried) for s in starts), key=lambda s: s.makespan(problem))
