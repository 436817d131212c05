"""The training step on a real cluster: time per batch with its breakdown and memory per device.

`TrainingStep` (model.py) is the faithful model of `shared/specs/training_step.md`: a `Cluster`
of link tiers (cluster.py), Megatron's layout and hierarchical collectives, mixed-precision memory
with a sharded optimizer and recomputation modes (memory.py), 1F1B and interleaved pipelines.
`original.py` is the original program's model, kept as the preset `system=original`. The placement
search, the fixed-placement scorer and the architecture search's bounds all go through these.
"""

from solver.training_step.cluster import Cluster, Collective, Tier
from solver.training_step.memory import MEMORY_KINDS, OPTIMIZERS, RECOMPUTE_MODES, ModelState, held_activations, in_flight
from solver.training_step.model import (BREAKDOWN_KEYS, Device, Placement, StepGraph, StepLayer, StepResult, Training,
                                        TrainingStep)

__all__ = [
    "BREAKDOWN_KEYS",
    "MEMORY_KINDS",
    "OPTIMIZERS",
    "RECOMPUTE_MODES",
    "Cluster",
    "Collective",
    "Device",
    "ModelState",
    "Placement",
    "StepGraph",
    "StepLayer",
    "StepResult",
    "Tier",
    "Training",
    "TrainingStep",
    "held_activations",
    "in_flight",
]
