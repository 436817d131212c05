"""The best placement of a model under the training-step model, for one recomputation mode: over
tensor-parallel widths, pipeline partitions (the exact DP, v = 1), Megatron's interleaved layouts
(v > 1), data-parallel degrees and micro-batches in flight. Widths are tried in ascending order and
a larger width wins only if strictly faster.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from solver.training_step.model import Placement, StepResult, TrainingStep

from .candidates import StateSpace, chain_space, downset_space
from .capped import place_capped
from .layouts import interleaved, megatron_chunks
from .result import PlacedStage, PlacementResult


def state_space(step: TrainingStep) -> StateSpace:
    graph = step.graph
    return chain_space(graph.n) if graph.is_chain() else downset_space(graph)


def best_placement(steps: Mapping[int, TrainingStep], virtual_stages: tuple[int, ...] | None = None,
                   space: StateSpace | None = None, upper_bound: float = math.inf) -> PlacementResult:
    """The fastest feasible placement over the widths of `steps` (one step model per width, all in
    one recomputation mode); `virtual_stages` restricts v (None: 1 and every v that fits). Only a
    placement faster than `upper_bound` [s] is returned (none: an infeasible result)."""
    best: tuple[int, Placement, StepResult] | None = None
    for width in sorted(steps):
        step = steps[width]
        space = space or state_space(step)
        terms = step.stage_terms(space.members)
        bound = best[2].time_per_batch if best else upper_bound
        found = []
        if virtual_stages is None or any(v > 1 for v in virtual_stages):
            found.append(interleaved(step, space, terms, virtual_stages, bound))
            if found[-1] is not None:
                bound = min(bound, found[-1][1].time_per_batch)
        if virtual_stages is None or 1 in virtual_stages:
            found.append(place_capped(step, space, terms, bound))
        for item in found:
            if item is not None and (best is None or item[1].time_per_batch < best[2].time_per_batch):
                best = (width, *item)
    if best is None:
        recompute = next(iter(steps.values())).recompute
        return PlacementResult((), None, None, math.inf, recompute=recompute)
    return placement_result(steps[best[0]], best[1], best[2])


def best_over_expert_widths(steps: Mapping[int, Mapping[int, TrainingStep]],
                            virtual_stages: tuple[int, ...] | None = None,
                            upper_bound: float = math.inf) -> PlacementResult:
    """`best_placement` over expert-parallel widths: `steps[e]` are the step models of every width at
    e; a wider e wins only if strictly faster."""
    best = None
    for experts in sorted(steps):
        found = best_placement(steps[experts], virtual_stages, upper_bound=upper_bound)
        if best is None or found.time_per_batch < best.time_per_batch:
            best = found
            upper_bound = min(upper_bound, found.time_per_batch)
    return best


def placement_result(step: TrainingStep, placement: Placement, result: StepResult) -> PlacementResult:
    """A scored placement as the search reports it (layer ids, not positions)."""
    ids = step.graph.ids
    stages = tuple(
        PlacedStage(tuple(ids[p] for p in placement.device_layers(device)), step.width, parameters, memory)
        for device, (parameters, memory) in enumerate(zip(result.parameters, result.memory))
    )
    return PlacementResult(stages, placement.data_parallel_degree, step.width, result.time_per_batch,
                           virtual_stages=placement.virtual_stages, recompute=placement.recompute,
                           breakdown=result.breakdown, expert_parallel_width=step.expert_parallel_width)


def fixed_megatron(step: TrainingStep, stages: int, degree: int) -> tuple[PlacementResult | None, str | None]:
    """Megatron's plain layout with p stages and degree d at the step's width: (result, None) or
    (None, why it cannot run)."""
    chunks = megatron_chunks(step.graph, stages)
    if chunks is None:
        return None, f"the blocks of the model do not split evenly into {stages} pipeline stages"
    placement = Placement(chunks, degree, step.recompute)
    result = step.evaluate(placement)
    if not result.feasible:
        return None, result.infeasible_reason
    return placement_result(step, placement, result), None
