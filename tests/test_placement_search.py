"""The original's placement DP against brute force on random small DAGs, chain path == general
path, and the DP table against its recurrence (the training step's DP:
tests/test_placement_training.py)."""

from __future__ import annotations

import functools
import math
import random

import numpy as np
import pytest

from solver.placement import PlacementEdge, PlacementGraph, PlacementLayer, PlacementSettings, place_original
from solver.placement.candidates import DeviceModel, chain_space, downset_space
from solver.placement.dp import INFTY, StageTable, fill_tables
from solver.placement.first_stage import candidates, place
from solver.placement.layer_graph import topological_order, width_graph
from solver.training_step.original import stage_cost, stage_costs


def random_graphs(rng: random.Random, layers: int, chain: bool) -> dict[int, PlacementGraph]:
    """Same layers and edges at every width, random per-width costs; integers make ties common."""
    ids = rng.sample(range(-1, 40), layers)
    pairs = [(ids[i], ids[j]) for i in range(layers) for j in range(i + 1, layers) if rng.random() < 0.35]
    if chain:
        pairs = sorted(set(pairs) | {(ids[i], ids[i + 1]) for i in range(layers - 1)})
    rng.shuffle(pairs)
    widths = rng.choice([(1,), (1, 2), (1, 2, 4), (2, 3)])
    graphs = {}
    for width in widths:
        layer_list = [
            PlacementLayer(
                layer_id,
                float(rng.randint(0, 6)),
                float(rng.randint(0, 6)),
                float(rng.randint(0, 4)),
                float(rng.randint(0, 6)),
                width > 1 and rng.random() < 0.7,
            )
            for layer_id in ids
        ]
        rng.shuffle(layer_list)
        edges = tuple(PlacementEdge(source, dest, float(rng.randint(0, 5))) for source, dest in pairs)
        graphs[width] = PlacementGraph(tuple(layer_list), edges)
    return graphs


def random_settings(rng: random.Random) -> PlacementSettings:
    return PlacementSettings(
        devices=rng.randint(1, 40),
        memory_per_device=float(rng.randint(12, 100)),
        bandwidth=rng.choice([0.5, 1.0, 4.0]),
        micro_batches_per_batch=rng.randint(1, 30),
        activation_recomputation=rng.random() < 0.5,
        optimizer=rng.choice(["SGD", "Adam"]),
    )


def ordered_partitions(predecessors: list[int], remaining: int):
    """All sequences of stages (bitmasks) covering `remaining` with every edge pointing forward."""
    if remaining == 0:
        yield []
        return
    subset = remaining
    while subset:
        # the first stage must hold every remaining predecessor of its layers
        if all(predecessors[v] & remaining & ~subset == 0 for v in range(len(predecessors)) if subset >> v & 1):
            for rest in ordered_partitions(predecessors, remaining & ~subset):
                yield [subset, *rest]
        subset = (subset - 1) & remaining


def partition_time(costs: list, data_parallel_width: int, settings: PlacementSettings) -> float:
    """Time per batch of stages with the given costs, straight from the 1F1B formula (∞ if it does not fit)."""
    depth = len(costs)
    if sum(cost.devices for cost in costs) * data_parallel_width > settings.devices:
        return math.inf
    if any(depth - index > cost.max_in_flight for index, cost in enumerate(costs)):
        return math.inf
    max_load = max(cost.load_inner if depth - index > 1 else cost.load_last for index, cost in enumerate(costs))
    sync = costs[0].parameter_bytes
    micro_batches = -(-settings.micro_batches_per_batch // data_parallel_width)
    degree = data_parallel_width
    return max_load * float(micro_batches + depth - 1) + (((4.0 * (degree - 1)) * sync) / settings.bandwidth) / degree


def brute_force(graphs: dict[int, PlacementGraph], settings: PlacementSettings) -> float:
    """Least time per batch over every width, ordered stage partition and data-parallel degree."""
    order = topological_order(graphs[min(graphs)])
    best = math.inf
    for width in graphs:
        graph = width_graph(graphs[width], width, order)
        predecessors = [sum(1 << u for u, _ in graph.in_edges[v]) for v in range(graph.n)]
        subsets = range(1 << graph.n)
        costs = stage_costs(graph, [[v for v in range(graph.n) if mask >> v & 1] for mask in subsets], settings)
        for partition in ordered_partitions(predecessors, (1 << graph.n) - 1):
            for degree in range(1, min(settings.devices, settings.micro_batches_per_batch) + 1):
                best = min(best, partition_time([costs[mask] for mask in partition], degree, settings))
    return best


@pytest.mark.parametrize("seed", range(60))
def test_dp_equals_brute_force_on_small_dags(seed):
    rng = random.Random(seed)
    graphs = random_graphs(rng, rng.randint(2, 7), chain=seed % 4 == 0)
    settings = random_settings(rng)
    result = place_original(graphs, settings)
    assert result.time_per_batch == brute_force(graphs, settings)
    if result.feasible:
        # the stages returned really achieve the reported time
        width = result.layout.tensor_parallel_width
        order = topological_order(graphs[min(graphs)])
        graph = width_graph(graphs[width], width, order)
        position = {layer_id: p for p, layer_id in enumerate(order)}
        stages = [[position[layer_id] for layer_id in stage.layer_ids] for stage in result.stages]
        assert sorted(p for stage in stages for p in stage) == list(range(graph.n))
        costs = [stage_cost(graph, stage, settings) for stage in stages]
        assert [cost.devices for cost in costs] == [stage.devices for stage in result.stages]
        assert partition_time(costs, result.layout.data_parallel_width, settings) == result.time_per_batch


@pytest.mark.parametrize("seed", range(25))
def test_chain_path_equals_general_path(seed):
    rng = random.Random(1000 + seed)
    graphs = random_graphs(rng, rng.randint(1, 12), chain=True)
    settings = random_settings(rng)
    order = topological_order(graphs[min(graphs)])
    reference = width_graph(graphs[min(graphs)], min(graphs), order)
    assert reference.is_chain()
    fast, general = chain_space(reference.n), downset_space(reference)
    for field in ("sizes", "pair_start", "rest", "members"):
        assert np.array_equal(getattr(fast, field), getattr(general, field)), field
    for width, layer_graph in graphs.items():
        graph = width_graph(layer_graph, width, order)
        assert place(candidates(graph, settings, fast), graph, settings) == place(
            candidates(graph, settings, general), graph, settings
        )


def recurrence(space, stages, depth_cap: int, model: DeviceModel, include_full: bool) -> np.ndarray:
    """The DP table by its definition, one entry at a time: the least largest stage load of `state`
    split into s stages (the s-th from the end reading the load of a last stage when s is 1), each
    at most `feasible` places from the end, a one-device stage of a mixed model reading column y − 1."""
    states, scenarios = len(space.sizes), stages.feasible.shape[1]
    last = states if include_full else states - 1

    @functools.lru_cache(maxsize=None)
    def value(state: int, s: int, column: int, x: int) -> float:
        if s == 0:
            return 0.0 if state == 0 and column == 0 else INFTY
        if state == 0 or state >= last:
            return INFTY
        best = INFTY
        for pair in space.pairs(state):
            if s > stages.feasible[pair, x]:
                continue
            read = column - 1 if model.mixed and stages.devices[pair] == 1 and column > 0 else column
            load = stages.load_last[pair, x] if s == 1 else stages.load_inner[pair, x]
            best = min(best, max(value(int(space.rest[pair]), s - 1, read, x), float(load)))
        return best

    return np.array([[[[value(state, s, column, x) for x in range(scenarios)] for column in range(model.columns)]
                      for s in range(depth_cap + 1)] for state in range(states)])


class _Dag:
    def __init__(self, n: int, edges: list[tuple[int, int]]) -> None:
        self.n = n
        self.out_edges = [[(w, 0.0) for u, w in edges if u == v] for v in range(n)]
        self.in_edges = [[(u, 0.0) for u, w in edges if w == v] for v in range(n)]


@pytest.mark.parametrize("seed", range(40))
def test_dp_table_equals_its_recurrence(seed):
    """fill_tables (vectorised over stage counts) against the recurrence entry by entry, on chains and
    branching graphs, uniform and mixed device models, several scenarios, ties and infeasible stages."""
    rng = np.random.default_rng(seed)
    layers = int(rng.integers(1, 9))
    if seed % 2:
        space = chain_space(layers)
    else:
        edges = [(u, w) for u in range(layers) for w in range(u + 1, layers) if rng.random() < 0.35]
        space = downset_space(_Dag(layers, edges))
    pairs, scenarios, depth_cap = int(space.pair_start[-1]), int(rng.integers(1, 4)), int(rng.integers(1, layers + 2))
    columns = int(rng.integers(1, 4))
    per_stage = int(rng.choice([2, 4])) if columns > 1 else int(rng.choice([1, 2]))
    devices = rng.choice([1, per_stage], pairs) if columns > 1 else np.full(pairs, per_stage)
    stages = StageTable(devices, np.round(rng.random((pairs, scenarios)), 1), np.round(rng.random((pairs, scenarios)), 1),
                        rng.integers(0, depth_cap + 2, (pairs, scenarios)))
    model = DeviceModel(per_stage, columns)
    for include_full in (False, True):
        table = fill_tables(space, stages, depth_cap, model, include_full)
        assert np.array_equal(table, recurrence(space, stages, depth_cap, model, include_full))
