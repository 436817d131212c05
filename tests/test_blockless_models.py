"""A user's model without a list of repeated blocks (`graph_extract.operator_layers`): an embedding,
two MLP towers of different depths on its output, their sum, the logits and a per-token loss. Its
operators are cut into layers by `graph_extract.operator_cuts`, and the placement search puts them
on pipeline stages: by hand against a brute force over every way of cutting the layer graph into
stages, and end to end through `phaze run_solver`."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from graph_extract import KernelOptions, extract
from graph_extract.factory import factory_spec
from graph_extract.operator_layers import OPERATOR_LAYERS
from phaze_hardware import Cluster
from solver.layout import Layout
from solver.placement.best import state_space
from solver.placement.capped import place_capped
from solver.training_step import Device, StepGraph, StepLayer, TrainingOptions, TrainingStep
from tests import test_placement_training as training
from tests.test_placement_training import brute_force, partitions

REPOSITORY = Path(__file__).resolve().parents[1]

TOWERS = '''
from torch import nn


class Towers(nn.Module):
    def __init__(self, vocab, hidden, left, right):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.left = nn.Sequential(*[m for _ in range(left) for m in (nn.Linear(hidden, hidden), nn.ReLU())])
        self.right = nn.Sequential(*[m for _ in range(right) for m in (
            nn.Linear(hidden, 2 * hidden), nn.ReLU(), nn.Linear(2 * hidden, hidden))])
        self.out = nn.Linear(hidden, vocab, bias=False)

    def forward(self, input_ids, labels):
        x = self.embed(input_ids)
        logits = self.out(self.left(x) + self.right(x))
        shifted = logits - logits.amax(dim=-1).unsqueeze(-1)
        return shifted.exp().sum(dim=-1).log() - shifted.gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def tiny(sequence_length: int = 16):
    return Towers(vocab=64, hidden=4096, left=3, right=1)


def wide(sequence_length: int = 64):
    return Towers(vocab=1024, hidden=1024, left=4, right=2)


class Line(nn.Module):
    def __init__(self, depth):
        super().__init__()
        self.embed = nn.Embedding(64, 256)
        self.body = nn.Sequential(*[m for _ in range(depth) for m in (nn.Linear(256, 256), nn.GELU())])

    def forward(self, input_ids):
        return self.body(self.embed(input_ids)).sum(dim=-1)


def line(sequence_length: int = 16):
    return Line(5)
'''


def parameters(vocab: int, hidden: int, left: int, right: int) -> int:
    """Embedding V·h; each left layer h·h + h; each right pair h·2h + 2h and 2h·h + h; logits V·h."""
    return vocab * hidden + left * (hidden * hidden + hidden) + right * (4 * hidden * hidden + 3 * hidden) + vocab * hidden


def units(left: int, right: int) -> int:
    """Units of the operators (`graph_extract.operator_units`), counted by hand: each weight product
    (the free operators reading only it follow it: ReLU, amax, unsqueeze); the embedding (its free
    all-reduce follows); the sum of the towers, the two subtractions and the gather (each reads two
    operators); the labels' unsqueeze (reads no operator): left + 2·right + 1 (logits) + 1 + 4 + 1."""
    return left + 2 * right + 7


@pytest.fixture(scope="module")
def towers(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("towers") / "towers.py"
    path.write_text(TOWERS)
    return path


def reachable(successors: list[set[int]], start: set[int]) -> set[int]:
    seen, stack = set(start), list(start)
    while stack:
        for dest in successors[stack.pop()]:
            if dest not in seen:
                seen.add(dest)
                stack.append(dest)
    return seen


def test_a_model_without_blocks_has_its_operators_cut_into_convex_layers(towers):
    """num_layers 6 < 12 units: 6 layers, each convex (nothing reachable from a layer's operators
    through another layer's comes back to it), every operator in one, none a block; the parameters
    are the closed form's; the spec asks for OPERATOR_LAYERS groups and one head (width 1 only)."""
    spec = factory_spec(f"{towers}:tiny")
    assert (spec.num_layers, spec.num_heads) == (OPERATOR_LAYERS, 1)
    assert units(3, 1) < OPERATOR_LAYERS
    full = extract(spec, 1)
    assert len(full.layer_graph.layers) == units(3, 1)  # fewer units than groups asked for: one layer each
    extracted = extract(spec.with_overrides(num_layers=6), 1)
    graph, layer_graph = extracted.op_graph, extracted.layer_graph
    assert [layer.id for layer in layer_graph.layers] == list(range(6))
    assert {layer.kind for layer in layer_graph.layers} == {"operators"}
    assert not any(layer.is_block for layer in layer_graph.layers)
    assert extracted.parameter_count == parameters(64, 4096, 3, 1)
    assert sum(layer.parameter_bytes for layer in layer_graph.layers) == 2 * parameters(64, 4096, 3, 1)
    successors = [set() for _ in graph.nodes]
    for source, dest in graph.edges:
        successors[source].add(dest)
    for layer in range(6):
        inside = {node.id for node in graph.nodes if node.layer == layer}
        assert inside
        outside = reachable(successors, {dest for node in inside for dest in successors[node]} - inside) - inside
        assert not reachable(successors, outside) & inside, layer
    assert sum(layer.forward_flops for layer in layer_graph.layers) == sum(node.flops for node in graph.nodes)


def test_a_straight_line_module_is_a_chain_of_its_units(towers):
    """Embedding, 5 x (Linear, GELU), a sum: the embedding and each Linear (its GELU and the sum
    follow it) are the 6 units, under OPERATOR_LAYERS: 6 layers in a chain, each of one unit."""
    extracted = extract(factory_spec(f"{towers}:line"), 2)
    layer_graph = extracted.layer_graph
    assert [layer.id for layer in layer_graph.layers] == list(range(6))
    assert sorted((edge.source, edge.dest) for edge in layer_graph.edges) == [(k, k + 1) for k in range(5)]
    assert [layer.forward_flops for layer in layer_graph.layers] == [0] + [2 * 2 * 16 * 256 * 256] * 5
    assert extracted.parameter_count == 64 * 256 + 5 * (256 * 256 + 256)


def step_graph(layer_graph, flops_per_second: float) -> StepGraph:
    """The layers as a device runs them: forward FLOPs at `flops_per_second`, the backward twice it."""
    return StepGraph(1, tuple(
        StepLayer(id=layer.id, forward=layer.forward_flops / flops_per_second,
                  backward=2 * layer.forward_flops / flops_per_second, attention_core_forward=0.0,
                  parameters=layer.parameter_bytes / 2, activation_bytes=layer.activation_bytes,
                  replicated_activation_bytes=layer.replicated_activation_bytes, input_bytes=layer.input_bytes,
                  replicated_input_bytes=layer.replicated_input_bytes, is_block=layer.is_block,
                  fused_attention_activation_bytes=layer.fused_attention_activation_bytes,
                  matrix_input_activation_bytes=layer.matrix_input_activation_bytes,
                  matrix_parameters=layer.matrix_parameter_bytes / 2)
        for layer in layer_graph.layers), tuple((edge.source, edge.dest, float(edge.bytes)) for edge in layer_graph.edges))


def test_the_placement_search_finds_the_brute_force_four_stage_cut(towers, monkeypatch):
    """The model's 12 units as 12 operator layers (OPERATOR_LAYERS asks for more) on four devices
    whose memory holds under half the weights' training state (bf16 weights, fp32 gradients, Adam:
    2 + 4 + 12 = 18 bytes a parameter; no sharding, no framework reserve), so that no pipeline of 1
    or 2 stages fits (its largest stage holds at least half). The search's placement has 4 stages
    and the least time per batch over every cut of the branching layer graph into at most 4 stages
    (more cannot run on 4 devices), each priced by the search's own stage terms
    (`tests.test_placement_training.brute_force`)."""
    extracted = extract(factory_spec(f"{towers}:tiny"), 1)
    graph = step_graph(extracted.layer_graph, 1e12)
    assert graph.n == units(3, 1) and not graph.is_chain()  # the two towers side by side
    total = parameters(64, 4096, 3, 1)
    cluster = Cluster.build("four", 4, 4, [dict(bandwidth=1e9, latency=1e-6, efficiency=1.0)])
    step = TrainingStep(graph, cluster, TrainingOptions("adam", "none", False, framework_reserve=0.0),
                        KernelOptions(False, False, "bf16"), Device(memory_capacity=18 * total * 0.49,
                                                                    hbm_bandwidth=1e12), 8, "none", Layout(1))
    found = place_capped(step, state_space(step))
    assert found is not None
    placement, result = found
    assert placement.layout.pipeline_parallel_width == 4 and len(placement.chunks) == 4
    assert sorted(layer for chunk in placement.chunks for layer in chunk) == list(range(graph.n))
    cuts = [stages for stages in partitions(step) if len(stages) <= 4]
    monkeypatch.setattr(training, "partitions", lambda _: cuts)
    assert result.time_per_batch == pytest.approx(brute_force(step, interleaving=False), rel=1e-12)
    monkeypatch.setattr(training, "partitions", lambda _: [stages for stages in cuts if len(stages) == 4])
    assert result.time_per_batch == pytest.approx(brute_force(step, interleaving=False), rel=1e-12)
    monkeypatch.setattr(training, "partitions", lambda _: [stages for stages in cuts if len(stages) <= 2])
    assert brute_force(step, interleaving=False) == math.inf  # 1 or 2 stages: none fits


@pytest.mark.slow
def test_run_solver_places_a_branching_model_without_blocks_on_four_stages(towers, tmp_path):
    """`wide`: 14.7 M parameters, 18 bytes each in training (bf16 weights, fp32 gradients, Adam; no
    sharding): 265 MB, so a stage of a 2-stage pipeline holds at least 132 MB > 0.1 GiB; on four
    H100s the search's only fitting pipelines have 4 stages. Its stages hold every operator layer once
    and the closed form's parameters."""
    environment = {**os.environ, "PYTHONPATH": str(REPOSITORY)}
    total = parameters(1024, 1024, 4, 2)
    assert 18 * total / 2 > 0.1 * 2**30
    run = subprocess.run(
        [sys.executable, "-m", "phaze", "run_solver", "model=custom", f"model.config={towers}:wide", "chip=h100_sxm",
         "system=dgx_h100", "system.node_size=4", "num_devices=4", "global_batch_size=8", "hbm_size=0.1",
         "framework_reserve_gb=0", "data_parallel_sharding=none", f"cache_dir={tmp_path / 'cache'}",
         f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=tmp_path, capture_output=True, text=True, env=environment)
    assert run.returncode == 0, run.stderr
    placement = json.loads((tmp_path / "run" / "best.json").read_text())["placement"]
    assert (placement["pipeline_parallel_width"], placement["data_parallel_width"]) == (4, 1)
    assert len(placement["stages"]) == 4
    layers = sorted(layer for stage in placement["stages"] for layer in stage["layers"])
    assert layers == list(range(min(OPERATOR_LAYERS, units(4, 2))))
    assert sum(stage["parameters"] for stage in placement["stages"]) == total
