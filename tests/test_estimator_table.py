"""The estimate table, its cache, `prepopulate` and `layer_workload`."""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from estimator import EstimateTable, layer_workload, prepopulate, tc_gemm_cycles
from phaze_hardware import named_accelerator
from tests.test_estimator_graphs import gpt_graph

CHIP = named_accelerator("tpuv4_like")
MIB = 2**20


@pytest.fixture(scope="module")
def graph():
    return gpt_graph(layers=2, s=256, b=2, h=512, heads=8, t=2)


@pytest.fixture(scope="module")
def table(graph, tmp_path_factory) -> EstimateTable:
    return prepopulate([graph], cache_dir=tmp_path_factory.mktemp("cache"), progress=False)


def _shape_files(directory: Path) -> list[Path]:
    return sorted(directory.rglob("*.parquet"))


def test_prepopulate_covers_every_gemm_once_and_reuses_the_cache(graph, tmp_path):
    first = prepopulate([graph], cache_dir=tmp_path, progress=False)
    # per block: qkv, scores, context, proj, fc1, fc2 (+ the head's logits) forward; dX and dW backward;
    # identical blocks and directions share shapes
    assert first.computed == len(_shape_files(tmp_path)) > 6
    again = prepopulate([graph], cache_dir=tmp_path, progress=False)
    assert again.computed == 0
    shape = next(iter(first._gemms))
    assert np.array_equal(again.gemm(shape).cycles, first.gemm(shape).cycles)


def test_table_covers_the_candidates_and_their_single_cores(table):
    # every single-core version of a candidate's tensor cores is itself a candidate's (num_tc = 1 is
    # always admitted), so the table has exactly the 4,186 configurations of the space
    assert len(table.tc_cores) == len(set(table.tc_cores)) == 4186
    assert all(core.single() in table.tc_index for core in table.tc_cores)


def test_corrupted_cache_file_is_rebuilt_with_a_warning(graph, tmp_path, caplog):
    reference = prepopulate([graph], cache_dir=tmp_path, progress=False)
    victim = _shape_files(tmp_path)[0]
    victim.write_bytes(b"not a parquet file")
    rebuilt = prepopulate([graph], cache_dir=tmp_path, progress=False)
    assert [r.levelname for r in caplog.records] == ["WARNING"] and f"{victim} is damaged" in caplog.text
    assert rebuilt.computed == 1
    caplog.clear()
    clean = prepopulate([graph], cache_dir=tmp_path, progress=False)
    assert clean.computed == 0 and not caplog.records
    shape = tuple(int(x) for x in victim.stem.split("x"))
    assert np.array_equal(clean.gemm(shape).cycles, reference.gemm(shape).cycles)


def test_cache_file_of_another_shape_is_not_used(graph, tmp_path, caplog):
    prepopulate([graph], cache_dir=tmp_path, progress=False)
    first, second = _shape_files(tmp_path)[:2]
    first.write_bytes(second.read_bytes())  # a valid file, but for another GEMM
    assert prepopulate([graph], cache_dir=tmp_path, progress=False).computed == 1
    assert "does not match" in caplog.text


def _fill(directory: str) -> int:
    return prepopulate([gpt_graph(layers=1, t=2)], cache_dir=directory, progress=False).computed


def test_concurrent_writers_share_one_cache(tmp_path):
    with ProcessPoolExecutor(2) as pool:
        computed = list(pool.map(_fill, [str(tmp_path)] * 2))
    assert sum(computed) >= len(_shape_files(tmp_path)) > 0
    assert not list(tmp_path.rglob("*.tmp"))
    assert _fill(str(tmp_path)) == 0


def test_forward_layer_workload(graph, table):
    layer = layer_workload(graph, 1, "forward", CHIP, table)
    assert [op.core_type for op in layer.ops][:4] == ["VC", "collective", "TC", "TCandVC"]
    qkv = layer.ops[2]
    node = graph.nodes[qkv.members[0]]
    m, k, n = node.gemm.m, node.gemm.k, node.gemm.n
    assert qkv.latency == pytest.approx(tc_gemm_cycles(m, k, n, 1, 128, 128, 128 * MIB) / CHIP.clock_hz, rel=1e-12)
    assert qkv.parallel_latency == pytest.approx(tc_gemm_cycles(m, k, n, 8, 128, 128, 128 * MIB) / CHIP.clock_hz, rel=1e-12)
    assert qkv.parallel_latency < qkv.latency
    assert qkv.energy > 2.2e-12 * m * k * n
    # the leading layernorm of [256, 2, 512] on one VC of 128 lanes, then on both
    assert layer.ops[0].latency == pytest.approx(256 * 2 * 512 / 128 / CHIP.clock_hz)
    assert layer.ops[0].parallel_latency == pytest.approx(256 * 2 * 512 / 256 / CHIP.clock_hz)
    # collectives keep their place in the graph but take no core time: the training-step model
    # charges them on the cluster's links
    assert layer.ops[1].latency == 0.0
    proj_reduce = layer.ops[8]
    assert proj_reduce.core_type == "collective"
    assert proj_reduce.latency == proj_reduce.parallel_latency == 0.0


def test_fused_epilogue_overlaps_the_gemm(graph, table):
    layer = layer_workload(graph, 1, "forward", CHIP, table)
    scores = layer.ops[3]  # matmul + div + masked_fill: [2, 4, 256, 256] on one VC, 10 + 1 cycles per element
    node = graph.nodes[scores.members[0]]
    gemm = node.gemm
    tc = gemm.batch * tc_gemm_cycles(gemm.m, gemm.k, gemm.n, 1, 128, 128, 128 * MIB)
    vc = (10 + 1) * 2 * 4 * 256 * 256 / 128
    assert scores.latency == pytest.approx(max(tc, vc) / CHIP.clock_hz, rel=1e-12)


def test_backward_layer_reverses_order_and_costs_both_gradients(graph, table):
    forward = layer_workload(graph, 1, "forward", CHIP, table)
    backward = layer_workload(graph, 1, "backward", CHIP, table)
    assert [op.members for op in backward.ops] == [op.members for op in reversed(forward.ops)]
    last = len(forward.ops) - 1
    assert set(backward.edges) == {(last - b, last - a) for a, b in forward.edges}
    proj = backward.ops[last - 7]
    node = graph.nodes[proj.members[0]]
    m, k, n = node.gemm.m, node.gemm.k, node.gemm.n
    data, weight = (tc_gemm_cycles(*shape, 1, 128, 128, 128 * MIB) for shape in ((m, n, k), (k, m, n)))
    assert proj.latency == pytest.approx((data + weight) / CHIP.clock_hz, rel=1e-12)
    copy = backward.ops[last - 1]  # the copy's all-reduce of the gradient: in the graph, charged by the step model
    assert copy.core_type == "collective" and copy.latency == 0.0


def test_accelerator_outside_the_table(graph, table):
    big = named_accelerator("tpuv4_like", num_tc=16, tc_width=256, tc_depth=256)  # over the area budget
    layer = layer_workload(graph, 1, "forward", big, table)
    node = graph.nodes[layer.ops[2].members[0]]
    expected = tc_gemm_cycles(node.gemm.m, node.gemm.k, node.gemm.n, 16, 256, 256, 128 * MIB) / CHIP.clock_hz
    assert layer.ops[2].parallel_latency == pytest.approx(expected, rel=1e-12)


def test_other_technology_is_an_error(graph, table):
    with pytest.raises(ValueError, match="differ from the estimate table"):
        layer_workload(graph, 1, "forward", named_accelerator("tpuv4_like", clock_hz=2e9), table)


def test_bad_layer_and_direction_are_errors(graph, table):
    with pytest.raises(ValueError, match="layer: 9 is not a layer"):
        layer_workload(graph, 9, "forward", CHIP, table)
    with pytest.raises(ValueError, match="direction: must be"):
        layer_workload(graph, 1, "up", CHIP, table)


def test_bad_model_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="models: expected OpGraph"):
        prepopulate(["bertlarge"], cache_dir=tmp_path, progress=False)
