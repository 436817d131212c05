"""The pipeline / data-parallel DP for one tensor-parallel width (spec placement_dp.md §7-§9).

The original keeps dp[D][k][s]: the least largest stage load over splits of state D into s stages,
each memory-feasible at its place from the end, using at most k devices. Here the k axis is
replaced by a few columns (see DeviceModel): a stage uses 1 or t devices (t = the width), so what
k allows is a count of stages of each kind. The table holds the very same values (only min and
max touch them) and does not grow with the cluster. Ties are broken as in the original: smallest
d, then shortest first stage, then fewest stages; the back-trace takes the shortest next stage
whose value matches within 1e-9.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .candidates import Candidates, DeviceModel
from .evaluate import score
from .inputs import PlacementSettings
from .layer_graph import WidthGraph
from .stage_cost import sync_time

#: The original's "infeasible" value; table entries above INFTY/2 mean "no split".
INFTY = 1e30
#: Absolute tolerance of the original's back-trace match.
MATCH_TOLERANCE = 1e-9


@dataclass(frozen=True)
class Choice:
    """What the final round picked: data-parallel degree, first stage (a pair) and depth."""

    time: float
    data_parallel_degree: int
    pair: int
    depth: int


@dataclass(frozen=True)
class WidthPlacement:
    """The best placement at one width: stages as topological positions, first to last."""

    width: int
    time_per_batch: float
    data_parallel_degree: int
    stages: tuple[tuple[int, ...], ...]
    stage_devices: tuple[int, ...]
    memory_bytes: tuple[float, ...]


def place(candidates: Candidates, graph: WidthGraph, settings: PlacementSettings) -> WidthPlacement | None:
    """Best placement at this width with the sync charged for the first stage (the original's rule)."""
    feasible = candidates.costs.max_in_flight
    tables = [table[..., 0] for table in fill_tables(candidates, settings, feasible)]
    choice = final_round(candidates, tables, settings, feasible)
    return None if choice is None else placement(candidates, tables, graph, settings, feasible, choice)


def fill_tables(
    candidates: Candidates,
    settings: PlacementSettings,
    feasible: np.ndarray,
    levels: np.ndarray | None = None,
    caps: int = 1,
) -> list[np.ndarray]:
    """table[state][s, column, c] for every state but the full set (spec §7, see DeviceModel).

    `feasible[pair]` is the most micro-batches the stage may hold in flight (its deepest place).
    Axis c holds `caps` tables at once: stage `pair` may be used in tables c >= levels[pair]
    (all stages in all tables when `levels` is None).
    """
    space, costs = candidates.space, candidates.costs
    depth_cap, model = candidates.depth_cap, candidates.device_model
    tables = [np.full((min(int(size), depth_cap) + 1, model.columns, caps), INFTY) for size in space.sizes]
    tables[0][0, 0] = 0.0
    one_more = np.r_[0, np.arange(model.columns - 1)]  # a one-device stage: column y reads y - 1
    rest, devices = space.rest.tolist(), costs.devices.tolist()
    last, inner, feasible = costs.load_last.tolist(), costs.load_inner.tolist(), feasible.tolist()
    levels = [0] * len(rest) if levels is None else levels.tolist()
    for state in range(1, len(tables) - 1):
        table = tables[state]
        for pair in space.pairs(state):
            before, level = tables[rest[pair]], levels[pair]
            depth = min(feasible[pair], table.shape[0] - 1, before.shape[0])
            if depth < 1 or level >= caps:
                continue
            target = table[1 : depth + 1, :, level:]
            if model.mixed and devices[pair] == 1:
                source = before[:depth, one_more, level:]
            else:
                source = before[:depth, :, level:]
            if inner[pair] == last[pair]:
                np.minimum(target, np.maximum(source, last[pair]), out=target)
            else:  # the last stage skips recomputation
                np.minimum(target[:1], np.maximum(source[:1], last[pair]), out=target[:1])
                np.minimum(target[1:], np.maximum(source[1:], inner[pair]), out=target[1:])
    return tables


def final_round(
    candidates: Candidates,
    tables: list[np.ndarray],
    settings: PlacementSettings,
    feasible: np.ndarray,
) -> Choice | None:
    """Pick d, the first stage and the depth (spec §8), vectorised over d and depth."""
    degrees, per_pipeline, micro_batches = data_parallel_options(settings)
    space, costs = candidates.space, candidates.costs
    depth_cap, model = candidates.depth_cap, candidates.device_model
    best = None
    for pair in space.pairs(len(tables) - 1):
        before = tables[int(space.rest[pair])]
        depth = min(int(feasible[pair]), depth_cap, before.shape[0])
        if depth < 1:
            continue
        earlier = np.arange(depth)  # stages after the first one: s - 1
        column = model.column((per_pipeline - int(costs.devices[pair]))[:, None], earlier[None, :])
        previous = np.where(column >= 0, before[earlier[None, :], np.maximum(column, 0)], INFTY)
        load = np.where(earlier == 0, costs.load_last[pair], costs.load_inner[pair])
        time = np.maximum(previous, load) * (micro_batches[:, None] + earlier).astype(float)
        time += sync_time(degrees, costs.parameter_bytes[pair], settings.bandwidth)[:, None]
        time[previous > INFTY / 2] = np.inf
        flat = int(np.argmin(time))
        value = float(time.flat[flat])
        degree = int(degrees[flat // depth])
        if value < INFTY and (
            best is None or value < best.time or (value == best.time and degree < best.data_parallel_degree)
        ):
            best = Choice(value, degree, pair, flat % depth + 1)
    return best


def backtrace(
    candidates: Candidates, tables: list[np.ndarray], settings: PlacementSettings, feasible: np.ndarray, choice: Choice
) -> list[int]:
    """The candidate stage (pair) of each stage, first to last: the shortest next stage matching (§9)."""
    space, costs = candidates.space, candidates.costs
    model = candidates.device_model
    stages = [choice.pair]
    state, depth = int(space.rest[choice.pair]), choice.depth - 1
    budget = settings.devices // choice.data_parallel_degree - int(costs.devices[choice.pair])
    while state != 0:
        target = _lookup(tables[state], budget, depth, model)
        for pair in space.pairs(state):
            devices, rest = int(costs.devices[pair]), int(space.rest[pair])
            if budget < devices or depth > feasible[pair]:
                continue
            load = float(costs.load_inner[pair] if depth > 1 else costs.load_last[pair])
            value = max(_lookup(tables[rest], budget - devices, depth - 1, model), load)
            if abs(target - value) < MATCH_TOLERANCE:
                stages.append(pair)
                state, depth, budget = rest, depth - 1, budget - devices
                break
        else:
            raise RuntimeError("placement DP back-trace found no matching stage (internal error)")
    return stages


def data_parallel_options(settings: PlacementSettings) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Degrees d worth trying, with their devices per replica ⌊K/d⌋ and micro-batches ⌈B/d⌉.

    Of the degrees 1..min(K, B) with the same (⌊K/d⌋, ⌈B/d⌉), only the smallest can win: the
    pipeline time is the same and the sync time grows with d (ties go to the smaller d anyway).
    """
    devices, batch = settings.devices, settings.micro_batches_per_batch
    degrees = np.arange(1, min(devices, batch) + 1)
    per_pipeline, micro_batches = devices // degrees, (batch + degrees - 1) // degrees
    first = np.ones(len(degrees), dtype=bool)
    first[1:] = (per_pipeline[1:] != per_pipeline[:-1]) | (micro_batches[1:] != micro_batches[:-1])
    return degrees[first], per_pipeline[first], micro_batches[first]


def _lookup(table: np.ndarray, budget: int, depth: int, model: DeviceModel) -> float:
    """The original's dp[D][budget][depth] read from table[D] (INFTY when no split fits)."""
    column = int(model.column(budget, depth))
    if depth >= table.shape[0] or column < 0:
        return INFTY
    return float(table[depth, column])


def placement(
    candidates: Candidates,
    tables: list[np.ndarray],
    graph: WidthGraph,
    settings: PlacementSettings,
    feasible: np.ndarray,
    choice: Choice,
) -> WidthPlacement:
    """Rebuild the stages of `choice` (2-D tables) and score them independently."""
    pairs = backtrace(candidates, tables, settings, feasible, choice)
    stages = tuple(tuple(candidates.space.stage_positions(pair)) for pair in pairs)
    devices = tuple(int(candidates.costs.devices[pair]) for pair in pairs)
    scored = score(graph, stages, devices, choice.data_parallel_degree, settings)
    return WidthPlacement(
        width=graph.width,
        time_per_batch=scored.time_per_batch,
        data_parallel_degree=choice.data_parallel_degree,
        stages=stages,
        stage_devices=devices,
        memory_bytes=scored.memory_bytes,
    )
