"""The training job: one frozen object with everything a search is asked about, passed down whole.

A job is the model (its spec, sequence length and micro-batch size), the batch, the cluster
(`system`), the memory of each device (the HBM sizes searched), how it trains (optimizer, sharding,
sequence parallelism, overlap), and the placement options searched (tensor-parallel widths,
recomputation modes, virtual stages, expert-parallel widths). `step_model` is "training_step" (the faithful model of
`solver.training_step`) or "original" (the original program's, `system=original`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from graph_extract import ModelSpec
from solver.placement.inputs import FixedStrategy
from solver.training_step.cluster import Cluster
from solver.training_step.memory import RECOMPUTE_MODES
from solver.training_step.model import Training

STEP_MODELS = ("training_step", "original")


@dataclass(frozen=True)
class Job:
    spec: ModelSpec
    sequence_length: int
    micro_batch_size: int
    global_batch_size: int
    tensor_parallel_widths: tuple[int, ...]
    system: Cluster
    memory_capacities: tuple[int, ...]  # bytes of HBM per device, one search each
    training: Training = Training()
    recompute: tuple[str, ...] = RECOMPUTE_MODES
    virtual_stages: tuple[int, ...] | None = None  # None: 1 and every v the blocks allow
    step_model: str = "training_step"
    fixed_megatron: FixedStrategy | None = None
    expert_parallel_widths: tuple[int, ...] = (1,)  # searched; each divides the model's experts

    def __post_init__(self) -> None:
        if self.step_model not in STEP_MODELS:
            raise ValueError(f"step_model: unknown {self.step_model!r}; allowed: {', '.join(STEP_MODELS)}")
        unknown = [mode for mode in self.recompute if mode not in RECOMPUTE_MODES]
        if unknown or not self.recompute:
            raise ValueError(f"recompute: unknown {unknown[0] if unknown else 'empty list'!r}; "
                             f"allowed: {', '.join(RECOMPUTE_MODES)}")
        experts = self.spec.num_experts or 1
        wrong = [e for e in self.expert_parallel_widths if isinstance(e, bool) or not isinstance(e, int) or e < 1
                 or experts % e]
        if wrong or not self.expert_parallel_widths:
            raise ValueError(f"expert_parallel_width: {wrong[0] if wrong else 'empty list'!r} does not divide the "
                             f"{experts} experts of {self.spec.name}; allowed: a divisor of {experts}")
        if self.global_batch_size % self.micro_batch_size:
            raise ValueError(f"micro_batch_size: {self.micro_batch_size} does not divide "
                             f"global_batch_size={self.global_batch_size}")

    @property
    def micro_batches(self) -> int:
        """Micro-batches per global batch."""
        return self.global_batch_size // self.micro_batch_size

    @property
    def devices(self) -> int:
        return self.system.num_devices

    def record(self) -> dict:
        """The job as plain data (for cache keys and results)."""
        return dataclasses.asdict(self)
