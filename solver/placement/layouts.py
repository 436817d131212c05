"""Megatron's even layouts of a transformer chain: p·v equal chunks of the blocks, the layers before
the first block with the first chunk and those after the last block with the last; chunk j on
pipeline device j mod p. v = 1 is Megatron's plain pipeline (the fixed baseline), v > 1 its
interleaved schedule (which layouts fit: `solver.layout`).
"""

from __future__ import annotations

import numpy as np

from solver.layout import Layout, layouts
from solver.training_step.model import Placement, StageTerms, StepGraph, StepResult, TrainingStep

from .candidates import StateSpace


def block_span(graph: StepGraph) -> tuple[int, int] | None:
    """(first, end) positions of the transformer blocks, if they are one run of a chain."""
    blocks = [position for position, layer in enumerate(graph.layers) if layer.is_block]
    if not blocks or blocks != list(range(blocks[0], blocks[-1] + 1)) or not graph.is_chain():
        return None
    return blocks[0], blocks[-1] + 1


def megatron_chunks(graph: StepGraph, stages: int, virtual_stages: int = 1,
                    account_for_ends: bool = False) -> tuple[tuple[int, ...], ...] | None:
    """The chunks of Megatron's layout, first to last, or None when the blocks do not split evenly.

    `account_for_ends` (Megatron's --account-for-embedding-in-pipeline-split and
    --account-for-loss-in-pipeline-split): the layers before the blocks count as one block and those
    after as another, so the first and the last chunk hold one block fewer.
    """
    span = block_span(graph)
    ends = 2 if account_for_ends else 0
    if span is None or (span[1] - span[0] + ends) % (stages * virtual_stages):
        return None
    first, end = span
    size = (end - first + ends) // (stages * virtual_stages)
    start = first - ends // 2  # the blocks' positions, the first chunk's unit for the embedding included
    chunks = [list(range(max(start + j * size, first), min(start + (j + 1) * size, end)))
              for j in range(stages * virtual_stages)]
    chunks[0] = list(range(first)) + chunks[0]
    chunks[-1] = chunks[-1] + list(range(end, graph.n))
    return tuple(tuple(chunk) for chunk in chunks)


def interleaved(step: TrainingStep, space: StateSpace, terms: StageTerms, choices: tuple[int, ...] | None,
                upper_bound: float) -> tuple[Placement, StepResult] | None:
    """The fastest interleaved (v > 1) Megatron layout faster than `upper_bound`, or None.

    `terms` are the chain's interval terms of `space` (every chunk is an interval); `choices`
    restricts v (None: every v).
    """
    if block_span(step.graph) is None:
        return None
    n = step.graph.n
    by_chunks: dict[tuple[int, int], list[Layout]] = {}
    for layout in layouts(step.fit_rules(), step.shard, choices):
        if layout.virtual_stages > 1:
            by_chunks.setdefault((layout.pipeline_parallel_width, layout.virtual_stages), []).append(layout)
    best, order = None, (upper_bound,)
    for (stages, v), options in sorted(by_chunks.items()):
        chunks = megatron_chunks(step.graph, stages, v)
        pairs = [int(space.pair_start[n - chunk[0]]) + len(chunk) - 1 for chunk in chunks]
        chunk_terms = StageTerms(**{name: getattr(terms, name)[pairs] for name in StageTerms.__dataclass_fields__})
        scored = step.score(chunk_terms, options)
        for index in np.flatnonzero(scored["fits"]):
            layout = options[index]
            candidate = (float(scored["time"][index]), layout.data_parallel_width, stages, v)
            if candidate < order:
                best, order = Placement(layout, chunks, step.recompute), candidate
    return None if best is None else (best, step.price(best))
