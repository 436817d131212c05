"""How the model is trained, besides its layout: one hashable value the step model, the placement
search and every cache key read.

* `optimizer`: `adam` (mixed precision: 16-bit weights, fp32 gradients, fp32 master weights and two
  moments) or `sgd` (16-bit weights and gradients, the original program's);
* `data_parallel_sharding`: what the data-parallel replicas split among them: `none` (each holds
  everything), `optimizer` (the optimizer state: ZeRO stage 1, Megatron's distributed optimizer);
* `overlap_grad_reduce`: each stage's gradient sync hides behind its last micro-batch's backward pass
  (PyTorch DDP's buckets, Megatron's --overlap-grad-reduce);
* `grad_reduce_in_bf16`: the gradients are kept and reduced in 16-bit instead of fp32 main gradients
  (Megatron's --grad-reduce-in-bf16).
A new training option is a field here and the formula in the step model that reads it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property

from common.checks import boolean, choice
from solver.training_step.memory import OPTIMIZERS, ModelState

#: What the data-parallel replicas may split among them.
SHARDINGS = ("none", "optimizer")


@dataclass(frozen=True)
class TrainingOptions:
    """Optimizer, data-parallel sharding and overlaps (module docstring)."""

    optimizer: str = "adam"
    data_parallel_sharding: str = "optimizer"
    overlap_grad_reduce: bool = False
    grad_reduce_in_bf16: bool = False

    def __post_init__(self) -> None:
        choice("optimizer", self.optimizer, OPTIMIZERS)
        choice("data_parallel_sharding", self.data_parallel_sharding, SHARDINGS)
        boolean("overlap_grad_reduce", self.overlap_grad_reduce)
        boolean("grad_reduce_in_bf16", self.grad_reduce_in_bf16)

    @cached_property
    def model_state(self) -> ModelState:
        return ModelState.of(self.optimizer, self.data_parallel_sharding == "optimizer", self.grad_reduce_in_bf16)

    def record(self) -> dict:
        return dataclasses.asdict(self)
