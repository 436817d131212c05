"""The gradients of a tensor read by several operators, summed locally and converted once per
distinct placement (solver.auto_sharding.resharding), by hand, in the ILP and against brute force.

Communication only: α = β = 1 (seconds per step, per byte), one byte per element, compute free. On
an axis of n devices: AR(B) = 2(n-1) + 2(n-1)/n·B, AG(B) = (n-1) + (n-1)/n·B.
"""

from __future__ import annotations

import itertools
import math
import random

import pytest

from solver.auto_sharding import CostModel, CostSettings, DeviceMesh, GraphBuilder, ShardingGraph, Strategy, solve
from solver.auto_sharding.ilp import _plan_cost
from tests.test_auto_sharding import MESH4, ag, ar, brute_force


def fan_out(boundary: str = "any", produced: bool = True) -> ShardingGraph:
    """x[b=8, h=16] normalised to y (or read as it is when not `produced`), read by three products
    y·w_i[h, n=16] -> o_i[b, n] (ops p1, p2, p3)."""
    graph = GraphBuilder()
    graph.input("x", {"b": 8, "h": 16})
    read = "x"
    if produced:
        graph.elementwise("norm", "x[b,h] -> y[b,h]")
        read = "y"
    for i in (1, 2, 3):
        graph.parameter(f"w{i}", {"h": 16, "n": 16})
        graph.product(f"p{i}", f"{read}[b,h] w{i}[h,n] -> o{i}[b,n]")
    return graph.build(boundary, boundary)


def plan_of(graph: ShardingGraph, splits: dict[str, str | None]) -> dict[str, Strategy]:
    return {op.name: Strategy(splits=(splits.get(op.name),)) for op in graph.ops}


def test_three_column_products_pay_one_all_reduce():
    """Boundaries `any`, the norm replicated. p1, p2, p3 all column (split n): y's three gradients
    are Partial, summed locally, all-reduced once: AR(8·16 = 128) = 6 + 1.5·128 = 198 (the per-read
    rule paid 3·198 = 594); the outputs leave Shard(n), the weights' gradients are Shard (no sync).
    p2 row instead (split h: it reads y Shard(1), a free slice, and returns a Shard(1) gradient): the
    gradients hold P and S(1), each converted once, AR(128) + AG(128) = 198 + (3 + 0.75·128) = 297,
    and p2's Partial output o2 (128 bytes) is all-reduced at the `any` boundary, 198: 495."""
    graph = fan_out()
    model = CostModel(graph, MESH4, CostSettings())
    columns = model.evaluate(plan_of(graph, {"p1": "n", "p2": "n", "p3": "n"}))
    assert columns.total == pytest.approx(ar(4, 128)) == pytest.approx(198)
    mixed = model.evaluate(plan_of(graph, {"p1": "n", "p2": "h", "p3": "n"}))
    assert mixed.total == pytest.approx(ar(4, 128) + ag(4, 128) + ar(4, 128)) == pytest.approx(495)


def test_a_graph_input_read_three_times_returns_one_gradient():
    """Boundaries `replicated`, the products reading x itself: all column, x's gradients (Partial)
    are summed and all-reduced back to Replicate once, AR(128) = 198; each output o_i (Shard(n), 128
    bytes) is all-gathered at the boundary, 3·AG(128) = 297: 495. The ILP finds no cheaper plan
    than the brute force over all 3³ plans."""
    graph = fan_out("replicated", produced=False)
    model = CostModel(graph, MESH4, CostSettings())
    columns = model.evaluate(plan_of(graph, {"p1": "n", "p2": "n", "p3": "n"}))
    assert columns.total == pytest.approx(ar(4, 128) + 3 * ag(4, 128)) == pytest.approx(495)
    best, _ = brute_force(graph, MESH4)
    plan = solve(graph, MESH4, shrink=False)
    assert plan.objective == pytest.approx(best)
    assert plan.bound == pytest.approx(plan.objective, rel=1e-6)


def _multi_reader_graph(seed: int, dims: str, small: bool) -> ShardingGraph:
    """A random graph whose tensor t1 (an element-wise op's output, or the input t0 itself) is read by
    2 or 3 products t1·w_i[c_i, n_i] (c_i one of t1's dims, n_i a new one), and possibly a residual:
    y1 back to t1's dims (·v[n_1, c_1]) added to t1 (one more reader, in either operand order). Tensors over `dims`, each dim
    4 or 8; `small`: at most 5 operators."""
    rng = random.Random(seed)
    size = {d: rng.choice([4, 8]) for d in "abcdef"}
    graph = GraphBuilder(element_bytes=rng.choice([1, 2]))
    graph.input("t0", {d: size[d] for d in dims})
    read, spec = "t0", ",".join(dims)
    if rng.random() < 0.7:
        graph.elementwise("pre", f"t0[{spec}] -> t1[{spec}]")
        read = "t1"
    residual = rng.random() < 0.6
    readers = 2 if small and (residual or read == "t1") else rng.choice([2, 3])
    first = None
    for i in range(1, readers + 1):
        contracted = rng.choice(dims)
        new = rng.choice([d for d in "def" if d not in dims])
        out = ",".join(dims.replace(contracted, new))
        graph.parameter(f"w{i}", {contracted: size[contracted], new: size[new]})
        graph.product(f"p{i}", f"{read}[{spec}] w{i}[{contracted},{new}] -> y{i}[{out}]")
        first = first or (contracted, new, out)
    if residual:
        contracted, new, out = first
        graph.parameter("v", {new: size[new], contracted: size[contracted]})
        graph.product("back", f"y1[{out}] v[{new},{contracted}] -> r[{spec}]")
        operands = [f"r[{spec}]", f"{read}[{spec}]"]
        rng.shuffle(operands)  # t1 first: the add follows t1's writer (one group with it)
        graph.elementwise("add", f"{' '.join(operands)} -> s[{spec}]")
    boundary = rng.choice(["any", "replicated"])
    return graph.build(boundary, boundary)


CASES = [(seed, "abc" if seed % 4 == 0 else "ab", seed % 2 == 1) for seed in range(8)]


@pytest.mark.parametrize("seed,dims,two_axes", CASES)
def test_ilp_tables_and_evaluate_agree_with_brute_force(seed, dims, two_axes):
    """On random graphs with a tensor of several readers (1-axis mesh of 4 or a 2 × 2 mesh, random
    prices): for every plan of the unshrunk and of the shrunk space, the ILP's tables price it as
    `evaluate` does; the ILP's optimum (and its own bound) equals the least `evaluate` over the space."""
    rng = random.Random(200 + seed)
    graph = _multi_reader_graph(seed, dims, small=two_axes)
    assert any(len(reads) > 1 for reads in graph.consumers.values())
    mesh = (DeviceMesh.alpha_beta({"x": 2, "y": 2}, {"x": rng.uniform(0.5, 2), "y": rng.uniform(2, 8)},
                                  {"x": rng.uniform(0.5, 2), "y": rng.uniform(2, 8)}) if two_axes else
            DeviceMesh.alpha_beta({"x": 4}, rng.uniform(0.5, 2), rng.uniform(0.5, 2)))
    settings = CostSettings(seconds_per_flop=rng.uniform(0, 0.05))
    model = CostModel(graph, mesh, settings)
    names = [op.name for op in graph.ops]
    for merge in (False, True):
        tables = model.tables(merge=merge)
        best = math.inf
        for combo in itertools.product(*[range(len(group.choices)) for group in tables.groups]):
            index = {}
            for group, k in zip(tables.groups, combo):
                index.update(zip(group.members, group.choices[k]))
            cost = model.evaluate({name: model.strategies[v][index[v]] for v, name in enumerate(names)}).total
            assert _plan_cost(tables, combo) == pytest.approx(cost, rel=1e-9, abs=1e-12)
            best = min(best, cost)
        plan = solve(graph, mesh, settings, shrink=merge)
        assert plan.status == "optimal"
        assert plan.objective == pytest.approx(best, rel=1e-7)
        assert plan.bound == pytest.approx(plan.objective, rel=1e-6)
