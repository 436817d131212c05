"""The placement search under the training-step model against brute force: every stage partition,
tensor-parallel width, data-parallel degree, recomputation mode and interleaved layout."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from graph_extract import KernelOptions
from phaze_hardware import Cluster
from solver.layout import Layout, allowed_virtual_stages, data_parallel_widths
from solver.placement.best import best_placement, fixed_megatron, state_space
from solver.placement.candidates import downset_space
from solver.placement.capped import place_capped
from solver.placement.layouts import interleaved, megatron_chunks
from solver.training_step import RECOMPUTE_MODES, Device, StepGraph, StepLayer, TrainingOptions, TrainingStep
from tests.test_placement_search import ordered_partitions


def random_graph(rng: random.Random, layers: int, width: int, chain: bool, scale: dict) -> StepGraph:
    """Embedding, blocks, head; small integers make ties common. `scale` holds the sizes shared by
    every width (a layer's parameters and activations shrink with the width)."""
    kinds = [False] + [True] * (layers - 2) + [False] if layers > 2 else [False] * layers
    edges = [(i, i + 1) for i in range(layers - 1)] if chain else []
    if not chain:  # a DAG: every edge forward, some layers side by side
        edges = sorted({(i, j) for i in range(layers) for j in range(i + 1, layers) if rng.random() < 0.4}
                       | {(i, i + 2) for i in range(layers - 2)})
    return StepGraph(width, tuple(
        StepLayer(id=i, forward=float(rng.randint(1, 4)) / width, backward=float(rng.randint(1, 8)) / width,
                  attention_core_forward=float(rng.randint(0, 1)) / width, parameters=scale["parameters"][i] / width,
                  activation_bytes=scale["activations"][i] / width, replicated_activation_bytes=scale["activations"][i] / 8,
                  attention_core_activation_bytes=scale["activations"][i] / 4 / width, input_bytes=2e6,
                  replicated_input_bytes=2e6, is_block=block,
                  forward_collective_bytes=(4e6,) * (width > 1), backward_collective_bytes=(4e6,) * (width > 1),
                  fused_attention_activation_bytes=scale["activations"][i] * 0.75 / width,
                  matrix_input_activation_bytes=scale["activations"][i] / 4 / width,
                  matrix_parameters=scale["parameters"][i] / 2 / width * block)
        for i, block in enumerate(kinds)), tuple((i, j, float(rng.randint(0, 3)) * 1e6) for i, j in edges),
        ((0, layers - 1, scale["tied"] / width),) if scale["tied"] and layers > 1 else ())


def random_steps(seed: int, layers: int, chain: bool = True) -> dict[str, dict[int, TrainingStep]]:
    """recompute mode -> width -> step model, on a random cluster of at most 64 devices."""
    rng = random.Random(seed)
    scale = {"parameters": [float(rng.randint(1, 6)) * 1e6 for _ in range(layers)],
             "activations": [float(rng.randint(1, 6)) * 1e6 for _ in range(layers)]}
    scale["tied"] = rng.choice([0.0, min(scale["parameters"][0], scale["parameters"][-1]) / 2])
    widths = rng.choice([(1,), (1, 2), (1, 2, 4)])
    graphs = {width: random_graph(random.Random(seed * 7 + width), layers, width, chain, scale) for width in widths}
    devices = rng.choice([4, 8, 16, 32, 64])
    node = rng.choice([d for d in (1, 2, 4, 8) if devices % d == 0])
    tiers = [dict(bandwidth=float(rng.choice([1e9, 5e9])), latency=1e-4, efficiency=0.8),
             dict(bandwidth=float(rng.choice([1e8, 5e8])), latency=1e-3, efficiency=0.9)]
    cluster = Cluster.build("random", devices, node, tiers if node < devices else tiers[:1])
    optimizer, sharded, sequence_parallel = rng.choice(["adam", "sgd"]), rng.random() < 0.5, rng.random() < 0.5
    training = TrainingOptions(optimizer, "optimizer" if sharded else "none", rng.random() < 0.25)
    kernels = KernelOptions(sequence_parallel, rng.random() < 0.5, rng.choice(["bf16", "fp8"]))
    device = Device(float(rng.randint(20, 200)) * 1e6, 1e11)
    batches = rng.choice([1, 2, 4, 6, 8, 12, 16])
    return {mode: {width: TrainingStep(graph, cluster, training, kernels, device, batches, mode, Layout(width))
                   for width, graph in graphs.items() if width <= devices}
            for mode in RECOMPUTE_MODES}


def partitions(step: TrainingStep):
    """Every ordered split of the layers into convex stages (as position tuples)."""
    n = step.graph.n
    predecessors = [sum(1 << u for u, _ in step.graph.in_edges[v]) for v in range(n)]
    for masks in ordered_partitions(predecessors, (1 << n) - 1):
        yield tuple(tuple(v for v in range(n) if mask >> v & 1) for mask in masks)


def brute_force(step: TrainingStep, interleaving: bool) -> float:
    """The least feasible time per batch over every placement the search may return."""
    best = math.inf
    options = data_parallel_widths(step.fit_rules(), step.shard)
    layouts = [(stages, 1) for stages in partitions(step)]
    if interleaving:
        blocks = sum(layer.is_block for layer in step.graph.layers)
        layouts += [(chunks, v) for v in allowed_virtual_stages(blocks)[1:] for p in range(2, blocks // v + 1)
                    if (chunks := megatron_chunks(step.graph, p, v))]
    for chunks, v in layouts:
        if not options:
            break
        members = np.zeros((step.graph.n, len(chunks)), dtype=bool)
        for index, chunk in enumerate(chunks):
            members[list(chunk), index] = True
        scored = step.score(step.stage_terms(members), [step.layout(len(chunks) // v, d, v) for d in options])
        allowed = scored["fits"] & (np.ones(len(options), bool) if v == 1 else
                                    np.array([(step.micro_batches // d) % (len(chunks) // v) == 0 for d in options]))
        if allowed.any():
            best = min(best, float(scored["time"][allowed].min()))
    return best


@pytest.mark.parametrize("seed", range(40))
def test_dp_equals_brute_force_on_small_chains(seed):
    rng = random.Random(seed)
    for mode, steps in random_steps(seed, rng.randint(1, 8)).items():
        for width, step in steps.items():
            found = place_capped(step, state_space(step))
            expected = brute_force(step, interleaving=False)
            assert (found[1].time_per_batch if found else math.inf) == pytest.approx(expected, rel=1e-12), (mode, width)
            if found:  # the DP's placement is a real one, scored as reported
                assert found[1].feasible and step.price(found[0]) == found[1]


@pytest.mark.parametrize("seed", range(20))
def test_search_over_widths_and_interleaving_equals_brute_force(seed):
    rng = random.Random(100 + seed)
    for mode, steps in random_steps(100 + seed, rng.randint(4, 9)).items():
        result = best_placement([steps[width] for width in sorted(steps)])
        expected = min(brute_force(step, interleaving=True) for step in steps.values())
        assert result.time_per_batch == pytest.approx(expected, rel=1e-12), mode
        if result.feasible:
            assert sum(result.breakdown.values()) == pytest.approx(result.time_per_batch, rel=1e-12)
            layers = sorted(layer for stage in result.stages for layer in stage.layer_ids)
            assert layers == sorted(next(iter(steps.values())).graph.ids)


@pytest.mark.parametrize("seed", range(3))
def test_dp_equals_brute_force_on_twelve_layers(seed):
    steps = random_steps(200 + seed, 12)
    for mode in ("none", "full"):
        step = steps[mode][1]
        found = place_capped(step, state_space(step))
        assert (found[1].time_per_batch if found else math.inf) == pytest.approx(brute_force(step, False), rel=1e-12)


@pytest.mark.parametrize("seed", range(15))
def test_dp_equals_brute_force_on_branching_graphs(seed):
    rng = random.Random(300 + seed)
    for mode, steps in random_steps(300 + seed, rng.randint(3, 7), chain=False).items():
        for step in steps.values():
            found = place_capped(step, downset_space(step.graph))
            expected = brute_force(step, interleaving=False)
            assert (found[1].time_per_batch if found else math.inf) == pytest.approx(expected, rel=1e-12), mode


def test_interleaving_is_searched_and_bounded():
    steps = random_steps(7, 10)["none"]
    step = steps[max(steps)]
    space = state_space(step)
    found = interleaved(step, step.stage_terms(space.members), None, math.inf)
    assert found is None or found[0].layout.virtual_stages > 1
    if found:
        assert interleaved(step, step.stage_terms(space.members), None, found[1].time_per_batch) is None


def test_fixed_megatron_layout():
    step = random_steps(3, 6)["none"][1]  # 4 blocks between the embedding and the head
    result, reason = fixed_megatron(step, Layout(1, 2, 1))
    assert reason is None or reason.startswith("memory")
    if result is not None:
        assert [stage.layer_ids for stage in result.stages] == [(0, 1, 2), (3, 4, 5)]
    assert fixed_megatron(step, Layout(1, 3, 1)) == (
        None, "the blocks of the model do not split evenly into 3 pipeline stages")
