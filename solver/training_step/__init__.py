"""The training step on a real cluster: time per batch with its breakdown and memory per device.

`TrainingStep` (model.py) prices one shard shape of a layout (solver.layout) on a cluster
(hardware): Megatron's layout and hierarchical collectives, mixed-precision memory with a sharded
optimizer and recomputation modes (memory.py), 1F1B and interleaved pipelines, under the training
options (options.py). Its per-layer terms are one pure function per concern (layer_terms.py), its
data-parallel concern `DataParallel` (data_parallel.py), its stage sums stages.py, its records
records.py; over_chips.py bounds it over candidate chips. `original.py` is the original program's
model. The two step models behind one interface are `solver.step_models`.
"""

from solver.training_step.memory import (
                                        MEMORY_KINDS,
                                        OPTIMIZERS,
                                        RECOMPUTE_ALLOWED,
                                        RECOMPUTE_MODES,
                                        ModelState,
                                        Recompute,
                                        held_activations,
                                        in_flight,
                                        recompute_mode,
)
from solver.training_step.model import TrainingStep
from solver.training_step.records import BREAKDOWN_KEYS, Device, Placement, StepGraph, StepLayer, StepResult
from solver.training_step.options import (DISPATCH_SMS, EXPERT_DISPATCHES, SHARDED_COLLECTIVES, SHARDINGS,
                                          TrainingOptions)

__all__ = [
    "BREAKDOWN_KEYS",
    "DISPATCH_SMS",
    "EXPERT_DISPATCHES",
    "MEMORY_KINDS",
    "OPTIMIZERS",
    "RECOMPUTE_ALLOWED",
    "RECOMPUTE_MODES",
    "SHARDED_COLLECTIVES",
    "SHARDINGS",
    "Device",
    "ModelState",
    "Recompute",
    "Placement",
    "StepGraph",
    "StepLayer",
    "StepResult",
    "TrainingOptions",
    "TrainingStep",
    "held_activations",
    "in_flight",
    "recompute_mode",
]
