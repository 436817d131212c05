"""What the placement DP returns."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class PlacedStage:
    """One pipeline stage: its layer ids (topological order), devices, peak memory per device [bytes]."""

    layer_ids: tuple[int, ...]
    devices: int
    memory_bytes: float


@dataclass(frozen=True)
class PlacementResult:
    """The best placement over all widths, and the fixed baseline's time or why it cannot run.

    `time_per_batch` [s] is math.inf (with no stages and None degrees) when no width fits.
    The baseline fields are both None when no baseline was asked for.
    """

    stages: tuple[PlacedStage, ...]
    data_parallel_degree: int | None
    tensor_parallel_width: int | None
    time_per_batch: float
    fixed_baseline_time: float | None = None
    fixed_baseline_infeasible_reason: str | None = None

    @property
    def feasible(self) -> bool:
        return math.isfinite(self.time_per_batch)
