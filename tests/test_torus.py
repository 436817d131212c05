"""A TPU slice's torus: its shape, the groups of a layout on its axes, collectives against hand
figures and brute forces (link loads of shortest-path routes), bad torus settings, and one MaxText
layer's time on a TPU v5e by hand."""

from __future__ import annotations

import itertools

import pytest

from phaze_common.checks import InputError
from estimator.workload import default_table, layer_workload
from graph_extract import KernelOptions, ModelSpec, extract
from phaze_hardware import KNOWN_CHIPS, SYSTEMS
from phaze_hardware.cluster import Group
from phaze_hardware.torus import Torus, slice_shape

LINK = 45e9 * 0.8  # TPU v4's ICI link, one way, at the systems' efficiency


def test_slices_take_googles_shapes():
    # Google Cloud's TPU v4 slice shapes (up to the order of the axes), v5e's 2-D ones, v5p's largest
    assert [slice_shape(chips, 3) for chips in (4, 8, 16, 32, 64, 128, 256, 4096)] == [
        (1, 2, 2), (2, 2, 2), (2, 2, 4), (2, 4, 4), (4, 4, 4), (4, 4, 8), (4, 8, 8), (16, 16, 16)]
    assert [slice_shape(chips, 2) for chips in (8, 32, 128, 256)] == [(2, 4), (4, 8), (8, 16), (16, 16)]
    assert slice_shape(6144, 3) == (16, 16, 24)


def test_which_axes_wrap_around():
    assert SYSTEMS["tpuv4_pod"].cluster(64).wraps == (True, True, True)  # a 4 x 4 x 4 cube
    assert SYSTEMS["tpuv4_pod"].cluster(32).wraps == (False, True, True)  # 2 x 4 x 4
    assert SYSTEMS["tpuv5e_pod"].cluster(128).wraps == (False, True)  # 8 x 16: only 16 wraps
    assert SYSTEMS["tpuv5e_pod"].cluster(16).wraps == (False, False)  # 4 x 4


def test_an_all_reduce_on_a_4x4x4_torus_by_hand():
    cube = SYSTEMS["tpuv4_pod"].cluster(64)
    assert isinstance(cube, Torus) and cube.shape == (4, 4, 4)
    size = 1e9
    # the data in 3 parts, each reduce-scattered along x, y, z in a rotated order: phase j carries
    # 1/3 x (1/4)^j x 3/4 of the data on a closed ring of 4 (2 links a direction); then all-gathered
    ring = 2 * LINK
    reduce_scatter = sum(size / 3 * 0.25**phase * 3 / 4 / ring for phase in range(3))
    latency = 3 * 3 * 5e-6  # 3 phases of 3 ring steps
    assert cube.all_reduce(Group(64, 1)).scalar(size) == pytest.approx(2 * (reduce_scatter + latency), rel=1e-12)
    # and that reaches the injection bound: 2 (n - 1)/n of the data through a chip's 6 links
    assert 2 * reduce_scatter == pytest.approx(2 * 63 / 64 * size / (6 * LINK), rel=1e-12)
    # a single 4-ring along one axis: the ring formula on 2 links a direction
    assert cube.all_reduce(Group(4, 1)).scalar(size) == pytest.approx(2 * 3 / 4 * size / ring + 2 * 3 * 5e-6, rel=1e-12)


def test_a_group_on_two_axes():
    cube = SYSTEMS["tpuv4_pod"].cluster(64)
    size = 1e9
    # 16 ranks 4 apart: 4 on y and 4 on z, each axis whole (closed rings of neighbours)
    axes = cube._axes(Group(16, 4))
    assert [(axis.members, axis.spacing) for axis in axes] == [(4, 1.0), (4, 1.0)]
    two = (size / 2 * 3 / 4 + size / 2 / 4 * 3 / 4) / (2 * LINK)
    assert cube.reduce_scatter(Group(16, 4)).scalar(size) == pytest.approx(two + 2 * 3 * 5e-6, rel=1e-12)
    assert cube.tier_joining(Group(16, 4)) == 2  # its slowest link is on z
    # 8 ranks 8 apart: 2 on y two links apart (sharing each link with the group between them, the
    # ring closed by the wraparound: 2 x LINK / 2) and 4 on z; each phase waits for its slowest part
    axes = cube._axes(Group(8, 8))
    assert [(axis.members, axis.spacing) for axis in axes] == [(2, 2.0), (4, 1.0)]
    y, z = LINK, 2 * LINK
    first = max(size / 2 * 1 / 2 / y, size / 2 * 3 / 4 / z)
    second = max(size / 2 / 2 * 3 / 4 / z, size / 2 / 4 * 1 / 2 / y)
    latency = 3 * 5e-6 + 3 * 5e-6
    assert cube.reduce_scatter(Group(8, 8)).scalar(size) == pytest.approx(first + second + latency, rel=1e-12)


def test_a_mesh_axis_takes_twice_a_tori():
    # "wraparound links ... double the bandwidth of all-reduce versus the mesh" (Jouppi et al. 2023)
    mesh = SYSTEMS["tpuv5e_pod"].cluster(16)  # 4 x 4, no wraparound
    torus = SYSTEMS["tpuv5e_pod"].cluster(256)  # 16 x 16
    size = 1e9
    assert mesh.all_reduce(Group(4, 1)).per_byte == pytest.approx(2 * 3 / 4 / LINK, rel=1e-12)
    assert torus.all_reduce(Group(16, 1)).per_byte == pytest.approx(2 * 15 / 16 / (2 * LINK), rel=1e-12)
    # a group on part of a wrapped axis is a line too
    assert torus.all_reduce(Group(4, 1)).scalar(size) == mesh.all_reduce(Group(4, 1)).scalar(size)


def ring_link_load(members: int, closed: bool) -> float:
    """Brute force: the most bytes on one directed link when each of `members` chips on a ring (or
    line) sends 1 byte to every other along a shortest path (ties split evenly)."""
    load = {}
    for source, target in itertools.permutations(range(members), 2):
        forward = (target - source) % members if closed else None
        routes = []
        if closed:
            backward = members - forward
            if forward <= backward:
                routes.append([(source + k) % members for k in range(forward + 1)])
            if backward <= forward:
                routes.append([(source - k) % members for k in range(backward + 1)])
        else:
            step = 1 if target > source else -1
            routes.append(list(range(source, target + step, step)))
        for route in routes:
            for hop in zip(route, route[1:]):
                load[hop] = load.get(hop, 0.0) + 1 / len(routes)
    return max(load.values())


@pytest.mark.parametrize("system, chips, group, closed", [
    ("tpuv5e_pod", 256, 16, True), ("tpuv4_pod", 64, 4, True), ("tpuv5e_pod", 16, 4, False), ("tpuv5e_pod", 64, 8, False)])
def test_an_all_to_all_is_bisection_bound(system, chips, group, closed):
    # each chip sends S, S/n to each member: the busiest link carries max_load x S/n bytes
    torus = SYSTEMS[system].cluster(chips)
    assert torus.shape[0] == group and torus.wraps[0] == closed
    size = 1e9
    expected = ring_link_load(group, closed) * size / group / LINK + (group - 1) * 5e-6
    assert torus.all_to_all(Group(group, 1)).scalar(size) == pytest.approx(expected, rel=1e-12)
    assert torus.dispatch(Group(group, 1), 8) == torus.all_to_all(Group(group, 1))


def test_a_pipeline_transfer_takes_one_link_and_slices_their_network():
    pod = SYSTEMS["tpuv4_pod"].cluster(128, 2)
    assert [tier.name for tier in pod.tiers] == ["ici_x", "ici_y", "ici_z", "dcn"]
    assert pod.send(2).per_byte == pytest.approx(1 / LINK, rel=1e-12)
    assert pod.send(3).per_byte == pytest.approx(1 / (6.25e9 * 0.8), rel=1e-12)
    # all 128 ranks: the slice's torus, then a ring of 2 slices on the 1/64 each chip holds
    size = 1e9
    slice_part = 2 * sum(size / 3 * 0.25**phase * 3 / 4 / (2 * LINK) + 3 * 5e-6 for phase in range(3))
    across = 2 * (1 / 2) * size / 64 / (6.25e9 * 0.8) + 2 * 1e-5
    assert pod.all_reduce(Group(128, 1)).scalar(size) == pytest.approx(slice_part + across, rel=1e-12)


@pytest.mark.parametrize("change, message", [
    ({"dimensions": 4}, "system.tiers[0].dimensions: must be an integer in [1, 3], got 4"),
    ({"wraparound": 0}, "system.tiers[0].wraparound: must be a positive integer, got 0"),
    ({"devices": 8}, "system.tiers[0].devices: a torus joins a slice; allowed: slice (or leave it out), got 8"),
    ({"links": 6}, "system.tiers[0]: unknown field 'links'; allowed: name, devices, bandwidth, latency, efficiency, "
                   "step_overhead, dimensions, wraparound"),
])
def test_a_bad_torus_is_one_line(change, message):
    tiers = [{"name": "ici", "bandwidth": 45e9, **change}]
    with pytest.raises(InputError) as raised:
        Torus.build("t", 64, 4, tiers)
    assert str(raised.value) == message


def test_one_maxtext_layer_on_a_v5e_by_hand(tmp_path):
    # MaxText 16B on v5e (5,120 wide, 32 heads of 256, MLP 32,768, ReLU): one block of 6 sequences of
    # 2,048 on one chip. By hand: each matrix product 2·m·n·k FLOPs at 197 TFLOP/s x the fitted 0.74;
    # causal flash attention half of 2 products of s x s per head forward, 2.5x that backward (the
    # scores recomputed); the vector work (norms, rotary, residual adds) under 1 % of it.
    spec = ModelSpec("mt16", 32, 5120, 32, 32768, 32768, 2048, 2048, norm="rmsnorm", activation="relu",
                     position_embedding="rotary", bias=False, tied_lm_head=True, dropout=0.0, kv_channels=256)
    tokens, width, heads_width, mlp, sequence = 6 * 2048, 5120, 32 * 256, 32768, 2048
    rate = 197e12 * 0.74
    dense = 2 * tokens * (4 * width * heads_width + 2 * width * mlp)
    attention = 0.5 * 2 * 2 * tokens * sequence * heads_width
    template = KNOWN_CHIPS["tpuv5e"].template
    graph = extract(spec, 6, 2048, 1, cache_dir=tmp_path).op_graph
    table = default_table(template, tmp_path)
    forward = layer_workload(graph, 1, "forward", template, table, KernelOptions(False, True))
    backward = layer_workload(graph, 1, "backward", template, table, KernelOptions(False, True))
    assert sum(op.parallel_latency for op in forward.ops) == pytest.approx((dense + attention) / rate, rel=0.015)
    assert sum(op.parallel_latency for op in backward.ops) == pytest.approx((2 * dense + 2.5 * attention) / rate,
                                                                            rel=0.015)
    products = [op for op in forward.ops if op.core_type == "TC"]
    assert len(products) == 5  # q, k, v, output projection, the MLP's second product
    for op in products:
        assert op.parallel_latency * rate == pytest.approx(2 * tokens * width * heads_width, rel=0.005) or \
            op.parallel_latency * rate == pytest.approx(2 * tokens * width * mlp, rel=0.005)
