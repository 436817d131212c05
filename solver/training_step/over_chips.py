"""A lower bound on a step model's time per batch over chips: what the architecture search's first
level of bounds needs, for per-layer compute given as arrays over candidate chips."""

from __future__ import annotations

import numpy as np

from solver.training_step.model import TrainingStep


def time_lower_bound(step: TrainingStep, compute: np.ndarray, degrees) -> np.ndarray:
    """A lower bound on the time per batch of every placement of this shard, in any
    recomputation mode, for layers whose forward + backward compute is at least `compute[v]`
    (an array per layer, e.g. over candidate chips); `degrees` are the data-parallel widths.

    Each device of p carries at least its layers' compute and collectives, so
    ℓ ≥ max(M, W/p) (M the heaviest layer, W all layers); the pipeline is at least
    (m + (p − 1)/v)·ℓ with v at most blocks/p (collectives that may overlap counted as 0); and the stage holding the layer with the most
    parameters P* has at least the tail of P* (its optimizer step only, when the sync may
    hide behind the backward pass). Minimised over d and p ≤ min(layers, devices/(t·d)).
    """
    compute = np.asarray(compute, float) * step.token_share  # the device's 1/c of each sequence
    # overlapped tensor-parallel collectives may hide entirely behind a chip's weight products
    tensor = 0.0 if step.training.tensor_parallel_overlap else step.layer_values["tensor_parallel"]
    # overlapped dispatches may hide entirely behind a chip's compute of another micro-batch
    experts = 0.0 if step.training.overlap_expert_dispatch else step.layer_values["expert_parallel"]
    collectives = tensor + experts
    per_layer = compute + collectives.reshape((-1,) + (1,) * (compute.ndim - 1))
    total, heaviest = per_layer.sum(axis=0), per_layer.max(axis=0)
    blocks = sum(layer.is_block for layer in step.graph.layers)
    best = np.full(total.shape, np.inf)
    for degree in degrees:
        devices = step.cluster.num_devices // (step.stage_devices * degree)
        stages = np.arange(1, min(step.graph.n, devices) + 1)
        if not len(stages):
            continue
        interleave = np.maximum(1, blocks // stages) if step.graph.is_chain() else np.ones(len(stages))
        factor = step.micro_batches // degree + (stages - 1) / interleave
        best = np.minimum(best, least_pipeline_time(factor, heaviest, total) + float(step.tail_floor(degree)))
    return best


def least_pipeline_time(factor: np.ndarray, heaviest: np.ndarray, total: np.ndarray) -> np.ndarray:
    """min over p = 1..len(factor) of factor[p − 1] · max(heaviest, total / p), elementwise over
    `heaviest` and `total` (arrays of one shape), for a `factor` that does not decrease with p.

    Where total / p ≤ heaviest (p ≥ q = ⌈total / heaviest⌉) the term is factor · heaviest, least at
    the first such p; below q it is total · factor[p − 1] / p, least at the p ≤ q − 1 of least
    factor / p, which does not depend on the chip. So four p per chip are priced (that one, q − 1, q
    and q + 1, the neighbours covering the division's rounding): their least term is the full
    minimum, or one rounding above it where two p tie in factor / p (the bounds' FLOAT_MARGIN
    covers it)."""
    count = len(factor)
    stages = np.arange(1, count + 1)
    per_stage = factor / stages
    # the p of least factor / p among 1..k, for each k
    least = np.maximum.accumulate(np.where(per_stage == np.minimum.accumulate(per_stage), stages, 1))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.ceil(total / heaviest)
    first = np.clip(np.nan_to_num(ratio, nan=1.0, posinf=count + 1.0), 1, count + 1).astype(np.int64)
    best = np.full(total.shape, np.inf)
    for p in (least[np.clip(first - 1, 1, count) - 1], first - 1, first, first + 1):
        p = np.clip(p, 1, count)
        best = np.minimum(best, factor[p - 1] * np.maximum(heaviest, total / p))
    return best
