"""The original program's placement at one width (msr-fiddle/phaze at fed7cde,
`Solver/device_placement/device_placement.cpp` `Graph::runDP`, lines 560-726): the DP tables with
one scenario, then the final round that picks d, the first stage and the depth with the sync
charged for the first stage only, and the back-trace. Costs and times come from
`solver.training_step.original`.

Ties are broken as in the original: smallest d, then shortest first stage, then fewest stages.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solver.training_step.original import (
    OriginalStep,
    StageCostTable,
    pipeline_time,
    price,
    stage_cost_table,
    sync_time,
)

from .candidates import DeviceModel, StateSpace, device_model
from .dp import INFTY, StageTable, backtrace, fill_tables
from .layer_graph import WidthGraph


@dataclass(frozen=True)
class Candidates:
    """A state space with the original's stage costs at one width.

    `depth_cap` is the most stages a pipeline can have (devices, layers); `device_model` says how
    the DP's table columns stand for device budgets.
    """

    width: int
    space: StateSpace
    costs: StageCostTable
    depth_cap: int
    device_model: DeviceModel

    @property
    def stages(self) -> StageTable:
        costs = self.costs
        return StageTable(costs.devices, costs.load_last[:, None], costs.load_inner[:, None],
                          costs.max_in_flight[:, None])


def candidates(graph: WidthGraph, step: OriginalStep, space: StateSpace) -> Candidates:
    """Cost every candidate stage of `space` at the graph's width."""
    costs = stage_cost_table(graph, space.members, step)
    depth_cap = min(step.devices, int(space.sizes[-1]))
    return Candidates(graph.width, space, costs, depth_cap, device_model(graph.width, space, costs.devices, depth_cap))


@dataclass(frozen=True)
class Choice:
    """What the final round picked: data-parallel degree, first stage (a pair) and depth."""

    time: float
    data_parallel_width: int
    pair: int
    depth: int


@dataclass(frozen=True)
class WidthPlacement:
    """The best placement at one width: stages as topological positions, first to last."""

    width: int
    time_per_batch: float
    data_parallel_width: int
    stages: tuple[tuple[int, ...], ...]
    stage_devices: tuple[int, ...]


def place(candidates: Candidates, graph: WidthGraph, step: OriginalStep) -> WidthPlacement | None:
    """Best placement at this width with the sync charged for the first stage."""
    tables = fill_tables(candidates.space, candidates.stages, candidates.depth_cap, candidates.device_model)[..., 0]
    choice = final_round(candidates, tables, step)
    return None if choice is None else placement(candidates, tables, graph, step, choice)


def final_round(candidates: Candidates, tables: np.ndarray, step: OriginalStep) -> Choice | None:
    """Pick d, the first stage and the depth (the original's final round, device_placement.cpp lines 615-672),
    vectorised over d and depth."""
    degrees, per_pipeline, micro_batches = data_parallel_options(step)
    space, costs = candidates.space, candidates.costs
    depth_cap, model = candidates.depth_cap, candidates.device_model
    best = None
    for pair in space.pairs(len(space.sizes) - 1):
        before = tables[int(space.rest[pair])]
        depth = min(int(costs.max_in_flight[pair]), depth_cap, before.shape[0])
        if depth < 1:
            continue
        earlier = np.arange(depth)  # stages after the first one: s - 1
        column = model.column((per_pipeline - int(costs.devices[pair]))[:, None], earlier[None, :])
        previous = np.where(column >= 0, before[earlier[None, :], np.maximum(column, 0)], INFTY)
        load = np.where(earlier == 0, costs.load_last[pair], costs.load_inner[pair])
        time = pipeline_time(np.maximum(previous, load), micro_batches[:, None], earlier + 1)
        time += sync_time(degrees, costs.parameter_bytes[pair], step.bandwidth)[:, None]
        time[previous > INFTY / 2] = np.inf
        flat = int(np.argmin(time))
        value = float(time.flat[flat])
        degree = int(degrees[flat // depth])
        if value < INFTY and (
            best is None or value < best.time or (value == best.time and degree < best.data_parallel_width)
        ):
            best = Choice(value, degree, pair, flat % depth + 1)
    return best


def data_parallel_options(step: OriginalStep) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Degrees d worth trying, with their devices per replica ⌊K/d⌋ and micro-batches ⌈B/d⌉.

    Of the degrees 1..min(K, B) with the same (⌊K/d⌋, ⌈B/d⌉), only the smallest can win: the
    pipeline time is the same and the sync time grows with d (ties go to the smaller d anyway).
    """
    devices, batch = step.devices, step.micro_batches_per_batch
    degrees = np.arange(1, min(devices, batch) + 1)
    per_pipeline, micro_batches = devices // degrees, (batch + degrees - 1) // degrees
    first = np.ones(len(degrees), dtype=bool)
    first[1:] = (per_pipeline[1:] != per_pipeline[:-1]) | (micro_batches[1:] != micro_batches[:-1])
    return degrees[first], per_pipeline[first], micro_batches[first]


def placement(candidates: Candidates, tables: np.ndarray, graph: WidthGraph, step: OriginalStep,
              choice: Choice) -> WidthPlacement:
    """Rebuild the stages of `choice` and score them independently (they must give its time)."""
    space, costs = candidates.space, candidates.costs
    budget = step.devices // choice.data_parallel_width - int(costs.devices[choice.pair])
    pairs = [choice.pair] + backtrace(space, tables, candidates.stages, 0, candidates.device_model,
                                      int(space.rest[choice.pair]), choice.depth - 1, budget)
    stages = tuple(tuple(space.stage_positions(pair)) for pair in pairs)
    devices = tuple(int(costs.devices[pair]) for pair in pairs)
    scored = price(graph, stages, devices, choice.data_parallel_width, step)
    return WidthPlacement(graph.width, scored.time_per_batch, choice.data_parallel_width, stages, devices)
