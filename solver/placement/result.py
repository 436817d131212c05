"""What a placement search returns."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


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
    """The best placement found, and the fixed baseline's time or why it cannot run.

    `time_per_batch` [s] is math.inf (with no stages and None degrees) when nothing fits;
    `breakdown` splits it into the terms of `solver.training_step.BREAKDOWN_KEYS`. The baseline
    fields are both None when no baseline was asked for.
    """

    stages: tuple[PlacedStage, ...]
    data_parallel_degree: int | None
    tensor_parallel_width: int | None
    time_per_batch: float
    fixed_baseline_time: float | None = None
    fixed_baseline_infeasible_reason: str | None = None
    virtual_stages: int = 1
    recompute: str = "none"
    breakdown: dict[str, float] = field(default_factory=dict)
    expert_parallel_width: int = 1

    @property
    def feasible(self) -> bool:
        return math.isfinite(self.time_per_batch)
