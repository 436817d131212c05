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
        factor = (step.micro_batches // degree + (stages - 1) / interleave).reshape((-1,) + (1,) * total.ndim)
        load = np.maximum(heaviest, total / stages.reshape(factor.shape))
        best = np.minimum(best, (factor * load).min(axis=0) + float(step.tail_floor(degree)))
    return best
