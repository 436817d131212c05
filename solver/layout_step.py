"""One training step of a given layout on a known chip: what `phaze predict`, `phaze validate` and the
Python API's `phaze.predict` compute.

The placement is Megatron's: p stages (v chunks each) of equal numbers of blocks, the embedding with
the first and the head with the last (or, when the blocks alone do not split, with the embedding and
the loss counted as a block each), replicated d times on t-wide tensor-parallel groups. Layer costs
come from the chip's cost model (a roofline for GPUs, the template's schedules for a template chip);
the step is priced by `solver.training_step`.

FLOPs are counted as the field does (Narayanan et al. 2021): the model FLOPs of a batch are three
passes (forward, and two for backward) of every matrix product, 72·B·s·L·h²·(1 + s/(6h) +
V/(12·L·h)) for a GPT; the hardware FLOPs add the recomputed forward products. MFU = model FLOPs
per second / the peak of all devices.
"""

from __future__ import annotations

from dataclasses import dataclass

from phaze_common.checks import InputError
from graph_extract import ExtractedModel, KernelOptions
from phaze_hardware import KnownChip
from solver.layout import FitRules, Layout, MegatronSplit
from solver.placement.layouts import megatron_chunks
from solver.question import Axes, Question, context_problem
from solver.step_models import TrainingStepModel
from solver.training_step import Placement, Recompute, StepGraph, StepResult, TrainingStep


@dataclass(frozen=True)
class Prediction:
    """A priced layout with the throughput figures the field reports."""

    placement: Placement
    step: StepResult
    tokens_per_s: float
    model_flops_per_batch: float
    hardware_flops_per_batch: float
    mfu: float
    hardware_flops_per_s_per_device: float
    group_tiers: dict[str, str]  # each parallel group's slowest tier by name ("none": a group of one)

    @property
    def layout(self) -> Layout:
        return self.placement.layout

    @property
    def devices(self) -> int:
        return self.layout.devices

    @property
    def time_per_batch_s(self) -> float:
        return self.step.time_per_batch

    @property
    def breakdown_s(self) -> dict[str, float]:
        """The parts of the time per batch [s] (they sum to it)."""
        return self.step.breakdown

    @property
    def busiest_device(self) -> int:
        """The pipeline device with the most memory."""
        return max(range(len(self.step.memory)), key=lambda device: self.step.memory[device]["total"])

    @property
    def memory_bytes(self) -> dict[str, float]:
        """The busiest device's memory by kind (weights, gradients, optimizer_state, activations, total)."""
        return self.step.memory[self.busiest_device]

    @property
    def fits(self) -> bool:
        return self.step.feasible

    @property
    def reason(self) -> str | None:
        """Why it does not fit (None when it does)."""
        return self.step.infeasible_reason


def fit_rules(question: Question, axes: Axes) -> FitRules:
    """The rules a layout given for the question must follow: every device used, Megatron's even split
    of the blocks (or with the embedding and the loss counted as a block each: the layers are then
    the blocks and those two)."""
    blocks = question.model.num_layers
    return FitRules(question.cluster.num_devices, question.micro_batches(axes.micro_batch_size), blocks + 2, blocks,
                    question.experts, whole_cluster=True, split="even_or_ends")


def check_layout(question: Question, axes: Axes, layout: Layout) -> Layout:
    """`layout`, or InputError with the first rule it breaks: `fit_rules`, the sequence's split over
    its context-parallel ranks, the shard width over its c·d ranks holding the same weights."""
    problem = (fit_rules(question, axes).problem(layout) or context_problem(question, layout.context_parallel_width)
               or question.training.shard_problem(layout.context_parallel_width * layout.data_parallel_width))
    if problem is not None:
        raise InputError(problem)
    return layout


def megatron_placement(graph: StepGraph, layout: Layout, recompute: str) -> Placement:
    """Megatron's even layout; when the blocks do not split into p·v chunks but do with the embedding
    and the loss counted as a block each, that layout (Megatron's --account-for-embedding-in-pipeline-
    split and --account-for-loss-in-pipeline-split); else InputError."""
    stages, virtual_stages = layout.pipeline_parallel_width, layout.virtual_stages
    chunks = megatron_chunks(graph, stages, virtual_stages) or megatron_chunks(
        graph, stages, virtual_stages, MegatronSplit(account_for_ends=True))
    if chunks is None:
        blocks = sum(layer.is_block for layer in graph.layers)
        raise InputError(f"pipeline_parallel_width: {stages} stages x {virtual_stages} virtual stages divide neither "
                         f"the {blocks} blocks nor {blocks} + 2 (embedding and loss counted)")
    return Placement(layout, chunks, recompute)


def flops_per_micro_batch(graphs: ExtractedModel, recompute: str, kernels: KernelOptions) -> tuple[float, float]:
    """(forward matrix FLOPs of the whole model, FLOPs its recomputation repeats) per micro-batch.
    The model FLOPs count every score (Megatron's and NeMo's accounting, a causal mask or not)."""
    width = graphs.tensor_parallel_width
    layers = graphs.layer_graph.layers
    forward = sum(layer.forward_flops * (width if layer.tensor_parallel else 1) for layer in layers)
    if Recompute.of(recompute).full:
        return float(forward), float(sum(layer.forward_flops for layer in layers if layer.is_block) * width)
    modules = Recompute.of(recompute).modules
    recomputed = (kernels.recomputed_core(graphs.attention_core) if "core_attn" in modules else frozenset()).union(
        *(ids for name, ids in graphs.recompute_modules.items() if name in modules))
    representative = {member: group[0] for group in graphs.repeat_groups for member in group}
    repeated = sum(node.flops for layer in layers if layer.is_block
                   for node in graphs.op_graph.layer_nodes(representative[layer.id]) if node.id in recomputed)
    return float(forward), float(repeated * width)


def prediction(question: Question, axes: Axes, step: TrainingStep, placement: Placement, chip: KnownChip,
               flops: tuple[float, float]) -> Prediction:
    """The step of `placement` priced by `step`, with the throughput figures; `flops` from
    `flops_per_micro_batch`."""
    result = step.price(placement)
    devices = placement.layout.devices
    micro_batches = question.micro_batches(axes.micro_batch_size)
    forward, repeated = flops
    model = 3 * forward * micro_batches
    hardware = model + repeated * micro_batches
    time = result.time_per_batch
    return Prediction(
        placement=placement,
        step=result,
        tokens_per_s=question.global_batch_size * question.sequence_length / time,
        model_flops_per_batch=model,
        hardware_flops_per_batch=hardware,
        mfu=model / time / (chip.peak_flops * devices),
        hardware_flops_per_s_per_device=hardware / time / devices,
        group_tiers=question.cluster.spans(placement.layout.groups()),
    )


def predict(question: Question, axes: Axes, layout: Layout, graphs: ExtractedModel, step_graph: StepGraph,
            chip: KnownChip) -> Prediction:
    """Price Megatron's placement of `layout` (t the graphs' width) at the axes' one micro-batch size,
    HBM size and recomputation mode; `step_graph` is the graphs' width with the chip's layer costs
    (`solver.layer_costs.step_graphs`). InputError when the layout breaks a rule (`check_layout`)."""
    check_layout(question, axes, layout)
    (recompute,) = axes.recompute
    step = TrainingStepModel.step(question, axes, step_graph, chip.hbm_bandwidth, layout.shard)
    return prediction(question, axes, step, megatron_placement(step_graph, layout, recompute), chip,
                      flops_per_micro_batch(graphs, recompute, question.kernels))
