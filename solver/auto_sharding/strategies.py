"""An operator's sharding strategies on a mesh and what each costs on its own.

A strategy assigns each mesh axis at most one of the operator's iteration dims, no dim to two axes
(a dim is split over one axis; two dims over two axes). From it follow:

- each operand's read placement: Shard on the axis that splits one of its dims, else Replicate;
- the output's placement: Shard on the axis that splits one of its dims, Partial on an axis that
  splits a contracted dim, else Replicate;
- each operand's gradient placement (the backward pass of the einsum): Shard on the axis that splits
  one of its dims, Partial on an axis that splits a dim it lacks, else Replicate;
- compute: forward FLOPs × (1 + `backward_flops_ratio`) × `seconds_per_flop`, divided by the sizes
  of the axes that split a dim (an axis that splits nothing repeats the work on each device);
- memory per device: each parameter's elements on one device × (its element bytes +
  `state_bytes_per_parameter`, the gradient and optimizer bytes kept per parameter);
- weight-gradient synchronisation: a parameter's gradient Partial over an axis is all-reduced over
  that axis once per step (data-parallel gradient sync, as Alpa counts it: Zheng et al. OSDI'22,
  Sec. 4.2), at the parameter's bytes divided by the sizes of its other sharded axes.

A dim is split over an axis only if the axis's size divides it; an axis of size 1 splits nothing.
With `replicated_compute=False` a product splits a dim over every axis of size > 1 (Alpa's rule
that heavy operators are never replicated, Sec. 4.2), unless no such strategy exists, when it may
leave axes unsplit. Dims an operator fixes (`Op.fixed`) are never split.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from phaze_common.checks import non_negative_number

from .graph import Op, Operand, ShardingGraph
from .mesh import DeviceMesh
from .resharding import PARTIAL, REPLICATE, Shard, TensorPlacement


@dataclass(frozen=True, kw_only=True)
class CostSettings:
    """Prices that are not communication: the forward time of one FLOP on one device [s], the
    backward pass's FLOPs per forward FLOP, the gradient and optimizer bytes kept per parameter
    beside the weight itself, and whether a product may be computed whole on every device."""

    seconds_per_flop: float = 0.0
    backward_flops_ratio: float = 2.0
    state_bytes_per_parameter: float = 0.0
    replicated_compute: bool = False

    def __post_init__(self) -> None:
        non_negative_number("seconds_per_flop", self.seconds_per_flop)
        non_negative_number("backward_flops_ratio", self.backward_flops_ratio)
        non_negative_number("state_bytes_per_parameter", self.state_bytes_per_parameter)


@dataclass(frozen=True, kw_only=True)
class Strategy:
    """The iteration dim each mesh axis splits (None: none), in mesh axis order."""

    splits: tuple[str | None, ...]

    def readable(self, mesh: DeviceMesh) -> dict[str, str] | str:
        """{"axis": "dim", ...} for the splitting axes, or "replicated"."""
        found = {axis.name: dim for axis, dim in zip(mesh.axes, self.splits) if dim is not None}
        return found or "replicated"

    def __str__(self) -> str:
        return ",".join(dim or "-" for dim in self.splits)


@dataclass(frozen=True, kw_only=True)
class StrategyCost:
    """One strategy's placements and its own costs [s, bytes]."""

    reads: tuple[TensorPlacement, ...]
    gradients: tuple[TensorPlacement, ...]
    output: TensorPlacement
    compute: float
    weight_sync: float
    memory: float


def strategies(op: Op, mesh: DeviceMesh, settings: CostSettings) -> tuple[Strategy, ...]:
    """Every strategy of `op` on `mesh` under the rules of the module docstring."""
    options = []
    for axis in mesh.axes:
        dims = [] if axis.size == 1 else [d for d, size in op.sizes if d not in op.fixed and size % axis.size == 0]
        options.append([None, *dims])
    found = [Strategy(splits=combo) for combo in itertools.product(*options)
             if len({d for d in combo if d is not None}) == sum(d is not None for d in combo)]
    if op.heavy and not settings.replicated_compute:
        split_all = [s for s in found
                     if all(d is not None or axis.size == 1 for axis, d in zip(mesh.axes, s.splits))]
        if split_all:
            return tuple(split_all)
    return tuple(found)


def _placement(operand: Operand, strategy: Strategy, absent) -> TensorPlacement:
    return tuple(REPLICATE if dim is None else Shard(dim=operand.dims.index(dim)) if dim in operand.dims else absent
                 for dim in strategy.splits)


def shards(placement: TensorPlacement, mesh: DeviceMesh, skip: int | None = None) -> int:
    """How many pieces the tensor is cut into on one device (over the axes but `skip`)."""
    return math.prod(axis.size for index, (axis, p) in enumerate(zip(mesh.axes, placement))
                     if index != skip and isinstance(p, Shard))


def strategy_cost(graph: ShardingGraph, op: Op, strategy: Strategy, mesh: DeviceMesh,
                  settings: CostSettings) -> StrategyCost:
    """The placements and own costs of `op` under `strategy` (module docstring)."""
    reads = tuple(_placement(operand, strategy, REPLICATE) for operand in op.inputs)
    gradients = tuple(_placement(operand, strategy, PARTIAL) for operand in op.inputs)
    divisor = math.prod(axis.size for axis, dim in zip(mesh.axes, strategy.splits) if dim is not None)
    compute = op.flops * (1 + settings.backward_flops_ratio) * settings.seconds_per_flop / divisor
    memory = weight_sync = 0.0
    for operand, read, gradient in zip(op.inputs, reads, gradients):
        tensor = graph.tensor(operand.tensor)
        if not tensor.parameter:
            continue
        memory += tensor.elements / shards(read, mesh) * (tensor.element_bytes + settings.state_bytes_per_parameter)
        for index, (axis, placement) in enumerate(zip(mesh.axes, gradient)):
            if placement == PARTIAL:
                weight_sync += axis.collectives.all_reduce(tensor.bytes / shards(read, mesh, skip=index))
    return StrategyCost(reads=reads, gradients=gradients, output=_placement(op.output, strategy, PARTIAL),
                        compute=compute, weight_sync=weight_sync, memory=memory)
