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

from .candidates import chain_space


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
    return None if span is None else _chunks(span, graph.n, stages, virtual_stages, split)


@lru_cache(maxsize=4096)
def _chunks(span: tuple[int, int], layers: int, stages: int, virtual_stages: int, split: MegatronSplit | None
            ) -> tuple[tuple[int, ...], ...] | None:
    """`megatron_chunks` of a chain of `layers` whose blocks are at `span` (it depends on nothing else
    of the graph: kept per process)."""
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
    found = [list(range(bounds[index], bounds[index + 1])) for index in range(len(sizes))]
    found[0] = list(range(span[0])) + found[0]  # the layers before the blocks with the first chunk
    found[-1] = found[-1] + list(range(span[1], layers))  # and those after with the last
    return tuple(tuple(chunk) for chunk in found)


@lru_cache(maxsize=4096)
def _chunk_stages(span: tuple[int, int], layers: int, stages: int, virtual_stages: int) -> np.ndarray:
    """The candidate stage (`chain_space(layers)`'s pair) of each of Megatron's even chunks."""
    pair_start = chain_space(layers).pair_start
    found = np.array([int(pair_start[layers - chunk[0]]) + len(chunk) - 1
                      for chunk in _chunks(span, layers, stages, virtual_stages, None)])
    found.flags.writeable = False
    return found


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


def interleaved(step: TrainingStep, terms: StageTerms, choices: tuple[int, ...] | None,
                upper_bound: float) -> tuple[Placement, StepResult] | None:
    """The fastest interleaved (v > 1) Megatron layout faster than `upper_bound`, or None.

    `terms` are the chain's interval terms (`chain_space`: every chunk is an interval); `choices`
    restricts v (None: every v).
    """
    span = block_span(step.graph)
    if span is None:
        return None
    best, order, busy, groups = None, (upper_bound,), step.busy(terms), []
    for (stages, v), options in interleaved_layouts(step.fit_rules(), step.shard, choices):
        heaviest = float(per_device(busy[_chunk_stages(span, step.graph.n, stages, v)], stages).max())
        degrees = np.array([layout.data_parallel_width for layout in options])
        groups.append((float(step.time_floor(degrees, stages, v, heaviest).min()), stages, v, options))
    # the best is the least (time, d, p, v) whatever the order: the likeliest first, the rest cut by their floor
    for floor, stages, v, options in sorted(groups, key=lambda group: group[:3]):
        if floor > order[0]:
            break  # no width of this p and v, nor of any later, can beat the best so far
        chunks, pairs = _chunks(span, step.graph.n, stages, v, None), _chunk_stages(span, step.graph.n, stages, v)
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
