"""TPUs as template chips: their presets, the feed of a systolic array, the fitted tensor-core
efficiency, slices joined by the data-centre network, and MaxText's runs as validate reads them."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from phaze_common.checks import InputError
from estimator import tc_gemm_cycles
from estimator.workload import default_table, layer_workload
from graph_extract import KernelOptions, ModelSpec, extract
from phaze_hardware import KNOWN_CHIPS, SYSTEMS, named_accelerator
from phaze_hardware.cluster import Group
from phaze.validation.cases import case
from phaze.validation.flops import maxtext_model_flops

RUNS = {run["run_id"]: run for run in json.loads(
    (Path(__file__).resolve().parents[1] / "arch_configs" / "calibration" / "runs.json").read_text())}


@pytest.mark.parametrize("chip, peak", [("tpuv4", 275e12), ("tpuv5e", 197e12), ("tpuv5p", 459e12)])
def test_each_tpu_template_has_its_chips_peak(chip, peak):
    template = KNOWN_CHIPS[chip].template
    macs_per_second = template.num_tc * template.tc_width * template.tc_depth * template.clock_hz
    assert 2 * macs_per_second == pytest.approx(peak, rel=0.005)
    assert KNOWN_CHIPS[chip].peak_flops == peak


def test_a_systolic_arrays_feed_lets_a_large_gemm_reach_the_mxus_peak():
    # 8192^3 on 8 MXUs of 128 x 128: 8192^3 / (8 * 16384) cycles at the peak. Fed 2 x 128 words a
    # cycle per MXU it runs at the peak; at the original's 64 words a cycle it cannot pass
    # 64 / (reads per MAC) — about 0.69 of it.
    ideal = 8192**3 / (8 * 128 * 128)
    tpu = KNOWN_CHIPS["tpuv4"].template
    fed = tc_gemm_cycles(8192, 8192, 8192, 8, 128, 128, tpu.glb_bytes, dataclasses.replace(tpu, tensor_core_efficiency=1.0))
    original = tc_gemm_cycles(8192, 8192, 8192, 8, 128, 128, tpu.glb_bytes, named_accelerator("tpuv4_like"))
    assert fed == pytest.approx(ideal, rel=1e-9)
    assert 0.6 < ideal / original < 0.75


def test_the_tensor_core_efficiency_divides_a_matrix_products_time(tmp_path):
    spec = ModelSpec("tiny", 2, 256, 4, 1024, 1000, 128, 128, norm="rmsnorm", activation="relu",
                     position_embedding="rotary", bias=False, dropout=0.0)
    graph = extract(spec, 4, 128, 1, cache_dir=tmp_path).op_graph
    times = {}
    for efficiency in (1.0, 0.5):
        template = dataclasses.replace(KNOWN_CHIPS["tpuv5e"].template, tensor_core_efficiency=efficiency)
        layer = layer_workload(graph, 1, "forward", template, default_table(template, tmp_path),
                               KernelOptions(False, True))
        times[efficiency] = {op.members: (op.core_type, op.parallel_latency) for op in layer.ops}
    products = [members for members, (kind, _) in times[1.0].items() if kind == "TC"]
    assert products
    for members in products:  # TC-bound: twice the time at half the efficiency
        assert times[0.5][members][1] == pytest.approx(2 * times[1.0][members][1], rel=1e-12)
    vector = [members for members, (kind, _) in times[1.0].items() if kind == "VC"]
    assert vector and all(times[0.5][m][1] == times[1.0][m][1] for m in vector)
    with pytest.raises(InputError, match=r"accelerator.tensor_core_efficiency: must be in \(0, 1\]"):
        dataclasses.replace(KNOWN_CHIPS["tpuv5e"].template, tensor_core_efficiency=1.2)


def test_slices_are_joined_by_the_data_centre_network():
    cluster = SYSTEMS["tpuv5e_pod"].cluster(512, 2)
    assert [(tier.name, tier.devices) for tier in cluster.tiers] == [("ici_x", 16), ("ici_y", 256), ("dcn", 512)]
    # the two replicas of a hybrid-sharded gradient shard, one per slice (256 ranks apart): a ring of
    # 2 on the DCN, 3.125 GB/s x 0.8 per chip, 10 us a step
    size = 1e9
    expected = 2 * (1 / 2) * size / (3.125e9 * 0.8) + 2 * 1e-5
    assert cluster.all_reduce(Group(2, 256)).scalar(size) == pytest.approx(expected, rel=1e-12)
    # 256 ranks of one slice stay on the ICI (its 16 x 16 torus: both axes)
    assert cluster.tier_joining(Group(256, 1)) == 1
    with pytest.raises(InputError, match="system.slices: 3 must split num_devices=512"):
        SYSTEMS["tpuv5e_pod"].cluster(512, 3)


def test_maxtexts_flop_count_by_hand():
    # MaxText 22B (48 layers, h 6144, 24 heads of 256, MLP 24,576, vocabulary 32,768, tied embedding)
    spec = ModelSpec("m", 48, 6144, 24, 24576, 32768, 2048, 2048, kv_channels=256)
    # MaxText's count: one norm per parallel block, a norm each on q, k and v (3 x 256)
    parameters = 48 * (4 * 6144 * 6144 + 2 * 6144 * 24576 + 6144 + 3 * 256) + 32768 * 6144 + 6144
    assert parameters == pytest.approx(21.9e9, rel=0.005)  # "22B"
    batch, sequence = 1024, 2048
    attention = 12 * 48 * 24 * 256 * sequence**2 * batch
    for share in (0.0, 0.5, 1.0):  # v4's tables counted none of it, v5p's half, v5e's all
        assert maxtext_model_flops(spec, batch, sequence, share) == pytest.approx(
            6 * parameters * batch * sequence + share * attention, rel=1e-12)


def test_a_maxtext_run_as_validate_reads_it():
    v4 = case(RUNS["maxtext_v4_22B_2x128"])  # 2 x v4-128: 128 chips, FSDP 64 in each slice
    assert (v4.chip, v4.system, v4.devices, v4.width, v4.degree, v4.slices) == ("tpuv4", "tpuv4_pod", 128, 1, 128, 2)
    assert v4.training.data_parallel_sharding == "full" and v4.training.data_parallel_shard_width == 64
    assert (v4.micro_batch_size, v4.global_batch_size, v4.recompute) == (16, 2048, "full")
    spec = v4.spec
    assert (spec.activation, spec.norm, spec.tied_lm_head, spec.dropout) == ("relu", "rmsnorm", True, 0.0)
    assert v4.measured == pytest.approx(6 * 21.9e9 * 2048 * 2048 / (152e12 * 128), rel=0.005)
    v5p = case(RUNS["maxtext_v5p_32B_1x128"])  # t 4: a tensor group runs 4 chips' 8 sequences at once
    # remat_policy minimal: JAX's checkpoint_dots_with_no_batch_dims
    assert (v5p.width, v5p.degree, v5p.micro_batch_size, v5p.slices, v5p.recompute) == (4, 16, 32, 1,
                                                                                          "product_outputs")
    assert v5p.training.tensor_parallel_overlap and v5p.sequence_parallel
    assert v5p.training.data_parallel_shard_width is None
