"""The estimator on graphs of the real extractor: every zoo model's operators are known, fusion keeps
all the work, and prepopulate + estimate run end to end (what `phaze prepopulate_estimates` does)."""

from __future__ import annotations

import pytest

import graph_extract
from estimator import estimate, fuse_layers, prepopulate
from estimator.work import DIRECTIONS
from estimator.workload import fused_work

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("model", sorted(graph_extract.MODELS))
def test_every_operator_of_the_zoo_is_costed(model, tmp_path):
    width = max(graph_extract.valid_tensor_parallel_widths(model, 8))
    extracted = graph_extract.extract(model, micro_batch_size=1, tensor_parallel_width=width, cache_dir=tmp_path)
    graph = extracted.op_graph
    representatives = tuple(group[0] for group in extracted.repeat_groups)
    for fused in fuse_layers(graph, representatives):
        layer_macs = sum(node.gemm.macs for node in graph.layer_nodes(fused.layer) if node.gemm)
        members = sorted(m for op in fused.ops for m in op.members)
        costly = [node.id for node in graph.layer_nodes(fused.layer) if node.kind not in ("shape", "embedding", "index")]
        assert members == costly  # every costly operator in exactly one fused operator
        forward, backward = ([fused_work(graph, op, direction) for op in fused.ops] for direction in DIRECTIONS)
        assert sum(work.macs for work in forward) == layer_macs
        assert sum(work.macs for work in backward) == 2 * layer_macs


def test_prepopulate_and_estimate_bertlarge(tmp_path):
    models = [graph_extract.extract("bertlarge", micro_batch_size=1, cache_dir=tmp_path / "graphs")]
    table = prepopulate(models, cache_dir=tmp_path / "estimates", progress=False)
    assert table.computed == len(table.gemm_shapes) > 0
    assert prepopulate(models, cache_dir=tmp_path / "estimates", progress=False).computed == 0
    layers = estimate(models[0], table=table)
    assert {direction for _, direction in layers} == set(DIRECTIONS)
    block = layers[(1, "forward")]
    assert {op.core_type for op in block.ops} == {"TC", "TCandVC", "VC", "collective"}
    assert all(op.parallel_latency <= op.latency for op in block.ops)
    assert sum(op.latency for op in layers[(1, "backward")].ops) > sum(op.latency for op in block.ops) > 0
