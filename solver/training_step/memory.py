"""Memory per device: model state per parameter, activations per recomputation mode, and how many
micro-batches' activations a pipeline stage holds.

Model state (Megatron's distributed-optimizer table; ZeRO, Rajbhandari et al. 2020), bytes per
parameter held by the device:

    adam  16-bit weights (2) + fp32 gradients (4) + fp32 master weights and two moments (12)
    sgd   16-bit weights (2) + 16-bit gradients (2), no optimizer state (the original's "2 copies")

A sharded optimizer (ZeRO-1 / distributed optimizer) keeps 1/d of the optimizer state per device.

Activations kept per transformer block and micro-batch (Korthikanti et al. 2022, Table 2), from the
traced graph's split of each layer's saved tensors (`graph_extract.layergraph.Layer`):

    none        everything saved; with sequence parallelism the replicated part is divided by t
    selective   without the attention core (re-run in the backward pass)
    full        only the layer's input (÷ t with sequence parallelism); during its backward the
                layer's full activations are rebuilt: one layer's worth of working memory per stage

Only transformer blocks are recomputed; the embedding and the head always keep their activations.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from common.checks import choice
from graph_extract.kernels import KernelOptions

OPTIMIZERS = ("adam", "sgd")
RECOMPUTE_MODES = ("none", "selective", "full")
MEMORY_KINDS = ("weights", "gradients", "optimizer_state", "activations")


@dataclass(frozen=True)
class ModelState:
    """Bytes per parameter a device holds: weights, gradients and optimizer state (maybe sharded)."""

    weights: float
    gradients: float
    optimizer_state: float
    sharded: bool

    @classmethod
    def of(cls, optimizer: str, sharded: bool) -> ModelState:
        choice("optimizer", optimizer, OPTIMIZERS)
        weights, gradients, state = {"adam": (2.0, 4.0, 12.0), "sgd": (2.0, 2.0, 0.0)}[optimizer]
        return cls(weights, gradients, state, sharded)

    def optimizer_share(self, degree):
        """Optimizer-state bytes per parameter on one of `degree` data-parallel replicas."""
        return self.optimizer_state / degree if self.sharded else self.optimizer_state * np.ones_like(degree)

    def static_bytes(self, parameters, degree):
        """Weights + gradients + optimizer state of `parameters` on one of `degree` replicas."""
        return parameters * (self.weights + self.gradients) + parameters * self.optimizer_share(degree)


def held_activations(layers, mode: str, width: int, kernels: KernelOptions) -> tuple[np.ndarray, np.ndarray]:
    """Per layer: (bytes kept per micro-batch in flight, working bytes while it is recomputed)."""
    choice("recompute", mode, RECOMPUTE_MODES)
    share = kernels.replicated_share(width)
    saved = np.array([layer.activation_bytes - share * layer.replicated_activation_bytes for layer in layers], float)
    recomputed = np.array([layer.is_block for layer in layers], bool)
    if mode == "none":
        return saved, np.zeros(len(layers))
    if mode == "selective":
        core = np.array([layer.attention_core_activation_bytes for layer in layers], float)
        return np.where(recomputed, saved - core, saved), np.zeros(len(layers))
    inputs = np.array([layer.input_bytes - share * layer.replicated_input_bytes for layer in layers], float)
    return np.where(recomputed, inputs, saved), np.where(recomputed, saved, 0.0)


def in_flight(stages: int, virtual_stages: int, micro_batches: int) -> np.ndarray:
    """Micro-batches' worth of its layers' activations each device holds at its peak (first to last).

    1F1B (Narayanan et al. 2021): device i holds min(p − i, m). Interleaved (v > 1): device i runs
    2(p − i − 1) + (v − 1)·p warm-up chunk steps, so it holds that plus one chunk of activations,
    each chunk 1/v of its layers (device 0: p + (p − 1)/v, Korthikanti et al. 2022, Sec. 4.2), at most m·v chunks.
    """
    index = np.arange(stages)
    if virtual_stages == 1:
        return np.minimum(stages - index, micro_batches).astype(float)
    chunks = 2 * (stages - index - 1) + (virtual_stages - 1) * stages + 1
    return np.minimum(chunks, micro_batches * virtual_stages) / virtual_stages
