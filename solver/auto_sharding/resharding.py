"""Placements of a tensor on a mesh and the cost of converting one into another.

A tensor's placement holds one entry per mesh axis, in PyTorch DTensor's vocabulary
(`torch.distributed.tensor.placement_types`): `Shard(dim)` (the devices along the axis hold equal
slices of tensor dim `dim`), `Replicate()` (each holds all of it) or `Partial()` (each holds a
full-size partial result; the tensor is their sum).

Conversion on one axis, source -> target:

| source \\ target | Replicate | Shard(d') |
| --- | --- | --- |
| Replicate | 0 | 0 (each device keeps its slice) |
| Shard(d) | all-gather | 0 if d' = d, else all-to-all |
| Partial | all-reduce | reduce-scatter |

A target is never Partial. On a multi-axis mesh each axis converts in turn, cheapest kind first
(slice, reduce-scatter, all-to-all, all-reduce, all-gather; mesh order within a kind), so that the
data shrink before they are moved; the collective over an axis is priced at the tensor's bytes
divided by the sizes of the other axes along which the tensor is sharded at that moment. (This order
is a rule, not a search over orders; on a one-axis mesh it is exact.)

An edge (an operator u's output read by an operator v) costs, per training step:

- forward: convert u's output placement to the placement v's strategy reads the operand in;
- backward (of a tensor with one reader; several readers' gradients are returned together, below):
  convert v's gradient of that operand to the placement u needs its output gradient in,
  which is u's output placement with Partial replaced by Replicate (a Partial output's gradient is
  the same on every device of the axis). v's gradient of an operand is, per axis: Shard on the
  operand's dim if the axis splits one of the operand's dims, Partial if it splits an iteration dim
  the operand lacks, Replicate if it splits nothing.

The gradients of one tensor from several readers are summed locally first where they share a
placement (a sum of pieces with one placement keeps it: Partial + Partial is Partial), and each
distinct placement among them is converted once to the producer's gradient placement, the converted
pieces then added on each device. When all readers agree (q, k and v reading one normalised input,
all Partial) the tensor pays one conversion, as Megatron-LM's one `copy_to_tensor_parallel_region`
per tensor (one backward all-reduce; Shoeybi et al. 2019, Sec. 3); when they differ each distinct
placement is converted on its own, as Alpa prices each edge (Zheng et al., OSDI'22, Sec. 4.2).
Simplification: pieces of different placements are never converted to a common placement first
(e.g. a Partial piece reduce-scattered onto a Shard piece and converted with it), which may be
cheaper.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .mesh import DeviceMesh


@dataclass(frozen=True, kw_only=True)
class Shard:
    """Split along tensor dim `dim` over the axis."""

    dim: int

    def __str__(self) -> str:
        return f"S({self.dim})"


@dataclass(frozen=True, kw_only=True)
class Replicate:
    """Whole on every device of the axis."""

    def __str__(self) -> str:
        return "R"


@dataclass(frozen=True, kw_only=True)
class Partial:
    """A full-size partial sum on every device of the axis."""

    def __str__(self) -> str:
        return "P"


Placement = Shard | Replicate | Partial
#: One placement per mesh axis.
TensorPlacement = tuple[Placement, ...]
REPLICATE = Replicate()
PARTIAL = Partial()

#: Conversion kinds in the order they run on a multi-axis mesh (None: nothing to do).
_ORDER = ("slice", "reduce_scatter", "all_to_all", "all_reduce", "all_gather")


def _kind(source: Placement, target: Placement) -> str | None:
    if isinstance(target, Partial):
        raise ValueError("a conversion's target is never Partial")
    if source == target:
        return None
    if isinstance(source, Replicate):
        return "slice"
    if isinstance(source, Partial):
        return "all_reduce" if isinstance(target, Replicate) else "reduce_scatter"
    return "all_gather" if isinstance(target, Replicate) else "all_to_all"


def conversion_cost(mesh: DeviceMesh, tensor_bytes: float, source: TensorPlacement, target: TensorPlacement) -> float:
    """Seconds to convert a tensor of `tensor_bytes` (whole) from `source` to `target` placement."""
    steps = sorted((_ORDER.index(kind), axis, kind)
                   for axis, (s, t) in enumerate(zip(source, target, strict=True))
                   if (kind := _kind(s, t)) is not None)
    current = list(source)
    seconds = 0.0
    for _, axis, kind in steps:
        if kind != "slice":
            shards = 1
            for other, placement in enumerate(current):
                if other != axis and isinstance(placement, Shard):
                    shards *= mesh.axes[other].size
            seconds += getattr(mesh.axes[axis].collectives, kind)(tensor_bytes / shards)
        current[axis] = target[axis]
    return seconds


def gradient_target(output: TensorPlacement) -> TensorPlacement:
    """The placement an operator needs its output's gradient in: its output's, Partial -> Replicate."""
    return tuple(REPLICATE if isinstance(p, Partial) else p for p in output)


def gradients_cost(mesh: DeviceMesh, tensor_bytes: float, gradients: Sequence[TensorPlacement],
                   target: TensorPlacement) -> float:
    """Seconds to return the gradients of one tensor from its readers (`gradients`, one placement each)
    in `target`: each distinct placement converted once (module docstring)."""
    return sum(conversion_cost(mesh, tensor_bytes, gradient, target) for gradient in dict.fromkeys(gradients))


def describe(placement: Sequence[Placement]) -> str:
    return "(" + ", ".join(str(p) for p in placement) + ")"
