"""The host's time to issue a layer's kernels (`estimator.roofline.issue_seconds`) and the step model's
pass bound by it (`solver.training_step.layer_terms.issued`): a grouped expert product issues one GEMM
per local expert and direction's GEMM, and in MXFP8 or FP8 current scaling one cast per local expert;
a device holding E/e experts issues E/e of them; the collectives of a host-bound pass run in its idle
time. Every number by hand."""

import dataclasses
from functools import lru_cache

import pytest

from estimator.fusion import fuse_layers
from estimator.roofline import issue_seconds, layer_times
from estimator.work import BACKWARD, FORWARD
from graph_extract import KernelOptions, extract, get_spec
from phaze_hardware import Cluster, known_chip
from solver.layout import Layout
from solver.training_step import Device, Placement, StepGraph, StepLayer, TrainingOptions, TrainingStep
from tests.test_kernel_launch import BACKWARD_KERNELS, FORWARD_KERNELS, TINY

#: A Mixtral-like block of 4 experts (FFN 96, 2 a token): gate, up and down are its grouped products.
EXPERTS = 4
TOY = get_spec("mixtral-8x7b").with_overrides(
    num_layers=2, hidden_size=64, num_heads=8, num_kv_heads=2, ffn_hidden_size=96, vocab_size=500,
    max_position_embeddings=32, default_sequence_length=16, num_experts=EXPERTS, experts_per_token=2)
#: Round host times: 1 ms a kernel, 10 ms an expert's GEMM (a test chip with FP8 and MXFP8 figures).
KERNEL, EXPERT_GEMM = 1e-3, 1e-2
CHIP = dataclasses.replace(known_chip("b200"), kernel_host_seconds=KERNEL, expert_gemm_host_seconds=EXPERT_GEMM)


@lru_cache(maxsize=None)
def toy_graph(width: int):
    """TOY's op graph at width t (one sequence of 16 tokens), traced once."""
    return extract(TOY, 1, 16, width).op_graph


def grouped_and_norm(graph):
    """The first block's grouped expert products and its first norm (fused groups)."""
    (fused,) = fuse_layers(graph, (1,))
    grouped = [op for op in fused.ops if graph.nodes[op.members[0]].op == "grouped_linear"]
    norm = next(op for op in fused.ops if graph.nodes[op.members[0]].op == "rmsnorm")
    return grouped, norm


@pytest.mark.parametrize("kernels, forward, backward", [
    # 16-bit: E GEMMs forward (4 x 10 ms), 2E backward (data and weight gradient: 8 x 10 ms); no cast
    (KernelOptions(), (0.0, 0.040), (0.0, 0.080)),
    # FP8 delayed scaling: one fused cast of all experts' tensors (1 ms), the GEMMs as in 16-bit
    (KernelOptions(precision="fp8"), (KERNEL, 0.040), (KERNEL, 0.080)),
    # FP8 current scaling and MXFP8: one cast per expert, 4 x (10 + 1) ms forward, 4 x (20 + 1) backward
    (KernelOptions(precision="fp8", fp8_recipe="current"), (0.0, 0.044), (0.0, 0.084)),
    (KernelOptions(precision="mxfp8"), (0.0, 0.044), (0.0, 0.084)),
    # CUDA graphs: the host issues nothing
    (KernelOptions(precision="mxfp8", cuda_graphs=True), (0.0, 0.0), (0.0, 0.0)),
])
def test_a_grouped_expert_product_issues_a_gemm_and_a_cast_per_expert(kernels, forward, backward):
    graph = toy_graph(1)
    narrow = kernels.fp8_operators(graph)
    grouped, norm = grouped_and_norm(graph)
    assert len(grouped) == 3 and all(graph.nodes[op.members[0]].gemm.batch == EXPERTS for op in grouped)
    for op in grouped:
        assert issue_seconds(graph, op, FORWARD, CHIP, narrow, kernels) == pytest.approx(forward, abs=1e-15)
        assert issue_seconds(graph, op, BACKWARD, CHIP, narrow, kernels) == pytest.approx(backward, abs=1e-15)
    # a norm is one kernel each way, no expert's
    issued = 0.0 if kernels.cuda_graphs else KERNEL
    assert issue_seconds(graph, norm, FORWARD, CHIP, narrow, kernels) == (issued, 0.0)
    assert issue_seconds(graph, norm, BACKWARD, CHIP, narrow, kernels) == (issued, 0.0)


@pytest.mark.parametrize("width", [1, 2])
def test_a_layer_counts_every_expert_of_the_graph_at_any_width(width):
    """Gate, up and down of 4 experts in MXFP8: 3 x 4 x (10 + 1) ms forward, 3 x 4 x (20 + 1) ms
    backward; at t = 2 each expert is split over the two ranks, and each rank still issues a GEMM per
    expert."""
    graph = toy_graph(width)
    times = layer_times(graph, 1, CHIP, KernelOptions(precision="mxfp8", sequence_parallel=False))
    assert times.expert_issue_forward == pytest.approx(3 * 4 * 0.011)
    assert times.expert_issue_backward == pytest.approx(3 * 4 * 0.021)


def test_a_dense_block_issues_its_kernels_at_the_kernel_floor():
    """The tiny GPT block's 12 forward and 16 backward kernels (tests/test_kernel_launch.py's hand
    count) at 1 ms each; none of an expert; nothing with CUDA graphs. Its issue time equals its launch
    floors' sum when every kernel is shorter than the floor, so a dense pass is never bound by it."""
    graph = extract(TINY, 2, 128, 1).op_graph
    slow_host = dataclasses.replace(CHIP, kernel_host_seconds=1.0)
    eager = layer_times(graph, 1, slow_host, KernelOptions())
    assert (eager.issue_forward, eager.issue_backward) == pytest.approx((FORWARD_KERNELS * 1.0, BACKWARD_KERNELS * 1.0))
    assert (eager.expert_issue_forward, eager.expert_issue_backward) == (0.0, 0.0)
    assert eager.issue_forward == pytest.approx(eager.forward, rel=1e-5)
    graphed = layer_times(graph, 1, slow_host, KernelOptions(cuda_graphs=True))
    assert (graphed.issue_forward, graphed.issue_backward, graphed.expert_issue_forward) == (0.0, 0.0, 0.0)


def test_a_chip_without_an_expert_figure_issues_an_expert_gemm_as_any_kernel():
    plain = dataclasses.replace(CHIP, expert_gemm_host_seconds=0.0)
    assert plain.expert_gemm_seconds == KERNEL
    assert CHIP.expert_gemm_seconds == EXPERT_GEMM


def host_bound_graph(expert_forward: float, expert_backward: float) -> StepGraph:
    """Embedding, two mixture blocks, head; every layer 1 s forward and 2 s backward on the device;
    each block's host issues 0.5 s forward and 1 s backward besides its experts', and
    `expert_forward` / `expert_backward` for all its experts; two all-to-alls of 8e6 bytes a pass."""
    def layer(i, block):
        return StepLayer(id=i, forward=1.0, backward=2.0, attention_core_forward=0.0, parameters=4e6,
                         activation_bytes=1e6, is_block=block, expert_parameters=2e6 if block else 0.0,
                         all_to_all_bytes=(8e6, 8e6) if block else (),
                         issue_forward=0.5 if block else 0.0, issue_backward=1.0 if block else 0.0,
                         expert_issue_forward=expert_forward if block else 0.0,
                         expert_issue_backward=expert_backward if block else 0.0)
    return StepGraph(1, tuple(layer(i, 0 < i < 3) for i in range(4)), ((0, 1, 1e6), (1, 2, 1e6), (2, 3, 1e6)))


def price(graph: StepGraph, e: int):
    """One stage, d 4, expert width e, 8 micro-batches of the batch (2 a replica), on one tier of
    1e9 B/s without latency."""
    cluster = Cluster.build("one", 8, 8, [dict(bandwidth=1e9, latency=0.0, efficiency=1.0)])
    step = TrainingStep(graph, cluster, TrainingOptions("adam", "optimizer"), KernelOptions(True), Device(1e12, 1e12),
                        8, "none", Layout(1, expert_parallel_width=e))
    return step.price(Placement(Layout(1, 1, 4, expert_parallel_width=e), ((0, 1, 2, 3),)))


@pytest.mark.parametrize("e, forward, backward", [
    (1, 0.5 + 6.0, 1.0 + 12.0),  # every expert on the device: the host's 6.5 s and 13 s
    (2, 0.5 + 3.0, 1.0 + 6.0),  # half of them: 3.5 s and 7 s
    (4, 0.5 + 1.5, 1.0 + 3.0),  # a quarter: 2 s and 4 s
])
def test_a_pass_takes_the_hosts_time_for_the_devices_local_experts(e, forward, backward):
    """Each block's experts take the host 6 s forward and 12 s backward all together; a device holding
    E/e of them issues 1/e of that. The blocks' passes exceed the device's 1 s and 2 s by the
    difference, the breakdown's kernel launch: 2 blocks x 2 micro-batches. The all-to-alls (4 of 8e6
    bytes a block and micro-batch, (e - 1)/e of them leaving: at most 24 ms) run in that idle time."""
    result = price(host_bound_graph(6.0, 12.0), e)
    idle = (forward - 1.0) + (backward - 2.0)
    assert result.breakdown["kernel_launch"] == pytest.approx(2 * 2 * idle)
    assert result.breakdown["compute"] == pytest.approx(2 * 4 * 3.0)  # the device's: 4 layers of 3 s
    assert result.breakdown["expert_parallel"] == pytest.approx(0.0, abs=1e-12)


def test_the_all_to_alls_fill_the_idle_time_of_a_host_bound_pass():
    """At e = 2 the host issues 0.5 + 1.008 / 2 = 1.004 s forward (4 ms over the device's 1 s) and
    1 + 2 / 2 = 2 s backward (not over): 4 ms idle a block. The all-to-alls of 2 at stride 1 send half
    of 8e6 bytes at 1e9 B/s, 4 ms each, 4 a block: 16 ms, of which 12 ms stay exposed; over 2 blocks
    and 2 micro-batches 48 ms, and 16 ms of kernel launch."""
    result = price(host_bound_graph(1.008, 2.0), 2)
    assert result.breakdown["expert_parallel"] == pytest.approx(2 * 2 * (16e-3 - 4e-3))
    assert result.breakdown["kernel_launch"] == pytest.approx(2 * 2 * 4e-3)
    # without the host's share the exchanges stay exposed whole
    assert price(host_bound_graph(0.0, 0.0), 2).breakdown["expert_parallel"] == pytest.approx(2 * 2 * 16e-3)
