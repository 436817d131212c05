"""Placement with the data-parallel sync charged for the stage with the most parameter bytes.

Optional (sync_cost="max_stage"); the original charges the first stage (spec Q5). The time is
max load × (⌈B/d⌉ + p − 1) + sync(d, largest stage's parameter bytes). For each cap c among the
candidate stages' parameter bytes, F(c) is the best time over placements whose stages all hold at
most c bytes, with the sync charged for c. F(c) never undercharges its placement, and at c = the
optimum's largest stage it equals the optimum, so the least F(c) is the optimum. The DP tables of
many caps are filled at once (a cap axis), and the final round is vectorised over caps, degrees and
depths: with the sync the same for every first stage, only the best first stage per (depth,
device column) matters. Ties: smallest cap, then smallest d, fewest stages, fewer devices for the
first stage, shortest first stage; the back-trace is the original's.
"""

from __future__ import annotations

import numpy as np

from .candidates import Candidates
from .dp import INFTY, Choice, WidthPlacement, data_parallel_options, fill_tables, placement
from .inputs import PlacementSettings
from .layer_graph import WidthGraph
from .stage_cost import sync_time

#: Rough bound on the elements of the arrays of one batch of caps (memory, not results).
BATCH_ELEMENTS = 1 << 22


def place_max_stage(candidates: Candidates, graph: WidthGraph, settings: PlacementSettings) -> WidthPlacement | None:
    """Best placement at this width with the sync charged for the largest stage, or None."""
    costs = candidates.costs
    feasible = costs.max_in_flight
    caps = np.unique(costs.parameter_bytes[feasible >= 1])
    levels = np.searchsorted(caps, costs.parameter_bytes)  # first cap that admits each stage
    best, best_time = None, INFTY
    size = _batch_size(candidates, settings)
    for start in range(0, len(caps), size):
        batch = caps[start : start + size]
        batch_levels = np.maximum(levels - start, 0)
        tables = fill_tables(candidates, settings, feasible, batch_levels, len(batch))
        found = _cheapest(candidates, tables, settings, feasible, batch_levels, batch)
        if found is not None and found[0].time < best_time:
            choice, cap = found
            allowed = np.where(batch_levels <= cap, feasible, 0)
            best_time = choice.time
            best = placement(candidates, [table[..., cap] for table in tables], graph, settings, allowed, choice)
    return best


def _batch_size(candidates: Candidates, settings: PlacementSettings) -> int:
    """Caps per batch so that tables and final-round arrays stay near BATCH_ELEMENTS elements."""
    depth_cap, columns = candidates.depth_cap, candidates.device_model.columns
    table = sum(min(int(size), depth_cap) + 1 for size in candidates.space.sizes) * columns
    final = 2 * len(data_parallel_options(settings)[0]) * depth_cap
    return max(1, BATCH_ELEMENTS // max(table, final))


def _cheapest(
    candidates: Candidates,
    tables: list[np.ndarray],
    settings: PlacementSettings,
    feasible: np.ndarray,
    levels: np.ndarray,
    caps: np.ndarray,
) -> tuple[Choice, int] | None:
    """The least F(c) over this batch of caps: the choice (time = F(c)) and the cap's index."""
    space, costs = candidates.space, candidates.costs
    degrees, per_pipeline, micro_batches = data_parallel_options(settings)
    depth_cap, model = candidates.depth_cap, candidates.device_model
    first_stages = [
        pair
        for pair in space.pairs(len(tables) - 1)
        if levels[pair] < len(caps) and min(feasible[pair], depth_cap, tables[space.rest[pair]].shape[0]) >= 1
    ]
    groups = sorted({int(costs.devices[pair]) for pair in first_stages})
    earlier = np.arange(depth_cap)  # stages after the first one: s - 1
    times = np.full((len(caps), len(degrees), depth_cap, len(groups)), np.inf)
    bests, columns = [], []
    for index, group in enumerate(groups):
        best = _best_first_stage_loads(candidates, tables, feasible, levels, depth_cap, group, first_stages)
        column = model.column((per_pipeline - group)[:, None], earlier[None, :])
        load = np.where((column >= 0)[..., None], best[earlier[None, :], np.maximum(column, 0)], np.inf)
        time = load * (micro_batches[:, None] + earlier).astype(float)[..., None]
        time += sync_time(degrees[:, None, None], caps[None, None, :], settings.bandwidth)
        times[..., index] = np.moveaxis(time, 2, 0)
        bests.append(best)
        columns.append(column)
    flat = int(np.argmin(times)) if times.size else 0
    if not times.size or not times.flat[flat] < INFTY:
        return None
    cap, degree, depth, index = np.unravel_index(flat, times.shape)
    column = int(columns[index][degree, depth])
    target = bests[index][depth, column, cap]
    for pair in first_stages:
        before = tables[space.rest[pair]]
        if costs.devices[pair] != groups[index] or levels[pair] > cap or depth >= min(feasible[pair], before.shape[0]):
            continue
        load = costs.load_last[pair] if depth == 0 else costs.load_inner[pair]
        if max(before[depth, column, cap], load) == target:
            return Choice(float(times.flat[flat]), int(degrees[degree]), pair, int(depth) + 1), int(cap)
    raise RuntimeError("max_stage final round lost its first stage (internal error)")


def _best_first_stage_loads(
    candidates: Candidates,
    tables: list[np.ndarray],
    feasible: np.ndarray,
    levels: np.ndarray,
    depth_cap: int,
    group: int,
    first_stages: list[int],
) -> np.ndarray:
    """best[s-1, x, c]: least max(rest of the pipeline, first stage's load) over first stages of `group` devices."""
    space, costs = candidates.space, candidates.costs
    best = np.full((depth_cap,) + tables[0].shape[1:], np.inf)
    for pair in first_stages:
        if costs.devices[pair] != group:
            continue
        before, level = tables[space.rest[pair]], levels[pair]
        depth = min(feasible[pair], depth_cap, before.shape[0])
        previous = before[:depth, :, level:]
        loads = np.full((depth, 1, 1), costs.load_inner[pair])
        loads[0] = costs.load_last[pair]
        candidate = np.where(previous > INFTY / 2, np.inf, np.maximum(previous, loads))
        np.minimum(best[:depth, :, level:], candidate, out=best[:depth, :, level:])
    return best
