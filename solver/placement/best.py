"""The best placement of a model under the training-step model, for one recomputation mode: over
shard shapes (tensor- and expert-parallel widths), pipeline partitions (the exact DP, v = 1),
Megatron's interleaved layouts (v > 1), data-parallel widths and micro-batches in flight.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from solver.layout import Layout, MegatronSplit
from solver.training_step.model import TrainingStep
from solver.training_step.records import Placement, StepResult

from .candidates import StateSpace, chain_space, downset_space
from .capped import place_capped, plain_layouts
from .layouts import interleaved, megatron_chunks
from .result import PlacedStage, PlacementResult


def state_space(step: TrainingStep) -> StateSpace:
    graph = step.graph
    return chain_space(graph.n) if graph.is_chain() else downset_space(graph)


def best_placement(steps: Sequence[TrainingStep], virtual_stages: tuple[int, ...] | None = None,
                   space: StateSpace | None = None, upper_bound: float = math.inf) -> PlacementResult:
    """The fastest feasible placement over the shards of `steps` (one step model per shard shape, all
    in one recomputation mode, ordered by expert-parallel width and then tensor-parallel width: a
    later shard wins only if strictly faster); `virtual_stages` restricts v (None: 1 and every v
    that fits). Only a placement faster than `upper_bound` [s] is returned (none: an infeasible
    result)."""
    best: tuple[TrainingStep, Placement, StepResult] | None = None
    terms_of = {}  # kept for steps of equal layer values
    for step in steps:
        bound = best[2].time_per_batch if best else upper_bound
        if step_floor(step) >= bound:
            continue  # no placement of this shard and sharding can win
        space = space or state_space(step)
        if step.terms_key not in terms_of:
            terms_of[step.terms_key] = step.stage_terms(space.members)
        terms = terms_of[step.terms_key]
        found = []
        if virtual_stages is None or any(v > 1 for v in virtual_stages):
            found.append(interleaved(step, terms, virtual_stages, bound))
            if found[-1] is not None:
                bound = min(bound, found[-1][1].time_per_batch)
        if virtual_stages is None or 1 in virtual_stages:
            found.append(place_capped(step, space, terms, bound))
        item = next((item for item in reversed(found) if item is not None), None)  # capped only if faster
        if item is not None:
            best = (step, *item)
    if best is None:
        return PlacementResult((), None, math.inf, steps[0].recompute)
    return placement_result(*best)


def step_floor(step: TrainingStep) -> float:
    """A lower bound on every placement of the step's shard and mode (`TrainingStep.time_floor` at
    each data-parallel width and depth, the bubble taken as none, as with unbounded interleaving)."""
    plain = plain_layouts(step)
    if not plain:
        return math.inf
    degrees, most = np.array(list(plain))[:, None], np.array(list(plain.values()))[:, None]
    stages = np.arange(1, most.max() + 1)[None, :]
    return float(np.where(stages <= most, step.time_floor(degrees, stages, np.inf), np.inf).min())


def placement_result(step: TrainingStep, placement: Placement, result: StepResult) -> PlacementResult:
    """A scored placement as the search reports it (layer ids, not positions)."""
    ids = step.graph.ids
    stages = tuple(
        PlacedStage(tuple(ids[p] for p in placement.device_layers(device)), step.width, parameters, memory)
        for device, (parameters, memory) in enumerate(zip(result.parameters, result.memory))
    )
    return PlacementResult(stages, placement.layout, result.time_per_batch, placement.recompute, result.breakdown,
                           data_parallel_sharding=step.training.data_parallel_sharding)


def fixed_megatron(step: TrainingStep, layout: Layout, split: MegatronSplit | None = None
                   ) -> tuple[PlacementResult | None, str | None]:
    """Megatron's layout `layout` (of the step's shard; interleaved when v > 1), its blocks split as
    `split` says (None: evenly): (result, None) or (None, why it cannot run)."""
    chunks = megatron_chunks(step.graph, layout.pipeline_parallel_width, layout.virtual_stages, split=split)
    if chunks is None:
        stages, virtual_stages = layout.pipeline_parallel_width, layout.virtual_stages
        how = ("the first and last stage's blocks as given" if split is not None and split.uneven else
               "the embedding and the loss counted as blocks" if split is not None and split.account_for_ends else "")
        if virtual_stages == 1 and not how:
            return None, f"the blocks of the model do not split evenly into {stages} pipeline stages"
        return None, (f"the blocks of the model do not split into {stages} x {virtual_stages} pipeline chunks"
                      + (f" ({how})" if how else ""))
    placement = Placement(layout, chunks, step.recompute)
    result = step.price(placement)
    if not result.feasible:
        return None, result.infeasible_reason
    return placement_result(step, placement, result), None
