"""The time of a layer on a GPU: a roofline per fused operator, the operators one after another.

The operators are fused as on the template (`estimator.fusion`: a GEMM with its epilogue, chains of
elementwise operators), each group one kernel. Forward, a group takes

    max(Σ over its GEMMs of FLOPs / (peak · matrix_efficiency · waves),  bytes / (HBM bandwidth · memory_efficiency))

* FLOPs: 2 per multiply-accumulate; `waves` is the wave quantisation of the GEMM's 128 × 128 output
  tiles over the streaming multiprocessors (tiles / (⌈tiles / SMs⌉ · SMs)). In FP8 training
  (`KnownChip.with_precision("fp8")`) peak · matrix_efficiency is the FP8 dense peak times the FP8
  GEMM efficiency; bytes stay 16-bit.
* bytes: what the group reads from HBM (inputs made outside it, weights) and writes (outputs used
  outside it).
Backward, a GEMM gives its data- and weight-gradient GEMMs (as many FLOPs each as forward) and a
group moves twice its forward bytes (it reads the output gradient and what it saved, and writes the
input gradient). Collectives take no time here: the training-step model charges them on the
cluster. The operators the kernel options split (sequence parallelism: those replicated over the
tensor-parallel group) move 1/t of their bytes. Simplifications: vector arithmetic is never the bound, caches do not keep tensors
between kernels, and a kernel costs nothing to launch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from estimator.fusion import FusedOp, fuse_layers
from estimator.work import BACKWARD, FORWARD, Gemm, op_work
from graph_extract.kernels import KernelOptions
from graph_extract.opgraph import OpGraph
from hardware import KnownChip

#: Output tile of a GEMM kernel (rows x columns), for the wave quantisation.
TILE = 128


@dataclass(frozen=True)
class LayerTimes:
    """Seconds of a layer per micro-batch on one device: forward, backward, and the forward of its
    attention core (what selective recomputation re-runs)."""

    forward: float
    backward: float
    attention_core_forward: float


def waves(gemm: Gemm, processors: int) -> float:
    """The fraction of the GPU a GEMM's output tiles keep busy over its waves."""
    tiles = gemm.batch * math.ceil(gemm.n / TILE) * math.ceil(gemm.k / TILE)
    return tiles / (math.ceil(tiles / processors) * processors)


def group_bytes(graph: OpGraph, op: FusedOp, split: Sequence[float]) -> float:
    """Bytes a fused group reads and writes forward; `split[v]` scales what operator v moves."""
    members = set(op.members)
    total = 0.0
    for member in op.members:
        node = graph.nodes[member]
        moved = sum(math.prod(shape) * (graph.nodes[source].dtype_bytes if source is not None else node.dtype_bytes)
                    for shape, source in zip(node.input_shapes, node.inputs or [None] * len(node.input_shapes))
                    if source not in members)
        moved += sum(math.prod(shape) for shape in node.weight_shapes) * node.dtype_bytes
        if not graph.successors(member) or any(user not in members for user in graph.successors(member)):
            moved += node.output_bytes
        total += moved * split[member]
    return total


def op_seconds(graph: OpGraph, op: FusedOp, direction: str, chip: KnownChip, split: Sequence[float]) -> float:
    """The roofline time of one fused group in one direction (module docstring)."""
    gemms = op_work(graph.nodes[op.members[0]], direction).gemms
    compute = sum(2 * gemm.macs / (chip.matrix_flops * waves(gemm, chip.streaming_multiprocessors))
                  for gemm in gemms)
    moved = group_bytes(graph, op, split) * (2 if direction == BACKWARD else 1)
    return max(compute, moved / (chip.hbm_bandwidth * chip.memory_efficiency))


def layer_times(graph: OpGraph, layer: int, chip: KnownChip, kernels: KernelOptions,
                core: frozenset[int] = frozenset()) -> LayerTimes:
    """Forward, backward and attention-core forward seconds of `layer` of `graph` on `chip`."""
    width = graph.tensor_parallel_width
    divided = kernels.split_operators(graph)
    split = [1.0 / width if divided and divided[node.id] else 1.0 for node in graph.nodes]
    (fused,) = fuse_layers(graph, (layer,))
    forward = [op_seconds(graph, op, FORWARD, chip, split) for op in fused.ops]
    backward = [op_seconds(graph, op, BACKWARD, chip, split) for op in fused.ops]
    attention = [seconds for op, seconds in zip(fused.ops, forward) if op.members[0] in core]
    return LayerTimes(sum(forward), sum(backward), sum(attention))
