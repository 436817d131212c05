"""What a placement search returns."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from solver.layout import Layout


@dataclass(frozen=True)
class PlacedStage:
    """One pipeline device's share of the model: layer ids (topological order; with interleaving,
    its chunks one after the other), devices (the tensor-parallel group), parameters held per
    device and peak memory per device by kind [bytes] ("weights", "gradients", "optimizer_state",
    "activations", "total")."""

    layer_ids: tuple[int, ...]
    devices: int
    parameters: float = 0.0
    memory: dict[str, float] = field(default_factory=dict)

    @property
    def memory_bytes(self) -> float:
        return self.memory.get("total", 0.0)


@dataclass(frozen=True)
class PlacementResult:
    """The best placement found: its layout and stages, its time per batch [s] split into the terms
    of `solver.training_step.BREAKDOWN_KEYS`, its recomputation mode; `layout` None and the time
    math.inf (no stages) when nothing fits. The original program's JSON interface also reports its
    fixed baseline's time or why it cannot run (both None when none was asked for).
    """

    stages: tuple[PlacedStage, ...]
    layout: Layout | None
    time_per_batch: float
    recompute: str = "none"
    breakdown: dict[str, float] = field(default_factory=dict)
    fixed_baseline_time: float | None = None
    fixed_baseline_infeasible_reason: str | None = None
    data_parallel_sharding: str | None = None  # the training step model's (None: the original's)

    @property
    def feasible(self) -> bool:
        return math.isfinite(self.time_per_batch)

    @classmethod
    def from_record(cls, record: dict) -> PlacementResult:
        """The inverse of `dataclasses.asdict`."""
        stages = tuple(PlacedStage(**{**stage, "layer_ids": tuple(stage["layer_ids"])}) for stage in record["stages"])
        layout = None if record["layout"] is None else Layout(**record["layout"])
        return cls(**{**record, "stages": stages, "layout": layout})
