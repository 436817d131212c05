"""Activation offload to host memory (`TrainingOptions.activation_offload`): the blocks' kept bytes
leave HBM, the copies are exposed beyond each pass's compute, bad values are refused, the records
stay as they were when it is off, and the calibration runs that offload are predicted with it."""

import pytest

from graph_extract import KernelOptions, get_spec
from phaze_common.checks import InputError
from phaze_hardware import Cluster, known_chip
from phaze.validation.cases import Case, case
from phaze.validation.runs import read_runs
from solver.layout import Layout
from solver.question import Question
from solver.training_step import Device, Placement, StepGraph, StepLayer, TrainingOptions, TrainingStep
from solver.training_step.offload import offload_seconds

RUNS = {run["run_id"]: run for run in read_runs("arch_configs/calibration/runs.json")}
# 8 equal blocks, each 1 s forward and 2 s backward, keeping 1 MB a micro-batch; 2 stages of 4, one
# replica: m = 8 micro-batches, stage 0 holds min(p − 0, m) = 2 of them, stage 1 one (1F1B)
BLOCKS, KEPT = 8, 1e6
PLACEMENT = Placement(Layout(1, 2, 1), ((0, 1, 2, 3), (4, 5, 6, 7)))


def step(offload: str = "none", host_link_bandwidth: float | None = None) -> TrainingStep:
    layers = tuple(StepLayer(id=i, forward=1.0, backward=2.0, attention_core_forward=0.0, parameters=1e6,
                             activation_bytes=KEPT, is_block=True) for i in range(BLOCKS))
    graph = StepGraph(1, layers, tuple((i, i + 1, 1e6) for i in range(BLOCKS - 1)))
    cluster = Cluster.build("flat", 8, 8, [dict(bandwidth=1e9)])
    return TrainingStep(graph, cluster, TrainingOptions(activation_offload=offload), KernelOptions(),
                        Device(1e12, 1e12, host_link_bandwidth), 8, "none", Layout(1))


def test_the_blocks_kept_bytes_leave_hbm_but_two_blocks():
    """Without offload stage 0 holds 2 micro-batches × 4 blocks × 1 MB = 8 MB, stage 1 1 × 4 × 1 MB =
    4 MB; with it each holds the running block and the one in transfer: 2 × 1 MB = 2 MB."""
    kept = [device["activations"] for device in step().price(PLACEMENT).memory]
    offloaded = [device["activations"] for device in step("layers", 1e9).price(PLACEMENT).memory]
    assert kept == [8e6, 4e6]
    assert offloaded == [2e6, 2e6]


def test_a_transfer_longer_than_the_forward_is_exposed_by_the_excess():
    """Each stage copies 4 blocks × 1 MB = 4 MB a micro-batch each way. At 4 MB / 6 s a copy takes
    6 s: out behind a 4 × 1 s = 4 s forward, 2 s exposed; in behind a 4 × 2 s = 8 s backward, hidden.
    8 micro-batches: 16 s exposed, 8 × (6 + 6 − 2) = 80 s hidden; the step is (m + p − 1) × 2 s =
    9 × 2 = 18 s longer than without offload."""
    bandwidth = 4e6 / 6.0
    assert offload_seconds(4e6, 4.0, 8.0, bandwidth)[0] == pytest.approx(2.0, rel=1e-12)
    plain, slow = step().price(PLACEMENT), step("layers", bandwidth).price(PLACEMENT)
    assert slow.breakdown["activation_offload"] == pytest.approx(16.0, rel=1e-12)
    assert slow.hidden["activation_offload"] == pytest.approx(80.0, rel=1e-12)
    assert slow.time_per_batch - plain.time_per_batch == pytest.approx(18.0, rel=1e-9)
    assert sum(slow.breakdown.values()) == pytest.approx(slow.time_per_batch, rel=1e-12)


def test_a_transfer_within_each_pass_hides():
    """At 1 MB/s the 4 MB copy takes 4 s: no longer than the 4 s forward nor the 8 s backward, so
    nothing is exposed, 8 × 8 s = 64 s hidden, and the time is that without offload."""
    plain, fast = step().price(PLACEMENT), step("layers", 1e6).price(PLACEMENT)
    assert fast.breakdown["activation_offload"] == 0.0
    assert fast.hidden["activation_offload"] == pytest.approx(64.0, rel=1e-12)
    assert fast.time_per_batch == pytest.approx(plain.time_per_batch, rel=1e-12)


def test_bad_values_are_refused_in_one_line():
    with pytest.raises(InputError, match=r"^activation_offload: unknown 'layer'; allowed: none, layers$"):
        TrainingOptions(activation_offload="layer")
    cluster = Cluster.build("flat", 8, 8, [dict(bandwidth=1e9)])
    with pytest.raises(InputError, match=r"^activation_offload: needs a chip stating host_link_bandwidth .*allowed "
                                         r"here: none$"):
        Question(get_spec("megatrongpt3"), 128, 8, cluster, TrainingOptions(activation_offload="layers"))


def test_records_stay_as_they_were_when_off():
    assert "activation_offload" not in TrainingOptions().record()
    assert TrainingOptions(activation_offload="layers").record()["activation_offload"] == "layers"


def test_host_links_per_direction():
    """PCIe Gen5 x16: 32 GT/s × 16 lanes ≈ 64 GB/s a direction; Gen4 half; NVLink-C2C 900 GB/s both
    directions: 450 GB/s a direction."""
    assert known_chip("h100_sxm").host_link_bandwidth == 64e9
    assert known_chip("a100_80gb").host_link_bandwidth == 32e9
    assert known_chip("gb200").host_link_bandwidth == 900e9 / 2


def test_runs_that_offload_are_predicted_with_it():
    gb200 = case(RUNS["mbridge2602_LLAMA3_70B_gb200_64gpu_fp8cs"])
    assert isinstance(gb200, Case) and gb200.training.activation_offload == "layers" and gb200.recompute == "none"
    # MaxText's remat_policy custom: the layer's input offloaded, the rest recomputed: full
    maxtext = case(RUNS["tpurecipes_llama3.1_405b_v5p_1024"])
    assert isinstance(maxtext, Case) and maxtext.training.activation_offload == "layers" and maxtext.recompute == "full"
