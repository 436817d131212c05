"""Every backend against a brute-force optimum on random DAGs of 2-7 operators.

The brute force below reads only the problem's data and states the scheduling rules (the semantics
in the docstring of `solver/schedule/problem.py`) directly; it shares no code with `solver.schedule`.
"""

from __future__ import annotations

import math
import random

import pytest

from solver.schedule import Op, ScheduleProblem, check_schedule, lower_bound, solve
from solver.schedule.cpsat import TICKS_PER_HORIZON
from solver.schedule.milp import SOLVER_TOLERANCE

CORE_WEIGHTS = {"TC": 0.35, "VC": 0.3, "TCandVC": 0.2, "collective": 0.15}


def random_problem(seed: int) -> ScheduleProblem:
    """A random DAG: mixed core types, latencies over several decades, some zero, shuffled indices."""
    rng = random.Random(seed)
    n = rng.randint(2, 7)
    scale = 10.0 ** rng.randint(-7, -2)
    ops = []
    for _ in range(n):
        core = rng.choices(list(CORE_WEIGHTS), weights=list(CORE_WEIGHTS.values()))[0]
        latency = 0.0 if rng.random() < 0.05 else rng.uniform(0.1, 10.0) * scale
        if core == "collective":
            parallel_latency = latency
        elif latency == 0.0:
            parallel_latency = rng.choice([0.0, rng.uniform(0.1, 10.0) * scale])
        else:
            parallel_latency = latency * rng.uniform(0.15, 1.3)
        ops.append(Op(core, latency, parallel_latency, energy=rng.random(), parallel_energy=rng.random()))
    label = list(range(n))
    rng.shuffle(label)
    density = rng.uniform(0.0, 0.6)
    edges = [(label[i], label[j]) for i in range(n) for j in range(i + 1, n) if rng.random() < density]
    ordered = [None] * n
    for old, new in enumerate(label):
        ordered[new] = ops[old]
    return ScheduleProblem(ordered, edges, num_tc=rng.randint(1, 4), num_vc=rng.randint(1, 2))


def _uses_cores(op: Op) -> bool:
    return op.core != "collective" and op.latency > 0


def _fits(placed: list[tuple], start: float, end: float, op: Op, parallel: bool, num_tc: int, num_vc: int) -> bool:
    """The rules: at most num_tc one-core TC users and num_vc one-core VC users at any time, and a
    parallel operator overlaps no other core operator. Zero-length runs and collectives hold nothing."""
    if end <= start or not _uses_cores(op):
        return True
    others = [q for q in placed if q[0] < end and start < q[1]]
    if parallel:
        return not others
    if any(q[4] for q in others):
        return False
    tc, vc = op.core in ("TC", "TCandVC"), op.core in ("VC", "TCandVC")
    for point in [start] + [q[0] for q in others if q[0] > start]:
        active = [q for q in others if q[0] <= point < q[1]]
        if sum(q[2] for q in active) + tc > num_tc or sum(q[3] for q in active) + vc > num_vc:
            return False
    return True


def brute_force_makespan(problem: ScheduleProblem) -> float:
    """The optimal makespan, by enumerating every precedence-feasible order of the operators and every
    mode of each, and starting each operator in turn at its earliest feasible time.

    Why this is exact: list an optimal schedule's operators by start time and replay them in that
    order, with their modes, each at its earliest feasible time. By induction each one starts no
    later than in the optimal schedule: the operators placed before k started no later than k and end
    no later than before, so one that overlaps k's original slot in the replay overlapped it in the
    optimal schedule too; the busy cores k meets there are a subset of a legal set, and the rules only
    forbid sets of concurrent operators, so k's original start is still feasible. The earliest feasible
    start is the ready time or the end of a placed operator (an infeasible start becomes feasible only
    when something ends), so trying those times is enough.
    """
    ops, n = problem.ops, len(problem.ops)
    preds = [[i for i, j in problem.edges if j == k] for k in range(n)]
    best = [math.inf]

    def search(placed: list[tuple], end: dict[int, float], makespan: float) -> None:
        if makespan >= best[0]:
            return  # adding operators never shortens a schedule
        if len(end) == n:
            best[0] = makespan
            return
        for k in range(n):
            if k in end or any(p not in end for p in preds[k]):
                continue
            ready = max((end[p] for p in preds[k]), default=0.0)
            for parallel in (False, True) if _uses_cores(ops[k]) else (False,):
                duration = ops[k].parallel_latency if parallel else ops[k].latency
                times = sorted({ready, *(q[1] for q in placed if q[1] > ready)})
                start = next(
                    t for t in times if _fits(placed, t, t + duration, ops[k], parallel, problem.num_tc, problem.num_vc)
                )
                entry = (start, start + duration, int(not parallel and ops[k].core in ("TC", "TCandVC")),
                         int(not parallel and ops[k].core in ("VC", "TCandVC")), parallel)
                holds = _uses_cores(ops[k]) and duration > 0
                finish = start + duration
                search(placed + [entry] if holds else placed, {**end, k: finish}, max(makespan, finish))

    search([], {}, 0.0)
    return best[0]


def _check_exact(problem: ScheduleProblem, optimum: float, backend: str, **options) -> None:
    result = solve(problem, backend, time_limit=30.0, **options)
    check_schedule(problem, result.start, result.parallel, result.makespan)
    assert result.status == "optimal"
    # What each backend may lose to integer time: CP-SAT rounds every duration up to whole ticks of
    # (heuristic makespan) / TICKS_PER_HORIZON, less than one tick per operator; the MILP solvers
    # work to SOLVER_TOLERANCE in units of the heuristic makespan.
    heuristic = solve(problem, "heuristic").makespan
    slack = heuristic * (len(problem.ops) / TICKS_PER_HORIZON if backend == "cpsat" else SOLVER_TOLERANCE)
    assert optimum * (1 - 1e-9) <= result.makespan <= optimum * (1 + 1e-9) + slack
    assert result.lower_bound <= optimum * (1 + 1e-9)


@pytest.mark.parametrize("seed", range(200))
def test_backends_match_brute_force(seed: int) -> None:
    problem = random_problem(seed)
    optimum = brute_force_makespan(problem)
    _check_exact(problem, optimum, "cpsat")
    _check_exact(problem, optimum, "milp", milp_solver="cbc")
    heuristic = solve(problem, "heuristic")
    check_schedule(problem, heuristic.start, heuristic.parallel, heuristic.makespan)
    assert heuristic.makespan >= optimum * (1 - 1e-9)
    assert lower_bound(problem) <= optimum * (1 + 1e-9)


@pytest.mark.parametrize("seed", range(200, 230))
def test_highs_matches_brute_force(seed: int) -> None:
    problem = random_problem(seed)
    _check_exact(problem, brute_force_makespan(problem), "milp", milp_solver="highs")


@pytest.mark.parametrize("seed", range(230, 250))
def test_gurobi_matches_brute_force(seed: int) -> None:
    pytest.importorskip("gurobipy")
    problem = random_problem(seed)
    _check_exact(problem, brute_force_makespan(problem), "milp", milp_solver="gurobi")
