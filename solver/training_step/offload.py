"""Activation offload to host memory (`TrainingOptions.activation_offload`): what a device keeps in
HBM of the blocks' activations, and the exposed seconds of the copies.

Per micro-batch, a stage copies its blocks' kept activations out to host memory during the forward
pass and back during the backward pass, each direction on DMA engines of its own beside the compute
(Megatron-Core's --cpu-offloading copies on a side CUDA stream; XLA's host offload is asynchronous):

    out  = offloaded bytes / host link bandwidth, hidden behind the forward compute
    in   = offloaded bytes / host link bandwidth, hidden behind the backward compute (with its
           recomputation, which runs in the backward pass)
    exposed = max(0, out − forward) + max(0, in − backward)

The host link's bandwidth is per direction (a PCIe x16 link or NVLink-C2C carries both directions
at once); the transfers of one direction are taken to overlap the whole pass (a simplification: the
first block's copy out and the last block's copy in cannot hide behind another block's compute).
"""

from __future__ import annotations

import numpy as np

#: Blocks' kept activations a device holds in HBM with offload: the running block's and the one
#: prefetched (the copy back of the next block's activations during a block's backward pass).
OFFLOAD_BUFFERS = 2


def offload_seconds(offloaded_bytes, forward_seconds, backward_seconds, host_link_bandwidth: float
                    ) -> tuple[np.ndarray, np.ndarray]:
    """(exposed, hidden) seconds per micro-batch of copying `offloaded_bytes` out to host memory
    during a forward pass of `forward_seconds` and back during a backward pass of
    `backward_seconds`, at `host_link_bandwidth` bytes/s per direction (module docstring)."""
    transfer = np.asarray(offloaded_bytes, float) / host_link_bandwidth
    exposed = np.maximum(transfer - forward_seconds, 0.0) + np.maximum(transfer - backward_seconds, 0.0)
    return exposed, 2.0 * transfer - exposed


def split_offloaded(held: np.ndarray, blocks: np.ndarray, offload: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per layer: (bytes kept in HBM per micro-batch in flight, bytes offloaded per micro-batch) of
    the `held` bytes each layer keeps (`memory.held_activations`): with `offload` the transformer
    blocks' (`blocks`) go to host memory, the embedding's and the head's stay."""
    if not offload:
        return held, np.zeros(len(held))
    return np.where(blocks, 0.0, held), np.where(blocks, held, 0.0)


def buffered_bytes(largest_offloaded):
    """HBM bytes a device holds of the offloaded blocks' activations: `OFFLOAD_BUFFERS` of its largest
    block's (the running block's and the one in transfer)."""
    return OFFLOAD_BUFFERS * largest_offloaded


def stage_offload_seconds(terms, training, device) -> tuple[np.ndarray, np.ndarray]:
    """(exposed, hidden) seconds per micro-batch of each stage's activation copies (`terms`: a
    `StageTerms`) to host memory and back: the forward's behind its forward compute, the backward's
    behind its backward compute and recomputation (`offload_seconds`); zeros unless `training`
    offloads. ValueError if `device` has no host link (the question's check lets no such step through)."""
    if not training.offloads_activations:
        zero = np.zeros_like(terms.compute)
        return zero, zero
    if not device.host_link_bandwidth:
        raise ValueError("activation_offload: the device has no host_link_bandwidth (internal error: the "
                         "question's check lets no such step through)")
    return offload_seconds(terms.offloaded_activations, terms.forward, terms.compute - terms.forward + terms.recompute,
                           device.host_link_bandwidth)
