"""Megatron's even layouts of a transformer chain: p·v equal chunks of the blocks, the layers before
the first block with the first chunk and those after the last block with the last; chunk j on
pipeline device j mod p. v = 1 is Megatron's plain pipeline (the fixed baseline), v > 1 its
interleaved schedule, which needs the micro-batches per replica to be a multiple of p.
"""

from __future__ import annotations

import numpy as np

from solver.training_step.model import Placement, StageTerms, StepGraph, StepResult, TrainingStep

from .capped import degrees
from .candidates import StateSpace


def block_span(graph: StepGraph) -> tuple[int, int] | None:
    """(first, end) positions of the transformer blocks, if they are one run of a chain."""
    blocks = [position for position, layer in enumerate(graph.layers) if layer.recomputable]
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


def allowed_virtual_stages(blocks: int) -> tuple[int, ...]:
    """v values some pipeline of at least two stages can interleave: v divides the blocks, and
    blocks / v ≥ 2 (with 1 for no interleaving)."""
    return (1, *(v for v in range(2, blocks // 2 + 1) if blocks % v == 0))


def interleaved(step: TrainingStep, space: StateSpace, terms: StageTerms, choices: tuple[int, ...] | None,
                upper_bound: float) -> tuple[Placement, StepResult] | None:
    """The fastest interleaved (v > 1) Megatron layout faster than `upper_bound`, or None.

    `terms` are the chain's interval terms of `space` (every chunk is an interval); `choices`
    restricts v (None: every v).
    """
    span = block_span(step.graph)
    if span is None:
        return None
    blocks, n = span[1] - span[0], step.graph.n
    best, order = None, (upper_bound,)
    for stages in range(2, blocks // 2 + 1):
        for v in range(2, blocks // stages + 1):
            if blocks % (stages * v) or (choices is not None and v not in choices):
                continue
            chunks = megatron_chunks(step.graph, stages, v)
            options = [d for d in degrees(step) if stages * step.width * d <= step.cluster.num_devices
                       and (step.micro_batches // d) % stages == 0]
            if not options:
                continue
            pairs = [int(space.pair_start[n - chunk[0]]) + len(chunk) - 1 for chunk in chunks]
            chunk_terms = StageTerms(**{name: getattr(terms, name)[pairs] for name in StageTerms.__dataclass_fields__})
            scored = step.score(chunk_terms, v, options)
            for index in np.flatnonzero(scored["fits"]):
                candidate = (float(scored["time"][index]), options[index], stages, v)
                if candidate < order:
                    best, order = (chunks, options[index], v), candidate
    if best is None:
        return None
    chunks, degree, v = best
    placement = Placement(chunks, degree, step.recompute, v)
    return placement, step.evaluate(placement)
