"""Mesh axes priced by phaze's cluster (solver.auto_sharding.cluster_axis) on a toy cluster of 2
nodes of 2 devices: NVLink 100 GB/s inside a node, InfiniBand 10 GB/s between nodes (per device
per direction, efficiency 1)."""

from __future__ import annotations

import pytest

from phaze_common.checks import InputError
from phaze_hardware import Cluster, Group
from solver.auto_sharding import AlphaBeta, CostModel, CostSettings, bert_layer, megatron_plan, mlp, solve
from solver.auto_sharding.cluster_axis import ClusterAxis, cluster_mesh
from tests.test_auto_sharding import brute_force

INTRA, INTER = 100e9, 10e9


def toy(intra_latency: float = 0.0, inter_latency: float = 0.0) -> Cluster:
    return Cluster.build("toy", 4, 2, [dict(name="nvlink", bandwidth=INTRA, latency=intra_latency),
                                       dict(name="ib", bandwidth=INTER, latency=inter_latency)])


def test_axes_inside_and_across_nodes_by_hand():
    """λ 1 µs a ring step on NVLink, 5 µs on InfiniBand, B = 1e6 bytes (the full tensor along the axis).

    Inside a node (size 2, stride 1): a ring of 2 on NVLink. AR = 2·(1/2)·B/100e9 + 2·1·1 µs = 12 µs;
    AG = RS = half, 6 µs; all-to-all: each device holds B/2 and sends half of it, B/4 over NVLink,
    2.5 µs + one step 1 µs = 3.5 µs. These are AlphaBeta's ring formulas at α = 1 µs, β = 1/100e9.
    Across nodes (size 2, stride 2): one member per node, the ring crosses InfiniBand: AR = B/10e9 +
    2·5 µs = 110 µs; AG = RS = 55 µs; all-to-all B/4/10e9 + 5 µs = 30 µs.
    All four (size 4, stride 1): rings of 2 in each node, then of the 2 nodes on S/2 each (cluster.py):
    AR = B/100e9 + 2·(1/2)·(B/2)/10e9 + 2·(4 − 2)·1 µs + 2·(2 − 1)·5 µs = 10 + 50 + 4 + 10 = 74 µs."""
    cluster = toy(1e-6, 5e-6)
    inside, across = ClusterAxis(cluster=cluster, group=Group(2, 1)), ClusterAxis(cluster=cluster, group=Group(2, 2))
    size = 1e6
    assert inside.all_reduce(size) == pytest.approx(12e-6, rel=1e-12)
    assert inside.all_gather(size) == inside.reduce_scatter(size) == pytest.approx(6e-6, rel=1e-12)
    assert inside.all_to_all(size) == pytest.approx(3.5e-6, rel=1e-12)
    ring = AlphaBeta(devices=2, alpha=1e-6, beta=1 / INTRA)
    for kind in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        assert getattr(inside, kind)(size) == pytest.approx(getattr(ring, kind)(size), rel=1e-12)
    assert across.all_reduce(size) == pytest.approx(110e-6, rel=1e-12)
    assert across.all_gather(size) == across.reduce_scatter(size) == pytest.approx(55e-6, rel=1e-12)
    assert across.all_to_all(size) == pytest.approx(30e-6, rel=1e-12)
    assert ClusterAxis(cluster=cluster, group=Group(4, 1)).all_reduce(size) == pytest.approx(74e-6, rel=1e-12)


def test_bert_splits_its_tensors_on_the_fast_axis():
    """A BERT layer of batch 8 × seq 512, hidden h = 256, 8 heads, ffn f = 1024 (one byte an element,
    communication only, boundaries `any`) on the toy's 2 × 2 mesh: `fast` inside a node (AR(S) =
    S/100e9), `slow` across nodes (AR(S) = S/10e9). Megatron over fast, data parallel over slow:
    the activations b·s·h = 1,048,576 bytes are halved by the batch split; forward all-reduces
    after attn_out and down, backward one for ln1's output (up's Partial and add2's Replicate
    gradients; x's gradient is not returned under `any`): 3·524,288/100e9 = 15.72864 µs; the
    weights 3h² + h² + 2hf = 786,432 bytes, halved by the tensor split, are all-reduced across slow:
    393,216/10e9 = 39.3216 µs; total 55.05024 µs. The axes swapped cost 3·524,288/10e9 +
    393,216/100e9 = 161.21856 µs: the tensor split belongs on the fast axis (its all-reduces move
    more bytes than the weights' here: b·s = 4096 > 3h). The ILP's optimum is the former."""
    mesh = cluster_mesh(toy(), {"fast": Group(2, 1), "slow": Group(2, 2)})
    graph = bert_layer(batch=8, seq=512, hidden=256, heads=8, ffn=1024, boundary="any")
    model = CostModel(graph, mesh, CostSettings())
    activations, weights = 8 * 512 * 256 / 2, (4 * 256**2 + 2 * 256 * 1024) / 2
    fast_tensor = 3 * activations / INTRA + weights / INTER
    assert fast_tensor == pytest.approx(55.05024e-6, rel=1e-12)
    assert model.evaluate(megatron_plan(graph, mesh, "fast", "slow")).total == pytest.approx(fast_tensor, rel=1e-12)
    slow_tensor = 3 * activations / INTER + weights / INTRA
    assert model.evaluate(megatron_plan(graph, mesh, "slow", "fast")).total == pytest.approx(slow_tensor, rel=1e-12)
    plan = solve(graph, mesh)
    assert plan.status == "optimal"
    assert plan.objective == pytest.approx(fast_tensor, rel=1e-9)
    readable = plan.readable()
    assert readable["qkv"]["fast"] == readable["attn_out"]["fast"] == "a"
    assert readable["up"]["fast"] == readable["down"]["fast"] == "f"
    assert all(choice["slow"] == "b" for choice in readable.values())


def test_groups_that_do_not_fit_are_refused():
    with pytest.raises(InputError, match="group"):
        ClusterAxis(cluster=toy(), group=Group(4, 2))
    with pytest.raises(InputError, match="axes"):
        cluster_mesh(toy(), {"x": Group(4, 1), "y": Group(2, 1)})


def test_cluster_mesh_against_brute_force():
    """A 3-layer MLP (batch 8, hidden 8, boundaries `replicated`) on the toy's 2 × 2 mesh with
    latencies (1 µs NVLink, 5 µs InfiniBand): the unshrunk ILP's optimum equals the least cost over
    all 6·7·6·7·6 = 10,584 strategy combinations."""
    mesh = cluster_mesh(toy(1e-6, 5e-6), {"fast": Group(2, 1), "slow": Group(2, 2)})
    graph = mlp(3, 8, 8, boundary="replicated")
    best, argmin = brute_force(graph, mesh)
    plan = solve(graph, mesh, shrink=False)
    assert plan.objective == pytest.approx(best, rel=1e-9)
    assert tuple(plan.strategies.values()) in argmin
