"""The intra-operator sharding ILP (Alpa, Zheng et al. OSDI'22, Sec. 4.2), solved exactly.

With s_g ∈ {0,1}^{K_g} one-hot over group g's choices (a group is an operator and the followers
merged into it, shrink.py), c_g its own costs (compute, weight-gradient sync, internal edges and
boundary conversions), m_g its parameter bytes per device, and for each edge u -> v between
groups its resharding table R_uv (resharding.py):

    minimise   Σ_g c_g·s_g + Σ_(u,v) Σ_(a,b) R_uv[a,b]·e_uv[a,b] + Σ_T Σ_(a,q) G_T[a,q]·z_T[a,q]
    subject to Σ_k s_g[k] = 1;  Σ_b e_uv[a,b] = Σ_{k∈a} s_u[k];  Σ_a e_uv[a,b] = Σ_{l∈b} s_v[l];
               z_T[a,q] ≥ j_Ti[a,q] for each reader i of T;
               Σ_g m_g·s_g ≤ M;  s binary, 0 ≤ e, j ≤ 1, z ≥ 0.

A gradient sum T (a tensor read by operators of several groups, costs.py) pays G_T[a,q] once for each
gradient placement class q held by at least one reader, a the producer's target class: j_Ti[a,q] is
the joint indicator of the producer's class a and reader i's class q (variables with the two
marginal constraints, as e; the sum of the matching s when the reader is in the producer's group;
reader i's s alone for a graph input), and z_T[a,q], pushed down by the minimisation onto the
largest j_Ti[a,q], is 1 exactly when some reader holds q under a (the costs are non-negative).

The edge variables run over classes of choices with the same placements on the edge (a and b
above; e.g. all strategies of u giving its output one placement), which keeps the model small and
the optimum the same. With s binary, the two marginal constraints leave e = s_u s_vᵀ (summed over
classes) as the only solution, so e need not be integer; the marginals (the local polytope) imply
and tighten the linearisation e[i,j] ≤ s_u[i], e[i,j] ≤ s_v[j], Σ e = 1, so the LP relaxation's
bound is at least as good.

Solver: OR-Tools' pywraplp with HiGHS. The costs are real numbers of seconds spanning orders of
magnitude; HiGHS takes them as they are and reports a best bound, where CP-SAT would need them
scaled to integers and rounded (an optimum then exact only to the rounding). The costs are divided
by the time of a greedy plan, times 10³ (the greedy plan is an upper bound on the optimum, so HiGHS's
absolute gap of 10⁻⁶ is 10⁻⁹ of it), and a coefficient above twice the greedy plan's cost is cut to
that (any plan paying it is worse than the greedy one, so the optimum is unchanged). The relative
MIP gap is set to 0; the memory bound holds to HiGHS's feasibility tolerance (10⁻⁷ of M). The
reported objective is the chosen plan's cost evaluated anew (costs.py); the bound is the solver's,
in seconds. One thread, as the machines running the search may give each search one core.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
from ortools.linear_solver import pywraplp

from phaze_common.checks import InputError, positive_number

from .costs import CostModel, GradientSum, PlanCost, Tables
from .graph import ShardingGraph
from .mesh import DeviceMesh
from .shrink import representative
from .strategies import CostSettings, Strategy

#: The greedy plan's cost in the model's units.
_SCALE = 1e3


@dataclass(frozen=True, kw_only=True)
class ShardingPlan:
    """The chosen strategy of every operator and what the plan costs.

    status: "optimal", "feasible" (time limit reached; the best plan found) or "infeasible" (no plan
    fits the memory bound; then `strategies` is empty and `objective` is inf). objective, bound [s]
    per training step; gap = (objective - bound) / objective; cost: objective by kind and memory.
    """

    status: str
    strategies: Mapping[str, Strategy]
    objective: float
    bound: float
    gap: float
    cost: PlanCost | None
    mesh: DeviceMesh
    solve_seconds: float
    variables: int

    def readable(self) -> dict[str, dict[str, str] | str]:
        """Operator name -> {"axis": "dim"} or "replicated"."""
        return {name: strategy.readable(self.mesh) for name, strategy in self.strategies.items()}


@dataclass(frozen=True, kw_only=True)
class StackPlan:
    """One plan shared by `layers` structurally equal layers; times are the whole stack's."""

    layer: ShardingPlan
    layers: int

    @property
    def objective(self) -> float:
        return self.layer.objective * self.layers

    @property
    def bound(self) -> float:
        return self.layer.bound * self.layers


def _greedy(tables: Tables, memory_limit: float) -> list[int]:
    """Each group in turn takes the choice cheapest given those before (its own cost and the edges
    from them; gradient sums are left out of the choice, priced in `_plan_cost`); the least-memory
    choices when that plan does not fit."""
    chosen: list[int] = []
    incoming: dict[int, list] = {}
    for edge in tables.edges:
        incoming.setdefault(edge.target, []).append(edge)
    for g, cost in enumerate(tables.node_cost):
        total = cost.copy()
        for edge in incoming.get(g, ()):
            if edge.source < g:
                total += edge.cost[edge.source_class[chosen[edge.source]], edge.target_class]
        chosen.append(int(np.argmin(total)))
    if sum(memory[k] for memory, k in zip(tables.node_memory, chosen)) > memory_limit:
        chosen = [int(np.lexsort((cost, memory))[0]) for cost, memory in zip(tables.node_cost, tables.node_memory)]
    return chosen


def _plan_cost(tables: Tables, chosen: Sequence[int]) -> float:
    return float(sum(cost[k] for cost, k in zip(tables.node_cost, chosen))
                 + sum(edge.cost[edge.source_class[chosen[edge.source]], edge.target_class[chosen[edge.target]]]
                       for edge in tables.edges)
                 + sum(gradient_sum.total(chosen) for gradient_sum in tables.sums))


def _add_gradient_sum(solver, objective, choice: list, t: int, gradient_sum: GradientSum, unit: float,
                      cap: float) -> None:
    """The variables and constraints of one gradient sum (module docstring)."""
    cost = gradient_sum.cost
    rows = cost.shape[0]
    z = {(a, q): solver.NumVar(0.0, solver.infinity(), f"z{t}_{a}_{q}")
         for a in range(rows) for q in range(cost.shape[1]) if cost[a, q] > 0}
    for (a, q), variable in z.items():
        objective.SetCoefficient(variable, min(cost[a, q] / unit, cap))
    source = gradient_sum.source
    for i, (group, classes) in enumerate(gradient_sum.readers):
        held = sorted({int(q) for q in classes})
        if not any((a, q) in z for a in range(rows) for q in held):
            continue
        # the terms whose sum is the joint indicator of (a, q)
        if source is None:
            joint = {(0, q): [choice[group][k] for k in np.flatnonzero(classes == q)] for q in held}
        elif source == group:
            joint = {(a, q): [choice[group][k] for k in
                              np.flatnonzero((gradient_sum.source_class == a) & (classes == q))]
                     for a in range(rows) for q in held}
        else:
            joint = {(a, q): [solver.NumVar(0.0, 1.0, f"j{t}_{i}_{a}_{q}")] for a in range(rows) for q in held}
            for a in range(rows):
                members = [choice[source][k] for k in np.flatnonzero(gradient_sum.source_class == a)]
                solver.Add(solver.Sum([joint[a, q][0] for q in held]) == solver.Sum(members))
            for q in held:
                members = [choice[group][k] for k in np.flatnonzero(classes == q)]
                solver.Add(solver.Sum([joint[a, q][0] for a in range(rows)]) == solver.Sum(members))
        for key, terms in joint.items():
            if key in z and terms:
                solver.Add(z[key] >= solver.Sum(terms))


def _solve_tables(tables: Tables, memory_limit: float, time_limit: float) -> tuple[str, list[int], float, int]:
    """(status, chosen choice per group, bound [s], variables) of the ILP on `tables`."""
    greedy = _greedy(tables, memory_limit)
    upper = _plan_cost(tables, greedy)
    unit = upper / _SCALE if upper > 0 else 1.0
    cap = 2 * _SCALE if upper > 0 else math.inf
    solver = pywraplp.Solver.CreateSolver("HIGHS")
    solver.SuppressOutput()
    # HiGHS prints its banner unless its own option says not to (an options-file line, read at Solve)
    solver.SetSolverSpecificParametersAsString("output_flag = false")
    solver.SetNumThreads(1)
    solver.SetTimeLimit(max(1, int(time_limit * 1000)))
    objective = solver.Objective()
    choice = []
    for g, (cost, memory) in enumerate(zip(tables.node_cost, tables.node_memory)):
        variables = [solver.BoolVar(f"s{g}_{k}") for k in range(len(cost))]
        solver.Add(solver.Sum(variables) == 1)
        for variable, value in zip(variables, cost):
            objective.SetCoefficient(variable, min(value / unit, cap))
        choice.append(variables)
    for t, edge in enumerate(tables.edges):
        if not edge.cost.any():
            continue
        rows, columns = edge.cost.shape
        e = [[solver.NumVar(0.0, 1.0, f"e{t}_{a}_{b}") for b in range(columns)] for a in range(rows)]
        for a in range(rows):
            members = [choice[edge.source][k] for k in np.flatnonzero(edge.source_class == a)]
            solver.Add(solver.Sum(e[a]) == solver.Sum(members))
        for b in range(columns):
            members = [choice[edge.target][k] for k in np.flatnonzero(edge.target_class == b)]
            solver.Add(solver.Sum([e[a][b] for a in range(rows)]) == solver.Sum(members))
        for a in range(rows):
            for b in range(columns):
                objective.SetCoefficient(e[a][b], min(edge.cost[a, b] / unit, cap))
    for t, gradient_sum in enumerate(tables.sums):
        _add_gradient_sum(solver, objective, choice, t, gradient_sum, unit, cap)
    if math.isfinite(memory_limit):
        scale = max(memory_limit, 1.0)
        solver.Add(solver.Sum([float(m / scale) * v for memory, variables in zip(tables.node_memory, choice)
                               for m, v in zip(memory, variables) if m]) <= memory_limit / scale)
    objective.SetMinimization()
    parameters = pywraplp.MPSolverParameters()
    parameters.SetDoubleParam(parameters.RELATIVE_MIP_GAP, 0.0)
    status = solver.Solve(parameters)
    count = solver.NumVariables()
    fits = sum(memory[k] for memory, k in zip(tables.node_memory, greedy)) <= memory_limit
    if status in (pywraplp.Solver.OPTIMAL, pywraplp.Solver.FEASIBLE):
        chosen = [int(np.argmax([v.solution_value() for v in variables])) for variables in choice]
        bound = max(0.0, objective.BestBound() * unit)
        if status == pywraplp.Solver.FEASIBLE and fits and upper < _plan_cost(tables, chosen):
            chosen = greedy
        return ("optimal" if status == pywraplp.Solver.OPTIMAL else "feasible"), chosen, bound, count
    if status == pywraplp.Solver.INFEASIBLE or not fits:
        return "infeasible", [], math.inf, count
    return "feasible", greedy, 0.0, count


def solve(graph: ShardingGraph, mesh: DeviceMesh, settings: CostSettings = CostSettings(), *,
          memory_limit: float = math.inf, time_limit: float = 10.0, shrink: bool = True) -> ShardingPlan:
    """The plan of least time per step whose parameter memory per device is at most `memory_limit`
    [bytes], found within `time_limit` [s]; `shrink` merges followers into their leaders (shrink.py)."""
    if memory_limit != math.inf:
        positive_number("memory_limit", memory_limit, "bytes")
    positive_number("time_limit", time_limit, "seconds")
    started = time.monotonic()
    model = CostModel(graph, mesh, settings)
    tables = model.tables(merge=shrink)
    status, chosen, bound, count = _solve_tables(tables, memory_limit, time_limit)
    if status == "infeasible":
        return ShardingPlan(status=status, strategies=MappingProxyType({}), objective=math.inf, bound=math.inf,
                            gap=math.inf, cost=None, mesh=mesh, solve_seconds=time.monotonic() - started,
                            variables=count)
    index: dict[int, int] = {}
    for group, k in zip(tables.groups, chosen):
        index.update(zip(group.members, group.choices[k]))
    strategies = MappingProxyType({op.name: model.strategies[v][index[v]] for v, op in enumerate(graph.ops)})
    cost = model.evaluate(strategies)
    objective = cost.total
    bound = min(bound, objective)
    gap = (objective - bound) / objective if objective > 0 else 0.0
    return ShardingPlan(status=status, strategies=strategies, objective=objective, bound=bound, gap=gap, cost=cost,
                        mesh=mesh, solve_seconds=time.monotonic() - started, variables=count)


def solve_layers(layers: Sequence[ShardingGraph], mesh: DeviceMesh, settings: CostSettings = CostSettings(), *,
                 memory_limit: float = math.inf, time_limit: float = 10.0, shrink: bool = True) -> StackPlan:
    """One plan for structurally equal layers (shrink.py), each given memory_limit / len(layers)."""
    if not layers:
        raise InputError("layers: must hold at least one layer graph")
    plan = solve(representative(layers), mesh, settings, memory_limit=memory_limit / len(layers),
                 time_limit=time_limit, shrink=shrink)
    return StackPlan(layer=plan, layers=len(layers))
