"""What a run is asked: the fixed question and the axes it sweeps.

* `Question`: the model, its sequence and global batch, the cluster it trains on, how it trains (the
  training and kernel options), the step model that prices it and the fixed layout compared against.
  Nothing in it is searched.
* `Axes`: what is swept — micro-batch sizes, HBM sizes, recomputation modes, tensor-parallel widths,
  virtual stages, expert-parallel widths, context-parallel widths and data-parallel shardings (None:
  the question's `training.data_parallel_sharding`). A search over one micro-batch size and one HBM size is
  `axes.at(micro_batch_size=..., memory_capacity=...)`; the placement search covers the rest.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from phaze_common.checks import InputError, choice
from graph_extract import KernelOptions, ModelSpec
from phaze_hardware import Network
from solver.layout import Layout, MegatronSplit
from solver.training_step.memory import RECOMPUTE_MODES, SHARDINGS, recompute_mode
from solver.training_step.options import TrainingOptions


@dataclass(frozen=True)
class Question:
    """The fixed question (module docstring); `step_model` names one of `solver.step_models`."""

    model: ModelSpec
    sequence_length: int
    global_batch_size: int
    cluster: Network
    training: TrainingOptions = TrainingOptions()
    kernels: KernelOptions = KernelOptions()
    step_model: str = "training_step"
    baseline: Layout | None = None  # the fixed Megatron layout a result is compared against
    baseline_split: MegatronSplit = MegatronSplit()  # how that layout splits the blocks
    # bytes/s per direction between a device and host memory (its chip's `host_link_bandwidth`): what
    # `training.activation_offload` reads; None without offload
    host_link_bandwidth: float | None = None

    def __post_init__(self) -> None:
        if self.training.tensor_parallel_overlap and not self.kernels.sequence_parallel:
            raise InputError("tensor_parallel_overlap: needs sequence_parallel=true (Transformer Engine's "
                             "userbuffers overlap its all-gathers and reduce-scatters); allowed here: false")
        if self.training.fp8_parameters and self.kernels.precision != "fp8":
            why = ("Megatron-Core gathers MXFP8 weights in BF16 and quantises them after: not priced"
                   if self.kernels.precision == "mxfp8" else "16-bit training has no FP8 weights")
            raise InputError(f"fp8_parameters: needs precision=fp8 ({why}); allowed here: false")
        if self.training.offloads_activations and not self.host_link_bandwidth:
            raise InputError("activation_offload: needs a chip stating host_link_bandwidth (a known chip's "
                             "figure); allowed here: none")

    def micro_batches(self, micro_batch_size: int) -> int:
        """Micro-batches per global batch."""
        return self.global_batch_size // micro_batch_size

    @property
    def experts(self) -> int:
        """Experts of each mixture-of-experts block (1: a dense model)."""
        return self.model.num_experts or 1

    def record(self) -> dict:
        """The question as plain data (cache keys, results)."""
        return {"model": dataclasses.asdict(self.model), "sequence_length": self.sequence_length,
                "global_batch_size": self.global_batch_size, "cluster": self.cluster.to_dict(),
                "training": self.training.record(), "kernels": self.kernels.record(), "step_model": self.step_model,
                "baseline": None if self.baseline is None else dataclasses.asdict(self.baseline),
                **({"baseline_split": dataclasses.asdict(self.baseline_split)}
                   if self.baseline_split != MegatronSplit() else {}),
                **({"host_link_bandwidth": self.host_link_bandwidth} if self.host_link_bandwidth is not None else {})}


@dataclass(frozen=True)
class Axes:
    """The swept axes (module docstring); `virtual_stages` None: 1 and every v the blocks allow."""

    micro_batch_sizes: tuple[int, ...]
    memory_capacities: tuple[int, ...]  # bytes of HBM per device
    recompute: tuple[str, ...] = RECOMPUTE_MODES
    tensor_parallel_widths: tuple[int, ...] = (1,)
    virtual_stages: tuple[int, ...] | None = None
    expert_parallel_widths: tuple[int, ...] = (1,)
    context_parallel_widths: tuple[int, ...] = (1,)
    data_parallel_shardings: tuple[str, ...] | None = None
    expert_tensor_parallel_widths: tuple[int | None, ...] = (None,)  # None: t (`Layout`)

    def __post_init__(self) -> None:
        for field in ("micro_batch_sizes", "memory_capacities", "recompute", "tensor_parallel_widths",
                      "expert_parallel_widths", "context_parallel_widths"):
            if not getattr(self, field):
                raise InputError(f"{field}: must hold at least one value")
        # each mode by its one name (`recompute_mode`: "core_attn" is "selective"), once
        object.__setattr__(self, "recompute", tuple(dict.fromkeys(recompute_mode(mode) for mode in self.recompute)))
        for mode in self.data_parallel_shardings or ():
            choice("data_parallel_sharding", mode, SHARDINGS)

    def shardings(self, question: Question) -> tuple[str, ...]:
        """The data-parallel shardings searched: these axes', or the question's one."""
        return self.data_parallel_shardings or (question.training.data_parallel_sharding,)

    def at(self, micro_batch_size: int | None = None, memory_capacity: int | None = None,
           recompute: str | None = None) -> Axes:
        """These axes at one micro-batch size, HBM size or recomputation mode."""
        narrowed = {}
        if micro_batch_size is not None:
            narrowed["micro_batch_sizes"] = (micro_batch_size,)
        if memory_capacity is not None:
            narrowed["memory_capacities"] = (memory_capacity,)
        if recompute is not None:
            narrowed["recompute"] = (recompute,)
        return dataclasses.replace(self, **narrowed)

    @property
    def micro_batch_size(self) -> int:
        """The micro-batch size of axes narrowed to one."""
        (size,) = self.micro_batch_sizes
        return size

    @property
    def memory_capacity(self) -> int:
        """The HBM size [bytes] of axes narrowed to one."""
        (capacity,) = self.memory_capacities
        return capacity

    def shards(self) -> list[Layout]:
        """The shard shapes searched (t, e, c, τ), by context-parallel width, then expert-parallel
        width, then tensor-parallel width, then expert tensor-parallel width (t first; a τ that does
        not divide t is not a shape of that t)."""
        shards = [Layout(t, expert_parallel_width=e, context_parallel_width=c, expert_tensor_parallel_width=tau)
                  for c in sorted(self.context_parallel_widths) for e in sorted(self.expert_parallel_widths)
                  for t in sorted(self.tensor_parallel_widths)
                  for tau in sorted(self.expert_tensor_parallel_widths, key=lambda tau: (tau is not None, tau or 0))
                  if tau is None or t % tau == 0]
        return list(dict.fromkeys(shards))

    def expert_splits(self, width: int) -> tuple[float, ...]:
        """The expert splits e·τ/t ≠ 1 of the width-t shards searched (`Layout.expert_split`: how
        many times fewer experts a device holds than a rank of the width-t graph), in order."""
        return tuple(sorted({shard.expert_split for shard in self.shards()
                             if shard.tensor_parallel_width == width} - {1.0}))

    def record(self) -> dict:
        return dataclasses.asdict(self)


def check_micro_batches(question: Question, axes: Axes) -> None:
    """InputError for a micro-batch size that does not divide the global batch."""
    for size in axes.micro_batch_sizes:
        if question.global_batch_size % size:
            raise InputError(f"micro_batch_size: {size} does not divide global_batch_size={question.global_batch_size}")


def check_expert_widths(question: Question, axes: Axes) -> None:
    """InputError for an expert-parallel width that does not divide the model's experts."""
    for width in axes.expert_parallel_widths:
        if question.experts % width:
            what = (f"the {question.experts} experts of {question.model.name}" if question.model.num_experts
                    else f"{question.model.name} (no experts)")
            allowed = [e for e in range(1, question.experts + 1) if question.experts % e == 0]
            raise InputError(f"expert_parallel_width: {width!r} does not divide {what}; "
                             f"allowed: {', '.join(map(str, allowed))}")


def context_widths(sequence_length: int, most: int) -> tuple[int, ...]:
    """The powers of two c up to `most` whose 2c load-balanced chunks split a sequence evenly
    (Megatron-Core asserts the sequence a multiple of 2c; 1: no split)."""
    return tuple(c for c in (2**i for i in range(most.bit_length())) if c == 1 or sequence_length % (2 * c) == 0)


def context_problem(question: Question, width: int) -> str | None:
    """Why the question's sequences cannot be split over `width` context-parallel ranks, or None:
    the load-balanced split cuts each sequence into 2c equal chunks (Megatron-Core asserts the
    sequence a multiple of 2c) and passes K and V around a fused attention kernel's ring
    (Transformer Engine's context parallelism runs on flash attention only)."""
    if width == 1:
        return None
    if question.sequence_length % (2 * width):
        allowed = context_widths(question.sequence_length, question.sequence_length)
        return (f"context_parallel_width: {width} does not split the {question.sequence_length}-token sequences "
                f"into 2 x {width} equal chunks; allowed: {', '.join(map(str, allowed))}")
    if not question.kernels.flash_attention:
        return f"context_parallel_width: {width} needs flash_attention=true (ring attention runs on a fused kernel)"
    return None


def check_context_widths(question: Question, axes: Axes) -> None:
    """InputError for a context-parallel width the question's sequences cannot take."""
    for width in axes.context_parallel_widths:
        problem = context_problem(question, width)
        if problem is not None:
            raise InputError(problem)
