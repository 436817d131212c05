"""What the placement DP reads: layer graphs (one per tensor-parallel width) and settings.

Units are SI: bytes, seconds, bytes/second. The DP itself is unit-agnostic (it only adds,
multiplies and compares), so the original's JSON inputs (latencies in ms) pass through unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from phaze_common.checks import InputError, boolean, choice, integer, non_negative_number
from solver.training_step.original import OPTIMIZERS, OriginalStep

#: Largest number of devices and largest tensor-parallel width accepted (the original's bound).
DEVICES_LIMIT = 10_000


def check_amount(owner: str, field: str, value: object) -> None:
    """InputError unless `value` is a finite real number ≥ 0."""
    non_negative_number(f"{owner}.{field}", value)


def check_count(owner: str, field: str, value: object, low: int | None = None, high: int | None = None) -> None:
    """InputError unless `value` is an int (not a bool) in [low, high] (None: unbounded)."""
    integer(f"{owner}.{field}", value, low, high)


@dataclass(frozen=True)
class PlacementLayer:
    """One layer (a node of the layer graph) as one tensor-parallel slice sees it.

    Latencies [s] are per micro-batch and include the layer's tensor-parallel collectives, of which
    `collective_latency` (forward + backward) is reported apart in a breakdown.
    `activation_bytes` is what the layer keeps for its backward pass; `tensor_parallel` says the
    layer is split over the width's devices (a stage holding one uses `width` devices, else 1).
    """

    id: int
    parameter_bytes: float
    activation_bytes: float
    forward_latency: float
    backward_latency: float
    tensor_parallel: bool
    collective_latency: float = 0.0

    def __post_init__(self) -> None:
        check_count("PlacementLayer", "id", self.id)
        for field in ("parameter_bytes", "activation_bytes", "forward_latency", "backward_latency",
                      "collective_latency"):
            check_amount("PlacementLayer", field, getattr(self, field))
        boolean("PlacementLayer.tensor_parallel", self.tensor_parallel)


@dataclass(frozen=True)
class PlacementEdge:
    """Data flowing from layer `source` to layer `dest`: `bytes` per micro-batch."""

    source: int
    dest: int
    bytes: float

    def __post_init__(self) -> None:
        check_count("PlacementEdge", "source", self.source)
        check_count("PlacementEdge", "dest", self.dest)
        if self.source == self.dest:
            raise ValueError(f"PlacementEdge {self.source}->{self.dest}: source and dest must differ")
        check_amount("PlacementEdge", "bytes", self.bytes)


@dataclass(frozen=True)
class PlacementGraph:
    """The layer graph at one tensor-parallel width; list order matters only for tie-breaking."""

    layers: tuple[PlacementLayer, ...]
    edges: tuple[PlacementEdge, ...]

    def __post_init__(self) -> None:
        if not self.layers:
            raise ValueError("PlacementGraph.layers must not be empty")
        ids = [layer.id for layer in self.layers]
        if len(set(ids)) != len(ids):
            raise ValueError(f"PlacementGraph.layers has duplicate ids: {sorted(_duplicates(ids))}")
        known = set(ids)
        pairs = [(e.source, e.dest) for e in self.edges]
        for source, dest in pairs:
            if source not in known or dest not in known:
                raise ValueError(f"PlacementGraph.edges: edge {source}->{dest} names an unknown layer id")
        if len(set(pairs)) != len(pairs):
            raise ValueError(f"PlacementGraph.edges has duplicate edges: {sorted(_duplicates(pairs))}")


def _duplicates(items: list) -> set:
    seen: set = set()
    return {item for item in items if item in seen or seen.add(item)}


@dataclass(frozen=True)
class FixedStrategy:
    """A hand-picked Megatron-style baseline, laid out as the original program does.

    Stage k (0-based) holds the layers at topological positions i < num_transformer_layers with
    i // ceil(num_transformer_layers / pipeline_parallel_width) == k; the last stage also holds every layer
    at a position ≥ num_transformer_layers. Positions, not layer ids, are used (original behaviour,
    kept for parity: with an embedding layer first, every block shifts one stage position).
    Every stage gets `tensor_parallel_width` devices.
    """

    pipeline_parallel_width: int
    tensor_parallel_width: int
    data_parallel_width: int
    num_transformer_layers: int

    def __post_init__(self) -> None:
        check_count("FixedStrategy", "pipeline_parallel_width", self.pipeline_parallel_width, 1)
        check_count("FixedStrategy", "tensor_parallel_width", self.tensor_parallel_width, 1)
        check_count("FixedStrategy", "data_parallel_width", self.data_parallel_width, 1)
        check_count("FixedStrategy", "num_transformer_layers", self.num_transformer_layers, 0)


@dataclass(frozen=True)
class PlacementSettings(OriginalStep):
    """The cluster and training setup of the original program's placement (`system=original`): its
    step model (`memory_per_device` [bytes], `bandwidth` [bytes/s] between stages and for the
    data-parallel sync, ...), checked, and the fixed baseline to score beside the result.
    """

    fixed_baseline: FixedStrategy | None = None

    def __post_init__(self) -> None:
        check_count("PlacementSettings", "devices", self.devices, 1, DEVICES_LIMIT)
        for field in ("memory_per_device", "bandwidth"):
            check_amount("PlacementSettings", field, getattr(self, field))
            if getattr(self, field) < 1e-9:
                raise InputError(f"PlacementSettings.{field}: must be >= 1e-9, got {getattr(self, field)!r}")
        check_count("PlacementSettings", "micro_batches_per_batch", self.micro_batches_per_batch, 1)
        boolean("PlacementSettings.activation_recomputation", self.activation_recomputation)
        choice("PlacementSettings.optimizer", self.optimizer, OPTIMIZERS)
        if self.fixed_baseline is not None and not isinstance(self.fixed_baseline, FixedStrategy):
            raise ValueError(f"PlacementSettings.fixed_baseline must be a FixedStrategy or None, got {self.fixed_baseline!r}")
