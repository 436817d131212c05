"""The cluster: Megatron's group layout and hierarchical collectives against hand calculations."""

import pytest

from phaze_hardware import Cluster, Group
from solver.layout import Layout

GIB = 2**30


def two_tiers(devices=32, node=8, intra=300e9, inter=25e9, intra_latency=3e-6, inter_latency=6e-6,
              intra_efficiency=1.0, inter_efficiency=1.0, step_overhead=0.0) -> Cluster:
    return Cluster.build("test", devices, node, [
        dict(name="nvlink", bandwidth=intra, latency=intra_latency, efficiency=intra_efficiency),
        dict(name="ib", bandwidth=inter, latency=inter_latency, efficiency=inter_efficiency,
             step_overhead=step_overhead),
    ])


def test_flat_ring_is_the_spec_example():
    # the original program's example: [2048, 1, 12288] fp16 among 8 chips moves 88,080,384 bytes per
    # chip in a ring, 2(n − 1)/n of the tensor: 0.020508 s at 4 GiB/s
    flat = Cluster.build("original", 8, 1, [dict(bandwidth=4 * GIB)])
    assert flat.all_reduce(Group(8, 1)).scalar(2048 * 12288 * 2) == pytest.approx(88_080_384 / 2**32, rel=1e-15)
    assert flat.all_reduce(Group(1, 1)).scalar(1e9) == 0.0  # alone: nothing to do
    assert flat.all_reduce(Group(8, 1)).scalar(0) == 0.0  # nothing to send: no latency either


def test_group_inside_a_node_uses_only_the_inner_tier():
    cluster = two_tiers()
    size = 1e8
    expected = 2 * 7 / 8 * size / 300e9 + 2 * 7 * 3e-6
    assert cluster.all_reduce(Layout(8).groups()["tensor"]).scalar(size) == pytest.approx(expected, rel=1e-12)


def test_all_reduce_over_two_nodes_bytes_by_the_hierarchy_latency_by_the_flat_ring():
    # 16 consecutive devices: g = 8 per node, k = 2 nodes. Bytes: the hierarchy of rings of the module
    # docstring; latency: NCCL's one ring through all 16, 2 x 15 steps of which 2 x 1 cross the nodes
    # (k − 1 = 1 inter-node step in the reduce-scatter half, 1 in the all-gather half)
    cluster = two_tiers()
    size = 1e8
    expected = (2 * 7 / 8 * size / 300e9 + 2 * 1 / 2 * (size / 8) / 25e9) + (2 * 14 * 3e-6 + 2 * 1 * 6e-6)
    assert cluster.all_reduce(Group(16, 1)).scalar(size) == pytest.approx(expected, rel=1e-12)
    # 32 devices over 4 nodes: 32 − 4 = 28 steps on NVLink, 4 − 1 = 3 across, each way
    assert cluster.all_reduce(Group(32, 1)).fixed == pytest.approx(2 * 28 * 3e-6 + 2 * 3 * 6e-6, rel=1e-12)


def test_a_ring_leaving_the_node_takes_at_least_the_networks_step_overhead_on_every_step():
    # NCCL's model: every step of a ring that crosses the network costs at least the proxy's overhead
    cluster = two_tiers(step_overhead=5e-6)
    assert cluster.all_reduce(Group(16, 1)).fixed == pytest.approx(2 * 14 * 5e-6 + 2 * 1 * 6e-6, rel=1e-12)
    assert two_tiers(step_overhead=9e-6).all_reduce(Group(16, 1)).fixed == pytest.approx(2 * 15 * 9e-6, rel=1e-12)
    # a ring inside a node never touches the network: its own latency only
    assert cluster.all_reduce(Group(8, 1)).fixed == pytest.approx(2 * 7 * 3e-6, rel=1e-12)
    assert cluster.all_gather(Group(16, 1)).fixed == pytest.approx(14 * 5e-6 + 6e-6, rel=1e-12)


def test_strided_data_parallel_groups():
    cluster = two_tiers()
    size = 1e8
    # t = 8: a data-parallel group of 4 has one member per node; every byte crosses InfiniBand
    data = Layout(8, data_parallel_width=4).groups()["data"]
    assert cluster.all_reduce(data).scalar(size) == pytest.approx(2 * 3 / 4 * size / 25e9 + 2 * 3 * 6e-6, rel=1e-12)
    # t = 4: two members per node, two nodes (the ring's 3 steps: 2 inside the nodes, 1 across)
    expected = 2 * 1 / 2 * size / 300e9 + 2 * 1 / 2 * (size / 2) / 25e9 + 2 * 2 * 3e-6 + 2 * 6e-6
    assert cluster.all_reduce(Group(4, 4)).scalar(size) == pytest.approx(expected, rel=1e-12)
    assert cluster.tier_joining(Layout(2, data_parallel_width=4).groups()["data"]) == 0
    assert cluster.tier_joining(Layout(4, data_parallel_width=4).groups()["data"]) == 1


def test_reduce_scatter_and_all_gather_are_half_an_all_reduce_and_efficiency_scales_bandwidth():
    cluster = two_tiers(intra_efficiency=0.5)
    whole = cluster.all_reduce(Group(16, 1)).scalar(1e8)
    assert cluster.reduce_scatter(Group(16, 1)).scalar(1e8) == pytest.approx(whole / 2, rel=1e-12)
    assert cluster.all_gather(Group(16, 1)).scalar(1e8) == pytest.approx(whole / 2, rel=1e-12)
    tensor = Layout(8).groups()["tensor"]
    assert cluster.all_reduce(tensor).scalar(1e8) == pytest.approx(2 * 7 / 8 * 1e8 / 150e9 + 14 * 3e-6, rel=1e-12)


def test_pipeline_links():
    cluster = two_tiers()
    # stages t·d = 2 devices apart: up to 4 stages stay in a node of 8, more cross nodes
    pipeline = Layout(1, 4, 2).groups()["pipeline"]
    assert pipeline == Group(4, 2) and cluster.tier_joining(pipeline) == 0
    assert cluster.tier_joining(Layout(1, 5, 2).groups()["pipeline"]) == 1
    assert cluster.size_ranges(2, 16) == [(0, 1, 4), (1, 5, 16)]
    assert cluster.size_ranges(8, 4) == [(0, 1, 1), (1, 2, 4)]
    assert cluster.send(1).scalar(25e6) == pytest.approx(1e-3 + 6e-6)


@pytest.mark.parametrize("change, message", [
    (dict(node=6), "num_devices: 32 is not a multiple of system.node_size=6; allowed: a multiple of 6"),
    (dict(intra=0.0), r"system.tiers\[0\].bandwidth: must be a finite number > 0"),
    (dict(inter_efficiency=1.5), r"system.tiers\[1\].efficiency: must be in \(0, 1\]"),
    (dict(intra_latency=-1.0), r"system.tiers\[0\].latency: must be a finite number >= 0"),
    (dict(step_overhead=-1.0), r"system.tiers\[1\].step_overhead: must be a finite number >= 0"),
])
def test_bad_clusters_name_the_field(change, message):
    with pytest.raises(ValueError, match=message):
        two_tiers(**change)
    with pytest.raises(ValueError, match="last tier must join all 32"):
        Cluster.build("x", 32, 8, [dict(bandwidth=1e9, devices=8)])


def test_rank_groups_follow_megatron_core_order():
    """tp-cp-ep-dp-pp: rank = tensor + t·(context + c·(data + d·pipeline)), the expert rank inside
    the data rank; each group's members are its stride apart."""
    layout = Layout(tensor_parallel_width=2, pipeline_parallel_width=3, data_parallel_width=4,
                    expert_parallel_width=2, context_parallel_width=2)
    assert layout.devices == 2 * 2 * 3 * 4
    groups = layout.groups()
    assert list(groups) == ["tensor", "context", "expert", "data", "weights", "expert_weights", "pipeline",
                            "expert_tensor"]
    assert groups == {"tensor": Group(2, 1), "context": Group(2, 2), "expert": Group(2, 4), "data": Group(4, 4),
                      "weights": Group(8, 2), "expert_weights": Group(4, 4), "pipeline": Group(3, 16),
                      "expert_tensor": Group(2, 1)}  # the experts split as t
    # Megatron-Core's MoE parallel folding with ETP 1: the t·c·d = 16 ranks of a stage hold e = 2 expert
    # groups 1 apart, the 16 / 2 = 8 ranks holding the same experts 2 apart
    folded = layout.replace(expert_tensor_parallel_width=1).groups()
    assert (folded["expert"], folded["expert_weights"], folded["expert_tensor"]) == (Group(2, 1), Group(8, 2),
                                                                                    Group(1, 1))
    cluster = two_tiers(devices=48, node=8)
    # tensor (2 at stride 1), context (2 at 2), expert (2 at 4) in a node of 8; data (4 at 4) and the
    # pipeline (stages 16 apart) cross nodes
    assert cluster.spans(groups) == {"tensor": "nvlink", "context": "nvlink", "expert": "nvlink", "data": "ib",
                                     "weights": "ib", "expert_weights": "ib", "pipeline": "ib",
                                     "expert_tensor": "nvlink"}
