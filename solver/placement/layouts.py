"""Megatron's even layouts of a transformer chain: p·v equal chunks of the blocks, the layers before
the first block with the first chunk and those after the last block with the last; chunk j on
pipeline device j mod p. v = 1 is Megatron's plain pipeline (the fixed baseline), v > 1 its
interleaved schedule (which layouts fit: `solver.layout`).
"""

from __future__ import annotations

import itertools
from functools import lru_cache

import numpy as np

from solver.layout import FitRules, Layout, MegatronSplit, layouts
from solver.training_step.memory import in_flight
from solver.training_step.model import TrainingStep
from solver.training_step.records import Placement, StageTerms, StepGraph, StepResult
from solver.training_step.stages import per_device

from .candidates import StateSpace


def block_span(graph: StepGraph) -> tuple[int, int] | None:
    """(first, end) positions of the transformer blocks, if they are one run of a chain."""
    blocks = [position for position, layer in enumerate(graph.layers) if layer.is_block]
    if not blocks or blocks != list(range(blocks[0], blocks[-1] + 1)) or not graph.is_chain():
        return None
    return blocks[0], blocks[-1] + 1


def megatron_chunks(graph: StepGraph, stages: int, virtual_stages: int = 1, split: MegatronSplit | None = None
                    ) -> tuple[tuple[int, ...], ...] | None:
    """The chunks of Megatron's layout, first to last, or None when the blocks do not split so.

    `split` (`MegatronSplit`; None: even): with `account_for_ends` (Megatron's
    --account-for-embedding-in-pipeline-split and --account-for-loss-in-pipeline-split) the layers
    before the blocks count as one block and those after as another, so the first and the last chunk
    hold one block fewer; or the first and last stage's blocks are given.
    """
    span = block_span(graph)
    if span is None:
        return None
    blocks, chunks = span[1] - span[0], stages * virtual_stages
    if split is not None and split.uneven:
        sizes = _uneven_sizes(blocks, stages, virtual_stages, split)
    else:
        ends = 2 if split is not None and split.account_for_ends else 0
        if (blocks + ends) % chunks:
            return None
        sizes = [(blocks + ends) // chunks] * chunks
        sizes[0] -= ends // 2  # the embedding's unit
        sizes[-1] -= ends // 2  # the loss's
    if sizes is None:
        return None
    bounds = list(itertools.accumulate(sizes, initial=span[0]))
    layers = [list(range(bounds[index], bounds[index + 1])) for index in range(len(sizes))]
    layers[0] = list(range(span[0])) + layers[0]  # the layers before the blocks with the first chunk
    layers[-1] = layers[-1] + list(range(span[1], graph.n))  # and those after with the last
    return tuple(tuple(chunk) for chunk in layers)


def _uneven_sizes(blocks: int, stages: int, virtual_stages: int, split: MegatronSplit) -> list[int] | None:
    """The blocks of each of Megatron's stages with the first and/or last stage's given and the rest
    split evenly over the other stages (v = 1), or None when they do not split so."""
    first, last = split.first_stage_blocks, split.last_stage_blocks
    middle = stages - (first is not None) - (last is not None)
    rest = blocks - (first or 0) - (last or 0)
    if virtual_stages != 1 or middle < 0 or rest < 0 or (middle == 0 and rest) or (middle and (rest % middle or not rest)):
        return None
    return ([first] if first is not None else []) + [rest // middle if middle else 0] * middle + (
        [last] if last is not None else [])


@lru_cache(maxsize=256)
def interleaved_layouts(rules: FitRules, shard: Layout, choices: tuple[int, ...] | None
                        ) -> tuple[tuple[tuple[int, int], tuple[Layout, ...]], ...]:
    """The interleaved (v > 1) layouts of a shard by (p, v), in that order (the same for every
    sharding and recomputation mode of one question: kept)."""
    by_chunks: dict[tuple[int, int], list[Layout]] = {}
    for layout in layouts(rules, shard, choices):
        if layout.virtual_stages > 1:
            by_chunks.setdefault((layout.pipeline_parallel_width, layout.virtual_stages), []).append(layout)
    return tuple((key, tuple(options)) for key, options in sorted(by_chunks.items()))


def interleaved(step: TrainingStep, space: StateSpace, terms: StageTerms, choices: tuple[int, ...] | None,
                upper_bound: float, chunk_pairs: dict | None = None) -> tuple[Placement, StepResult] | None:
    """The fastest interleaved (v > 1) Megatron layout faster than `upper_bound`, or None.

    `terms` are the chain's interval terms of `space` (every chunk is an interval); `choices`
    restricts v (None: every v); `chunk_pairs` (the caller's, for steps of one graph) keeps each
    (p, v)'s chunks and their candidate stages.
    """
    if block_span(step.graph) is None:
        return None
    chunk_pairs = {} if chunk_pairs is None else chunk_pairs
    best, order, busy, groups = None, (upper_bound,), step.busy(terms), []
    for (stages, v), options in interleaved_layouts(step.fit_rules(), step.shard, choices):
        if (stages, v) not in chunk_pairs:
            chunks = megatron_chunks(step.graph, stages, v)
            chunk_pairs[stages, v] = chunks, np.array([int(space.pair_start[step.graph.n - chunk[0]]) + len(chunk) - 1
                                                       for chunk in chunks])
        heaviest = float(per_device(busy[chunk_pairs[stages, v][1]], stages).max())
        degrees = np.array([layout.data_parallel_width for layout in options])
        groups.append((float(step.time_floor(degrees, stages, v, heaviest).min()), stages, v, options))
    # the best is the least (time, d, p, v) whatever the order: the likeliest first, the rest cut by their floor
    for floor, stages, v, options in sorted(groups, key=lambda group: group[:3]):
        if floor > order[0]:
            break  # no width of this p and v, nor of any later, can beat the best so far
        chunks, pairs = chunk_pairs[stages, v]
        chunk_terms = StageTerms(**{name: getattr(terms, name)[pairs] for name in StageTerms.__dataclass_fields__})
        fewest = step.micro_batches // max(layout.data_parallel_width for layout in options)
        if (step.memory_floor(step.device_terms(chunk_terms, stages), in_flight(stages, v, fewest))
                > step.device.memory_capacity).any():
            continue  # a device overflows at every width of this p and v
        scored = step.score(chunk_terms, options)
        for index in np.flatnonzero(scored["fits"]):
            layout = options[index]
            candidate = (float(scored["time"][index]), layout.data_parallel_width, stages, v)
            if candidate < order:
                best, order = Placement(layout, chunks, step.recompute), candidate
    return None if best is None else (best, step.price(best))
