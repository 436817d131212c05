"""solver.schedule: problem checks, hand-calculated schedules, bounds, the validator, time limits,
the cache and the Gantt chart. (Exactness against a brute force: test_schedule_exact.py.)"""

from __future__ import annotations

import math
import random
import re
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from estimator.workload import FusedEstimate, FusedLayer
from phaze_common.numbers import round_significant, round_significant_scalar
from solver.schedule import (
    MILP_SOLVERS,
    InvalidSchedule,
    LicenceLimitError,
    Op,
    Schedule,
    ScheduleCache,
    ScheduleProblem,
    check_schedule,
    critical_path_and_work,
    heuristic_schedule,
    lower_bound,
    plot_gantt,
    solve,
    violations,
)
from solver.schedule.cache import SCHEDULE_DIGITS
from solver.schedule.milp import SOLVER_TOLERANCE, solve_milp

# --- the problem -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: Op("GPU", 1.0, 1.0), "core"),
        (lambda: Op("TC", -1.0, 1.0), "latency"),
        (lambda: Op("TC", float("nan"), 1.0), "latency"),
        (lambda: Op("TC", 1.0, 0.0), "parallel_latency"),
        (lambda: Op("collective", 1.0, 0.5), "parallel_latency"),
        (lambda: Op("VC", 1.0, 1.0, energy=-2.0), "energy"),
        (lambda: ScheduleProblem([Op("TC", 1, 1)], [], 0, 1), "num_tc"),
        (lambda: ScheduleProblem([Op("TCandVC", 1, 1)], [], 1, 0), "num_vc"),
        (lambda: ScheduleProblem([Op("VC", 1, 1)], [], 1, -1), "num_vc"),
        (lambda: ScheduleProblem([Op("VC", 1, 1)], [], 1.5, 1), "num_tc"),
        (lambda: ScheduleProblem([Op("VC", 1, 1)] * 2, [(0, 2)], 1, 1), "edges"),
        (lambda: ScheduleProblem([Op("VC", 1, 1)] * 2, [(1, 1)], 1, 1), "edges"),
        (lambda: ScheduleProblem([Op("VC", 1, 1)] * 3, [(0, 1), (1, 2), (2, 0)], 1, 1), "edges"),
        (lambda: ScheduleProblem([Op("Nop", 0, 0)], [], 1, 1), "ops"),
        (lambda: ScheduleProblem(["TC"], [], 1, 1), "ops"),
    ],
)
def test_bad_input_names_the_field(build, field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field}:"):
        build()


def test_cycle_error_lists_the_operators_on_it() -> None:
    with pytest.raises(ValueError, match=r"cycle among operators \[1, 2\]"):
        ScheduleProblem([Op("VC", 1, 1)] * 3, [(0, 1), (1, 2), (2, 1)], 1, 1)


def test_no_cores_needed_by_collectives_only() -> None:
    problem = ScheduleProblem([Op("collective", 2.0, 2.0), Op("collective", 3.0, 3.0)], [], 0, 0)
    assert solve(problem).makespan == 3.0  # both at once: they hold no core


def test_bad_solve_options_name_the_field() -> None:
    problem = ScheduleProblem([Op("TC", 1, 1)], [], 1, 1)
    for kwargs, field in [
        ({"backend": "gurobi"}, "backend"),
        ({"time_limit": 0}, "time_limit"),
        ({"time_limit": float("inf")}, "time_limit"),
        ({"milp_solver": "cplex"}, "milp_solver"),
        ({"relative_gap": 1.0}, "relative_gap"),
        ({"workers": 0}, "workers"),
    ]:
        with pytest.raises(ValueError, match=f"^{field}:"):
            solve(problem, **kwargs)


def test_without_nops_keeps_precedence_through_chains_of_nops() -> None:
    # 0 -> nop1 -> nop2 -> 3, 0 -> nop1 -> 4, 3 -> nop5 (dead end), 4 -> 6
    nop = Op("Nop", 0, 0)
    ops = [Op("TC", 1, 1), nop, nop, Op("VC", 1, 1), Op("VC", 1, 1), nop, Op("TC", 1, 1)]
    edges = [(0, 1), (1, 2), (2, 3), (1, 4), (3, 5), (4, 6)]
    problem = ScheduleProblem.without_nops(ops, edges, 1, 1)
    assert [op.core for op in problem.ops] == ["TC", "VC", "VC", "TC"]
    assert problem.edges == ((0, 1), (0, 2), (2, 3))


def test_from_workload_reads_an_estimator_layer() -> None:
    ops = (
        FusedEstimate((0, 1), "TCandVC", 4e-3, 1e-3, 2.0, 3.0),
        FusedEstimate((2,), "Nop", 0.0, 0.0, 0.0, 0.0),
        FusedEstimate((3,), "collective", 5e-4, 5e-4, 0.1, 0.1),
        FusedEstimate((4,), "VC", 1e-5, 3e-6, 0.01, 0.02),
    )
    layer = FusedLayer(layer=1, direction="backward", ops=ops, edges=((0, 1), (1, 2), (1, 3)))
    problem = ScheduleProblem.from_workload(layer, num_tc=4, num_vc=2)
    assert [(op.core, op.latency, op.parallel_latency, op.energy, op.parallel_energy) for op in problem.ops] == [
        ("TCandVC", 4e-3, 1e-3, 2.0, 3.0),
        ("collective", 5e-4, 5e-4, 0.1, 0.1),
        ("VC", 1e-5, 3e-6, 0.01, 0.02),
    ]
    assert problem.edges == ((0, 1), (0, 2))
    assert (problem.num_tc, problem.num_vc) == (4, 2)


def test_width_is_the_largest_unordered_set() -> None:
    # a diamond 0 -> {1, 2, 3} -> 4 plus a lone 5: {1, 2, 3, 5} run side by side
    edges = [(0, 1), (0, 2), (0, 3), (1, 4), (2, 4), (3, 4)]
    problem = ScheduleProblem([Op("TC", 1, 1)] * 6, edges, 1, 1)
    assert problem.width(list(range(6))) == 4
    assert problem.width([0, 1, 4]) == 1


# --- hand-calculated schedules ------------------------------------------------------------------


def three_tc_ops() -> ScheduleProblem:
    """Three independent TC operators of 1 s, 0.6 s when split over the 2 TCs.

    All one-core: two side by side, then the third: 2 s. One parallel (0.6 s) and two side by side
    (1 s): 1.6 s. All parallel: 1.8 s. Two parallel and one alone: 2.2 s. Optimum 1.6 s.
    Lower bound: critical path 0.6 s; TC work min(1, 2 x 0.6) x 3 / 2 = 1.5 s.
    """
    return ScheduleProblem([Op("TC", 1.0, 0.6, energy=2.0, parallel_energy=3.0)] * 3, [], num_tc=2, num_vc=1)


@pytest.mark.parametrize("backend", ["cpsat", "milp"])
def test_hand_calculated_optimum(backend: str) -> None:
    problem = three_tc_ops()
    result = solve(problem, backend)
    assert result.makespan == pytest.approx(1.6, rel=1e-4)
    assert result.status == "optimal"
    assert sorted(result.parallel) == [False, False, True]
    assert result.energy == pytest.approx(2.0 + 2.0 + 3.0)
    check_schedule(problem, result.start, result.parallel, result.makespan)


def test_lower_bound_by_hand() -> None:
    assert lower_bound(three_tc_ops()) == pytest.approx(1.5)
    # a chain TC(2 s, 1 s parallel) -> VC(3 s, 2 s) on 4 TCs: critical path 1 + 2 = 3 s
    chain = ScheduleProblem([Op("TC", 2.0, 1.0), Op("VC", 3.0, 2.0)], [(0, 1)], 4, 2)
    assert lower_bound(chain) == pytest.approx(3.0)


def test_forced_parallel_runs_tighten_the_bound_by_hand() -> None:
    # Two independent TC operators of 10 s, 1 s over all 16 TCs. Side by side on one core each: 10 s;
    # one after the other, each on all cores: 2 s (the optimum). The critical path (1 s) and the work
    # (2 x min(10, 16 x 1) / 16 = 1.25 s) allow 1.25 s; but under 10 s both must run parallel, and
    # parallel runs never overlap: 2 s.
    pair = ScheduleProblem([Op("TC", 10.0, 1.0)] * 2, [], num_tc=16, num_vc=1)
    assert critical_path_and_work(pair) == pytest.approx(1.25)
    assert lower_bound(pair) == pytest.approx(2.0)
    assert solve(pair).makespan == pytest.approx(2.0, rel=1e-4)
    # Three of 4 s, 2 s over 4 TCs: side by side 4 s (the optimum), all parallel 6 s. Work 3 x 4 / 4
    # = 3 s; under 4 s all three would run parallel (6 s): the bound is 4 s.
    three = ScheduleProblem([Op("TC", 4.0, 2.0)] * 3, [], num_tc=4, num_vc=1)
    assert critical_path_and_work(three) == pytest.approx(3.0)
    assert lower_bound(three) == pytest.approx(4.0)
    assert solve(three).makespan == pytest.approx(4.0, rel=1e-4)


def test_utilisation_and_energy_by_hand() -> None:
    # TC (1 s) -> VC (1 s) on 2 TCs and 1 VC, no faster parallel run: 2 s;
    # TCs: peak 1 of 2 busy, 1 core-second over 2 x 2; VC: peak 1 of 1, 1 core-second over 1 x 2.
    problem = ScheduleProblem([Op("TC", 1.0, 1.0, energy=5.0), Op("VC", 1.0, 1.0, energy=7.0)], [(0, 1)], 2, 1)
    result = solve(problem)
    assert result.makespan == pytest.approx(2.0)
    assert (result.tc_utilisation.peak, result.tc_utilisation.mean) == pytest.approx((0.5, 0.25))
    assert (result.vc_utilisation.peak, result.vc_utilisation.mean) == pytest.approx((1.0, 0.5))
    assert result.energy == pytest.approx(12.0)
    assert result.status == "optimal"  # the critical path bound proves it


def test_parallel_tcandvc_keeps_min_cores_busy() -> None:
    # one TCandVC operator, parallel on min(4, 2) = 2 TC-VC pairs: TCs 2 of 4 busy, VCs 2 of 2
    problem = ScheduleProblem([Op("TCandVC", 4.0, 1.0)], [], 4, 2)
    result = solve(problem)
    assert result.parallel == (True,) and result.makespan == pytest.approx(1.0)
    assert result.tc_utilisation.peak == pytest.approx(0.5)
    assert result.vc_utilisation.peak == pytest.approx(1.0)


def test_collective_overlaps_a_parallel_operator() -> None:
    # an all-reduce (3 s, no core) beside a TC operator that is faster parallel: both at t = 0
    problem = ScheduleProblem([Op("collective", 3.0, 3.0), Op("TC", 4.0, 1.0)], [], 2, 1)
    result = solve(problem)
    assert result.start == (0.0, 0.0) and result.parallel == (False, True)
    assert result.makespan == pytest.approx(3.0)


def test_parallel_runs_alone_even_beside_the_other_core_type() -> None:
    # TC operator 2 s (parallel 1 s) and VC operator 2 s (no faster parallel run), independent:
    # parallel TC then VC: 3 s; both one-core side by side: 2 s (optimal, no parallel run).
    problem = ScheduleProblem([Op("TC", 2.0, 1.0), Op("VC", 2.0, 2.0)], [], 2, 1)
    result = solve(problem)
    assert result.makespan == pytest.approx(2.0)
    assert result.parallel == (False, False)


def test_zero_latency_operators_hold_no_core() -> None:
    problem = ScheduleProblem([Op("TC", 0.0, 0.0), Op("TC", 2.0, 2.0), Op("TC", 0.0, 0.0)], [(0, 2)], 1, 1)
    result = solve(problem)
    assert result.makespan == pytest.approx(2.0)
    check_schedule(problem, result.start, result.parallel, result.makespan)


def test_empty_problem() -> None:
    result = solve(ScheduleProblem([], [], 1, 1))
    assert (result.makespan, result.gap, result.status) == (0.0, 0.0, "optimal")


def test_solved_from_nops_as_original_graph() -> None:
    ops = [Op("TC", 1.0, 0.5), Op("Nop", 0, 0), Op("VC", 1.0, 0.5)]
    problem = ScheduleProblem.without_nops(ops, [(0, 1), (1, 2)], 2, 2)
    assert solve(problem).makespan == pytest.approx(1.0)


def test_heuristic_is_feasible_and_above_the_bound() -> None:
    problem = three_tc_ops()
    schedule = heuristic_schedule(problem)
    check_schedule(problem, schedule.start, schedule.parallel)
    assert schedule.makespan(problem) >= lower_bound(problem)


# --- the validator: each kind of violation ---------------------------------------------------------


def mixed_problem() -> ScheduleProblem:
    ops = [Op("TC", 2.0, 1.0), Op("TC", 2.0, 1.0), Op("VC", 1.0, 0.5), Op("TCandVC", 1.0, 0.5)]
    ops.append(Op("collective", 3.0, 3.0))
    return ScheduleProblem(ops, [(0, 2)], num_tc=2, num_vc=1)


def kinds(problem, start, parallel, makespan=None) -> set[str]:
    return {v.kind for v in violations(problem, start, parallel, makespan)}


def test_validator_accepts_a_valid_schedule() -> None:
    # TC0 and TC1 side by side [0, 2); VC [2, 3); TCandVC parallel [3, 3.5); collective [0, 3)
    start, parallel = (0.0, 0.0, 2.0, 3.0, 0.0), (False, False, False, True, False)
    assert kinds(mixed_problem(), start, parallel, 3.5) == set()
    check_schedule(mixed_problem(), start, parallel, 3.5)


@pytest.mark.parametrize(
    ("start", "parallel", "makespan", "kind"),
    [
        ((0.0, 0.0, 1.9, 3.0, 0.0), (False, False, False, True, False), None, "precedence"),
        ((0.0, 0.0, 2.0, 1.5, 0.0), (False, False, False, False, False), None, "tc_capacity"),
        ((0.0, 0.0, 2.0, 2.5, 0.0), (False, False, False, False, False), None, "vc_capacity"),
        ((0.0, 0.5, 2.0, 3.0, 0.0), (True, False, False, False, False), None, "exclusivity"),
        ((0.0, 0.0, 2.0, 2.2, 0.0), (False, False, True, False, False), None, "exclusivity"),  # VC parallel vs TCandVC
        ((0.0, 0.0, 2.0, 3.0, 0.0), (False, False, False, True, True), None, "mode"),
        ((-1.0, 0.0, 2.0, 3.0, 0.0), (False, False, False, True, False), None, "start"),
        ((0.0, 0.0, 2.0, 3.0, 0.0), (False, False, False, True, False), 4.0, "makespan"),
        ((0.0, 0.0, 2.0), (False, False, False), None, "shape"),
    ],
)
def test_validator_catches_each_violation(start, parallel, makespan, kind: str) -> None:
    problem = mixed_problem()
    assert kind in kinds(problem, start, parallel, makespan)
    with pytest.raises(InvalidSchedule, match=kind):
        check_schedule(problem, start, parallel, makespan)


def test_validator_tolerates_rounding_but_not_more() -> None:
    problem = mixed_problem()
    parallel = (False, False, False, True, False)
    assert kinds(problem, (0.0, 0.0, 2.0 - 1e-12, 3.0, 0.0), parallel) == set()
    assert kinds(problem, (0.0, 0.0, 2.0 - 1e-6, 3.0, 0.0), parallel) == {"precedence"}


# --- time limits ------------------------------------------------------------------------------------


def hard_problem(n: int = 30, seed: int = 1) -> ScheduleProblem:
    """Independent TC operators on 4 TCs, parallel no faster: bin packing, slow to prove."""
    rng = random.Random(seed)
    ops = []
    for _ in range(n):
        latency = rng.uniform(1.0, 10.0) * 1e-4
        ops.append(Op("TC", latency, latency))
    return ScheduleProblem(ops, [], num_tc=4, num_vc=1)


@pytest.mark.parametrize(("backend", "time_limit"), [("cpsat", 0.2), ("milp", 1.0)])
def test_time_limit_returns_the_best_schedule_with_its_gap(backend: str, time_limit: float) -> None:
    problem = hard_problem(30 if backend == "cpsat" else 12)
    result = solve(problem, backend, time_limit=time_limit)
    check_schedule(problem, result.start, result.parallel, result.makespan)
    assert result.status == "feasible"
    assert result.gap == pytest.approx((result.makespan - result.lower_bound) / result.makespan)
    assert 0 < result.gap < 0.2
    assert result.solve_time < time_limit + 5.0


@pytest.mark.parametrize("milp_solver", MILP_SOLVERS)
def test_a_milp_solver_stopped_by_its_time_limit_gives_its_own_schedule(milp_solver: str) -> None:
    """PuLP tells a solution found before the time limit differently per solver (CBC: "Optimal" with
    an integer-feasible solution; gurobipy: "Not Solved"): each solver's schedule comes back, not
    the warm start. The warm start runs the 12 operators one after another, sum(latencies); on 4
    TCs the optimum is at most max latency + sum / 4 (list scheduling), below half of that sum."""
    if milp_solver == "gurobi":
        pytest.importorskip("gurobipy")
    problem = hard_problem(12)
    latencies = [op.latency for op in problem.ops]
    assert max(latencies) + sum(latencies) / 4 < sum(latencies) / 2
    one_after_another = Schedule(tuple(sum(latencies[:i]) for i in range(12)), (False,) * 12)
    outcome = solve_milp(problem, one_after_another, 2.0, milp_solver)  # HiGHS beat it after 0.6 s here
    assert outcome.schedule is not None and not outcome.optimal
    found = outcome.schedule
    assert violations(problem, found.start, found.parallel, relative_tolerance=SOLVER_TOLERANCE) == []
    assert outcome.lower_bound <= found.makespan(problem) < sum(latencies) / 2


# --- gurobipy's size-limited licence -------------------------------------------------------------------


def _size_limited_gurobi() -> bool:
    gp = pytest.importorskip("gurobipy")
    try:
        with gp.Env(params={"OutputFlag": 0}) as env, gp.Model(env=env) as model:
            model.addVars(2001)
            model.optimize()
    except gp.GurobiError as error:
        if error.errno == 10010:
            return True
        pytest.skip(f"gurobipy has no licence here: {error}")
    return False


def test_gurobi_size_limit_gives_a_clear_message() -> None:
    if not _size_limited_gurobi():
        pytest.skip("gurobipy has a full licence here")
    with warnings.catch_warnings(), pytest.raises(LicenceLimitError, match="size-limited licence") as raised:
        warnings.simplefilter("error")  # the message counts rows through PuLP's current API
        solve(hard_problem(16), "milp", time_limit=5.0, milp_solver="gurobi")
    counts = re.search(r"has (\d+) variables and (\d+) constraints", str(raised.value))
    variables, constraints = int(counts[1]), int(counts[2])
    # 16 independent operators: at least the 16 x 15 x 14 transitivity rows (6) of the order variables
    assert variables <= 2000 < 16 * 15 * 14 <= constraints


# --- PuLP's current API ------------------------------------------------------------------------------


@pytest.mark.parametrize("milp_solver", MILP_SOLVERS)
def test_the_milp_backend_uses_no_deprecated_api(milp_solver: str) -> None:
    """PuLP 3 warns of what PuLP 4.0 removes (PULP_CBC_CMD, LpProblem.constraints as a mapping,
    ...): a solve through each MILP solver warns of nothing deprecated."""
    if milp_solver == "gurobi":
        pytest.importorskip("gurobipy")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = solve(three_tc_ops(), "milp", milp_solver=milp_solver)
    deprecated = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)
    assert [f"{w.filename}:{w.lineno}: {w.message}" for w in caught if issubclass(w.category, deprecated)] == []
    assert result.makespan == pytest.approx(1.6, rel=1e-4) and result.status == "optimal"


# --- the cache ---------------------------------------------------------------------------------------


def test_cache_solves_each_layer_once_per_run_and_across_runs(tmp_path) -> None:
    path = tmp_path / "cache" / "schedules.sqlite"
    problem = three_tc_ops()
    cache = ScheduleCache(path)
    first = cache.solve(problem)
    assert cache.solved == 1
    nudged = ScheduleProblem([Op("TC", 1.0 * (1 + 1e-12), 0.6, 2.0, 3.0)] * 3, [], 2, 1)  # same after rounding
    assert cache.solve(nudged).makespan == first.makespan
    assert cache.solved == 1
    cache.solve(ScheduleProblem(problem.ops, [], 3, 1))  # other core counts: a new layer
    assert cache.solved == 2
    cache.solve(problem, time_limit=5.0)  # other settings: solved again
    assert cache.solved == 3

    later_run = ScheduleCache(path)
    assert later_run.solve(problem) == first
    assert later_run.solved == 0


def test_cache_key_rounds_latencies_consistently() -> None:
    cache = ScheduleCache()
    a = ScheduleProblem([Op("TC", 1.23456789e-5, 1e-6)], [], 1, 1).rounded(SCHEDULE_DIGITS)
    b = ScheduleProblem([Op("TC", 1.23456791e-5, 1e-6)], [], 1, 1).rounded(SCHEDULE_DIGITS)
    c = ScheduleProblem([Op("TC", 1.23466789e-5, 1e-6)], [], 1, 1).rounded(SCHEDULE_DIGITS)
    assert cache.key(a, "cpsat", 10.0) == cache.key(b, "cpsat", 10.0) != cache.key(c, "cpsat", 10.0)
    assert cache.key(a, "cpsat", 10.0) != cache.key(a, "milp", 10.0)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(1e-13, 1e5), min_size=1, max_size=40), st.integers(1, 12))
def test_rounding_to_significant_digits_is_decimal_rounding_and_the_same_in_any_array(values, digits) -> None:
    """The scheduler's rounding (and the search bounds', on arrays of every candidate) keeps `digits`
    significant digits of the nearest such number, and a number rounds alike alone and among others."""
    together = round_significant(values, digits)
    for value, rounded in zip(values, together.tolist()):
        assert rounded == round_significant([value], digits)[0] == round_significant_scalar(value, digits)
        unit = 10.0 ** (math.floor(math.log10(value)) + 1 - digits)  # of the last digit kept
        assert abs(rounded - value) <= unit / 2 + 4 * math.ulp(value)  # the nearest, up to float error
        assert rounded / unit == pytest.approx(round(rounded / unit), rel=1e-12)
    assert round_significant([0.0, math.inf], 6).tolist() == [0.0, math.inf]


def test_a_cached_schedule_fits_the_problem_the_cache_solved(tmp_path) -> None:
    # 1.0000004e-5 rounds to 1e-5: back to back on one TC in the rounded problem, overlapping in the
    # original one, so the schedule is valid (and drawable) only for the problem the cache solved
    problem = ScheduleProblem([Op("TC", 1.0000004e-5, 1.0000004e-5), Op("TC", 1e-5, 1e-5)], [], 1, 0)
    cache = ScheduleCache()
    result = cache.solve(problem, backend="heuristic")
    solved = cache.problem_solved(problem)
    assert result.start == (0.0, 1e-5) and solved.ops[0].latency == 1e-5
    check_schedule(solved, result.start, result.parallel, result.makespan)
    with pytest.raises(InvalidSchedule):
        check_schedule(problem, result.start, result.parallel, result.makespan)
    assert plot_gantt(solved, result, tmp_path / "gantt.png").exists()


# --- the Gantt chart ---------------------------------------------------------------------------------


def test_gantt_chart_is_written_whole(tmp_path) -> None:
    problem = mixed_problem()
    result = solve(problem)
    path = plot_gantt(problem, result, tmp_path / "gantt.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["gantt.png"]


def test_gantt_chart_draws_only_the_cores_in_use(tmp_path) -> None:
    # two TC operators side by side on a 2048-TC chip: 2 TC lanes and 1 VC lane, not 2304
    problem = ScheduleProblem([Op("TC", 1.0, 1.0), Op("TC", 1.0, 1.0), Op("VC", 1.0, 1.0)], [], 2048, 256)
    png = plot_gantt(problem, solve(problem), tmp_path / "gantt.png").read_bytes()
    height = int.from_bytes(png[20:24], "big")
    assert height < 400


def test_gantt_chart_names_only_bars_its_names_fit_and_lists_only_what_it_draws(tmp_path, monkeypatch) -> None:
    """One long and four short operators on one TC lane, none parallel, no VC or collective work: the
    long bar is named, the short ones (a thousandth of the span) are not, so no two names overlap,
    and the legend of the chart written lists the TC bars alone."""
    from matplotlib.figure import Figure

    ops = [Op("TC", 1.0, 4.0, name="long_matmul"), *(Op("TC", 1e-3, 4e-3, name=f"short_{i}") for i in range(4))]
    problem = ScheduleProblem(ops, [(i, i + 1) for i in range(4)], num_tc=1, num_vc=1)
    result = solve(problem)
    assert not any(result.parallel)
    written, save = [], Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda figure, path, **options: (written.append(figure),
                                                                             save(figure, path, **options)))
    plot_gantt(problem, result, tmp_path / "gantt.png")
    (axes,) = written[0].axes
    assert [text.get_text() for text in axes.texts] == ["long_matmul"]
    assert [text.get_text() for text in axes.get_legend().get_texts()] == ["TC"]
