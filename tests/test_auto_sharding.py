"""The intra-operator sharding ILP (solver.auto_sharding) against closed forms and brute force.

Communication only unless a test says otherwise: α = β = 1 (seconds per step, per byte), one byte
per element, compute free. On an axis of n devices (mesh.py): AR(B) = 2(n-1) + 2(n-1)/n·B,
AG(B) = RS(B) = (n-1) + (n-1)/n·B, A2A(B) = (n-1) + (n-1)/n²·B.
"""

from __future__ import annotations

import itertools
import math
import random

import pytest

from phaze_common.checks import InputError
from solver.auto_sharding import (
    PARTIAL,
    REPLICATE,
    AlphaBeta,
    CostModel,
    CostSettings,
    DeviceMesh,
    GraphBuilder,
    Shard,
    ShardingGraph,
    Strategy,
    bert_layer,
    conversion_cost,
    megatron_plan,
    mlp,
    moe_layer,
    solve,
    solve_layers,
)


def ar(n, size):
    return 2 * (n - 1) + 2 * (n - 1) / n * size


def ag(n, size):
    return (n - 1) + (n - 1) / n * size


def a2a(n, size):
    return (n - 1) + (n - 1) / n**2 * size


MESH4 = DeviceMesh.alpha_beta({"x": 4}, 1.0, 1.0)


def brute_force(graph: ShardingGraph, mesh: DeviceMesh, settings: CostSettings = CostSettings(),
                memory_limit: float = math.inf, merge: bool = False):
    """The least cost over every combination of strategies (merge=False: every operator's own; True:
    the shrunk space of leaders with followers following), each plan priced by `evaluate`, and the
    optimal plans as tuples of strategies in operator order."""
    model = CostModel(graph, mesh, settings)
    names = [op.name for op in graph.ops]
    if merge:
        groups = model.groups(merge=True)
        plans = []
        for combo in itertools.product(*[group.choices for group in groups]):
            assignment = {}
            for group, choice in zip(groups, combo):
                assignment.update({v: j for v, j in zip(group.members, choice)})
            plans.append([model.strategies[v][assignment[v]] for v in range(len(names))])
    else:
        plans = itertools.product(*model.strategies)
    best, argmin = math.inf, []
    for plan in plans:
        cost = model.evaluate(dict(zip(names, plan)))
        if cost.memory > memory_limit:
            continue
        tolerance = 1e-9 * max(1.0, cost.total)
        if cost.total < best - tolerance:
            best, argmin = cost.total, [tuple(plan)]
        elif cost.total <= best + tolerance:
            argmin.append(tuple(plan))
    return best, argmin


def test_ring_costs_and_one_axis_conversions():
    """The AlphaBeta formulas at n = 4, α = 2, β = 3, B = 64, and each one-axis conversion."""
    ring = AlphaBeta(devices=4, alpha=2.0, beta=3.0)
    assert ring.all_reduce(64) == pytest.approx(2 * 3 * 2 + 2 * 3 / 4 * 64 * 3)
    assert ring.all_gather(64) == ring.reduce_scatter(64) == pytest.approx(3 * 2 + 3 / 4 * 64 * 3)
    assert ring.all_to_all(64) == pytest.approx(3 * 2 + 3 / 16 * 64 * 3)
    assert AlphaBeta(devices=1, alpha=2.0, beta=3.0).all_reduce(64) == 0
    s0, s1 = (Shard(dim=0),), (Shard(dim=1),)
    cases = {(REPLICATE,): {(REPLICATE,): 0, s0: 0},
             s0: {(REPLICATE,): ag(4, 64), s0: 0, s1: a2a(4, 64)},
             (PARTIAL,): {(REPLICATE,): ar(4, 64), s0: ag(4, 64)}}
    for source, targets in cases.items():
        for target, expected in targets.items():
            assert conversion_cost(MESH4, 64, source, target) == pytest.approx(expected)


def test_two_axis_conversion():
    """2 × 2 mesh, axis x (α 1, β 1), y (α 5, β 3), T = 64 bytes. (S(0), S(1)) -> (R, R): two
    all-gathers in mesh order; x's runs while y still shards the tensor: (1 + 1/2·32) + (5 + 1/2·64·3)
    = 17 + 101. (P, R) -> (S(0), S(1)): y's slice first, then x's reduce-scatter on 32 bytes: 1 + 16."""
    mesh = DeviceMesh.alpha_beta({"x": 2, "y": 2}, {"x": 1.0, "y": 5.0}, {"x": 1.0, "y": 3.0})
    assert conversion_cost(mesh, 64, (Shard(dim=0), Shard(dim=1)), (REPLICATE, REPLICATE)) == pytest.approx(118)
    assert conversion_cost(mesh, 64, (PARTIAL, REPLICATE), (Shard(dim=0), Shard(dim=1))) == pytest.approx(17)


def test_mlp_large_batch_is_data_parallel():
    """6 products [256, 32]·[32, 32] on 4 devices, boundaries `any`. Splitting the batch b keeps
    every activation Shard(b) end to end (no resharding) and leaves each weight's gradient Partial:
    6 all-reduces of 32·32 bytes, 6·(2·3 + 2·3/4·1024) = 9252. Any split of a weight dim instead
    reshards activations of 256·32 = 8192 bytes at least twice (forward and backward, ≥ 2·(3 +
    3/4·8192) = 12294 per boundary), more than the 1542 its weight's all-reduce saves."""
    plan = solve(mlp(6, 256, 32), MESH4)
    assert plan.status == "optimal"
    assert plan.objective == pytest.approx(6 * (2 * 3 + 2 * 3 / 4 * 1024))
    assert plan.gap == pytest.approx(0, abs=1e-6)
    assert all(choice == {"x": "b"} for choice in plan.readable().values())
    unshrunk = solve(mlp(6, 256, 32), MESH4, shrink=False)
    assert unshrunk.objective == pytest.approx(plan.objective)


def test_replicated_compute_when_compute_is_cheap():
    """With `replicated_compute` and 10⁻⁶ s per FLOP (backward 2× forward), computing all of the
    batch-256 MLP on each device costs (6 products · 2·256·32·32 FLOPs + 5 ReLUs · 256·32) · 3 ·
    10⁻⁶ = 9.560 s and no communication, less than data parallelism's 9252 s of all-reduces."""
    settings = CostSettings(seconds_per_flop=1e-6, replicated_compute=True)
    plan = solve(mlp(6, 256, 32), MESH4, settings)
    assert plan.objective == pytest.approx((6 * 2 * 256 * 32 * 32 + 5 * 256 * 32) * 3 * 1e-6)
    assert set(plan.readable().values()) == {"replicated"}


def _mlp_chain_costs(batch: int, hidden: int, n: int, gamma: float = 0.0) -> tuple[float, set[str]]:
    """Hand prices of a chain of column (c: split n) and row (r: split k) products, with the ReLU in
    between following its product (reading a Partial output whole) and boundaries `replicated`; A =
    activation bytes b·h. Layer 1 input: c returns a Partial gradient, AR(A); r a Shard one, AG(A).
    Last output: r is Partial, AR(A); c is Shard, AG(A). Between layers: c->r nothing; r->c the
    row's all-reduce forward and the column's input gradient all-reduce backward, 2·AR(A); c->c
    AG(A) forward and RS(A) backward; r->r AR(A) forward (the ReLU reads it whole) and AG(A)
    backward. Each collective also costs `gamma` once. Returns the least total over {c, r}^6 and its
    arguments."""
    a = batch * hidden
    first = {"c": ar(n, a) + gamma, "r": ag(n, a) + gamma}
    last = {"r": ar(n, a) + gamma, "c": ag(n, a) + gamma}
    step = {"cr": 0.0, "rc": 2 * (ar(n, a) + gamma), "cc": 2 * (ag(n, a) + gamma), "rr": ar(n, a) + ag(n, a) + 2 * gamma}
    totals = {"".join(s): first[s[0]] + last[s[-1]] + sum(step[s[i] + s[i + 1]] for i in range(5))
              for s in itertools.product("cr", repeat=6)}
    best = min(totals.values())
    return best, {s for s, total in totals.items() if total == best}


def test_mlp_small_batch_is_tensor_parallel():
    """Batch 32, hidden 256, boundaries `replicated` (a stack's layer: the input arrives whole, its
    gradient is returned whole, the output leaves whole). A weight's all-reduce (2·3 + 1.5·65536)
    dwarfs any activation's (8192 bytes), so no product splits the batch. Megatron's alternation
    c r c r c r costs AR(A) (input gradient) + 2 pairs' r->c 2·AR(A) + AR(A) (output) = 6·AR(8192)
    = 6·(6 + 1.5·8192) = 73764; with AR = RS + AG, a c->c boundary costs the same as c->r->c, so
    some other chains tie (the hand table of `_mlp_chain_costs`); the plan is one of them."""
    graph = mlp(6, 32, 256, boundary="replicated")
    plan = solve(graph, MESH4)
    best, chains = _mlp_chain_costs(32, 256, 4)
    assert best == pytest.approx(6 * ar(4, 32 * 256)) == pytest.approx(73764)
    assert "crcrcr" in chains
    assert plan.objective == pytest.approx(best)
    chosen = "".join({"n": "c", "k": "r"}[plan.readable()[f"linear{i}"]["x"]] for i in range(1, 7))
    assert chosen in chains
    megatron = {}
    for i in range(1, 7):
        megatron[f"linear{i}"] = Strategy(splits=("n" if i % 2 else "k",))
        if i < 6:
            megatron[f"relu{i}"] = Strategy(splits=("n" if i % 2 else None,))
    assert CostModel(graph, MESH4, CostSettings()).evaluate(megatron).total == pytest.approx(best)


def test_mlp_small_batch_alternates_once_a_call_has_a_cost():
    """The same MLP with γ = 1 a collective call (NCCL's base latency): Megatron's c r c r c r makes
    6 calls, the chains tied with it at γ = 0 more (c c c c c r: 10), so the alternation is the one
    optimum, 6·(AR(8192) + 1) = 73770."""
    graph = mlp(6, 32, 256, boundary="replicated")
    plan = solve(graph, DeviceMesh.alpha_beta({"x": 4}, 1.0, 1.0, gamma=1.0))
    best, chains = _mlp_chain_costs(32, 256, 4, gamma=1.0)
    assert chains == {"crcrcr"}
    assert plan.objective == pytest.approx(best) == pytest.approx(6 * (ar(4, 32 * 256) + 1)) == pytest.approx(73770)
    assert "".join({"n": "c", "k": "r"}[plan.readable()[f"linear{i}"]["x"]] for i in range(1, 7)) == "crcrcr"


BERT = dict(batch=8, seq=128, hidden=1024, heads=16, ffn=4096)


def test_bert_layer_is_megatron():
    """BERT layer, hidden 1024, 16 heads, ffn 4096, batch 8 × seq 128 on 4 devices, boundaries
    `replicated`. Megatron: the attention-output and MLP-down row products' Partial outputs are
    all-reduced forward, the QKV and MLP-up column products' Partial input gradients backward (the
    residual branches and layer norms are whole, so nothing else moves): 4·AR(b·s·h) = 4·(6 +
    1.5·1,048,576) = 6,291,480. Data parallelism instead all-reduces the weights, 12·h² bytes: 6 +
    1.5·12,582,912 = 18,874,374; tensor parallelism wins while b·s < 3h (here 1024 < 3072)."""
    graph = bert_layer(**BERT)
    plan = solve(graph, MESH4)
    assert plan.objective == pytest.approx(4 * ar(4, 8 * 128 * 1024)) == pytest.approx(6291480)
    readable = plan.readable()
    assert readable["qkv"] == readable["scores"] == readable["context"] == {"x": "a"}
    assert readable["attn_out"] == {"x": "a"}  # rows: a and d are contracted
    assert readable["up"] == readable["down"] == {"x": "f"}
    assert readable["add1"] == readable["ln1"] == readable["add2"] == readable["ln2"] == "replicated"


def test_megatron_is_in_the_space_and_never_better():
    """Megatron's plan is a plan of the shrunk space (each follower's strategy is the one it
    follows), it costs 4·AR(b·s·h) by hand, and the ILP's optimum is at most that, on one axis and
    on a 2 × 2 mesh (Megatron over x, data parallel over y)."""
    graph = bert_layer(**BERT)
    for mesh, tensor_axis, data_axis in ((MESH4, "x", None),
                                         (DeviceMesh.alpha_beta({"x": 2, "y": 2}, 1.0, 1.0), "x", "y")):
        model = CostModel(graph, mesh, CostSettings())
        plan = megatron_plan(graph, mesh, tensor_axis, data_axis)
        chosen = [model.strategies[v].index(plan[op.name]) for v, op in enumerate(graph.ops)]
        for group in model.groups(merge=True):
            assert tuple(chosen[v] for v in group.members) in group.choices
        megatron = model.evaluate(plan).total
        if data_axis is None:
            assert megatron == pytest.approx(4 * ar(4, 8 * 128 * 1024))
        assert solve(graph, mesh).objective <= megatron * (1 + 1e-9)


def test_moe_layer_is_expert_parallel():
    """GShard MoE: 512 tokens in 4 groups of 128, hidden 64, ffn 256, 4 experts, top-2, capacity
    c = 128·2/4 = 64, on 4 devices, boundaries `any`. Expert parallelism: the gate, routing,
    dispatch and combine split the groups g, the expert products split e; the dispatched tensor
    xd[e,g,c,m] (4·4·64·64 = 65,536 bytes) goes Shard(g) -> Shard(e) before the experts and the
    experts' output y back, each forward and backward: 4 all-to-alls, 4·(3 + 3/16·65,536) = 49,164;
    the gate's weight [64, 4] gradient is all-reduced: 6 + 1.5·256 = 390. Total 49,554. Data
    parallel experts would all-reduce 2·4·64·256 bytes of expert weights: 196,614 alone."""
    graph = moe_layer(512, 64, 256, 4, 2)
    plan = solve(graph, MESH4)
    expected = 4 * a2a(4, 4 * 4 * 64 * 64) + ar(4, 64 * 4)
    assert expected == pytest.approx(49554)
    assert plan.objective == pytest.approx(expected)
    readable = plan.readable()
    for name in ("gate", "route", "dispatch", "combine"):
        assert readable[name] == {"x": "g"}
    assert readable["up"] == readable["down"] == {"x": "e"}
    best, _ = brute_force(graph, MESH4, merge=True)
    assert plan.objective == pytest.approx(best)


def test_two_axis_mesh_against_brute_force():
    """A 3-layer MLP (batch 8, hidden 8, boundaries `replicated`) on a 2 × 2 mesh with unequal
    axes (x: α 1, β 1; y: α 5, β 3): the unshrunk ILP's optimum equals the least cost over all
    6·7·6·7·6 = 10,584 strategy combinations."""
    mesh = DeviceMesh.alpha_beta({"x": 2, "y": 2}, {"x": 1.0, "y": 5.0}, {"x": 1.0, "y": 3.0})
    graph = mlp(3, 8, 8, boundary="replicated")
    best, argmin = brute_force(graph, mesh)
    plan = solve(graph, mesh, shrink=False)
    assert plan.status == "optimal"
    assert plan.objective == pytest.approx(best)
    assert tuple(plan.strategies.values()) in argmin


def _random_graph(seed: int, rank: int) -> ShardingGraph:
    """A random DAG of 4 or 5 operators, products and element-wise ops, over tensors of `rank`
    dims of 4 or 8."""
    rng = random.Random(seed)
    size = {d: rng.choice([4, 8]) for d in "abcdefg"}
    graph = GraphBuilder(element_bytes=rng.choice([1, 2]))
    graph.input("t0", {d: size[d] for d in "abc"[:rank]})
    tensors = {"t0": "abc"[:rank]}
    for i in range(1, rng.choice([4, 5]) + 1):
        name, source = f"t{i}", rng.choice(sorted(tensors))
        dims = tensors[source]
        if rng.random() < 0.6:
            contracted = rng.choice(dims)
            new = rng.choice([d for d in "abcdefg" if d not in dims])
            out = dims.replace(contracted, new)
            graph.parameter(f"w{i}", {contracted: size[contracted], new: size[new]})
            spec = f"{source}[{','.join(dims)}] w{i}[{contracted},{new}] -> {name}[{','.join(out)}]"
            graph.product(f"op{i}", spec)
        else:
            others = [t for t in sorted(tensors) if tensors[t] == dims and t != source]
            operands = [source, *others[:1]]
            graph.elementwise(f"op{i}", " ".join(f"{t}[{','.join(dims)}]" for t in operands)
                              + f" -> {name}[{','.join(dims)}]")
            out = dims
        tensors[name] = out
    boundary = rng.choice(["any", "replicated"])
    return graph.build(boundary, boundary)


@pytest.mark.parametrize("seed", range(3))
def test_random_graphs_against_brute_force(seed):
    """Random graphs, meshes (4 devices with rank-3 tensors, or 2 × 2 with rank 2) and prices: the
    unshrunk ILP's optimum equals the least cost over every combination of every operator's
    strategies, priced one by one."""
    rng = random.Random(100 + seed)
    graph = _random_graph(seed, rank=3 if seed % 2 == 0 else 2)
    mesh = (DeviceMesh.alpha_beta({"x": 4}, rng.uniform(0.5, 2), rng.uniform(0.5, 2)) if seed % 2 == 0 else
            DeviceMesh.alpha_beta({"x": 2, "y": 2}, {"x": rng.uniform(0.5, 2), "y": rng.uniform(2, 8)},
                                  {"x": rng.uniform(0.5, 2), "y": rng.uniform(2, 8)}))
    settings = CostSettings(seconds_per_flop=rng.uniform(0, 0.05))
    best, _ = brute_force(graph, mesh, settings)
    plan = solve(graph, mesh, settings, shrink=False)
    assert plan.objective == pytest.approx(best, rel=1e-7)


def test_memory_bound_moves_away_from_data_parallel():
    """The batch-256 MLP holds 6·32·32 = 6144 weight bytes per device when data parallel; a layer
    that splits k or n holds 256. Under M = 4096 at most 3 layers stay replicated (4·1024 + 2·256 >
    4096): the plan differs from data parallelism, fits, and costs the brute force's least cost
    under the same bound. Under M = 6·256 - 1 no plan fits."""
    graph = mlp(6, 256, 32)
    plan = solve(graph, MESH4, memory_limit=4096)
    best, argmin = brute_force(graph, MESH4, memory_limit=4096, merge=True)
    assert plan.status == "optimal"
    assert plan.cost.memory <= 4096
    assert plan.objective == pytest.approx(best)
    assert plan.objective > 6 * ar(4, 1024)
    assert sum(plan.readable()[f"linear{i}"] == {"x": "b"} for i in range(1, 7)) <= 3
    assert solve(graph, MESH4, memory_limit=6 * 256 - 1).status == "infeasible"


def test_repeated_layers_share_one_plan():
    """Three equal MLP layers (boundaries `replicated`) are solved once: the stack costs 3 times the
    layer; a layer of another size is refused."""
    layers = [mlp(2, 32, 256, boundary="replicated") for _ in range(3)]
    stack = solve_layers(layers, MESH4)
    assert stack.objective == pytest.approx(3 * solve(layers[0], MESH4).objective)
    with pytest.raises(InputError, match=r"layers\[1\]"):
        solve_layers([layers[0], mlp(2, 32, 128, boundary="replicated")], MESH4)


def test_bad_input_names_the_field():
    with pytest.raises(InputError, match="mesh axes"):
        DeviceMesh(axes=())
    with pytest.raises(InputError, match="kind"):
        GraphBuilder().op("conv", "c", "x[a] -> y[a]")
    with pytest.raises(InputError, match="memory_limit"):
        solve(mlp(1, 8, 8), MESH4, memory_limit=-1)
