"""One training step of a fixed placement on a known chip: what `phaze predict` and `phaze validate`
compute, and the layer costs of a known chip for the placement search.

The placement is Megatron's: p stages (v chunks each) of equal numbers of blocks, the embedding with
the first and the head with the last, replicated d times on t-wide tensor-parallel groups. Layer
costs come from the chip's cost model (a roofline for GPUs, the template's schedules for a template
chip); the step is priced by `solver.training_step`.

FLOPs are counted as the field does (Narayanan et al. 2021): the model FLOPs of a batch are three
passes (forward, and two for backward) of every matrix product, 72·B·s·L·h²·(1 + s/(6h) +
V/(12·L·h)) for a GPT; the hardware FLOPs add the recomputed forward products. MFU = model FLOPs
per second / the peak of all devices.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from estimator.known import KnownChip
from estimator.roofline import layer_times
from graph_extract import ExtractedModel
from solver.codesign import Resources, ScheduleSettings, SearchContext, accelerator_costs
from solver.evaluate import LayerCost, LayerCosts, step_graphs, training_steps
from solver.job import Job
from solver.placement.layouts import megatron_chunks
from solver.training_step import Placement, StepResult, TrainingStep


def roofline_costs(job: Job, graphs_by_width: dict[int, ExtractedModel], chip: KnownChip) -> LayerCosts:
    """Every layer's cost on a GPU (`estimator.roofline`), per width; a repeat group shares its
    representative's."""
    costs: LayerCosts = {}
    for width, graphs in graphs_by_width.items():
        for group in graphs.repeat_groups:
            times = layer_times(graphs.op_graph, group[0], chip, job.training.sequence_parallel,
                                graphs.attention_core)
            cost = LayerCost(times.forward, times.backward, times.attention_core_forward, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
            costs.setdefault(width, {}).update({layer: cost for layer in group})
    return costs


def chip_costs(job: Job, graphs_by_width: dict[int, ExtractedModel], chip: KnownChip, cache_dir: Path,
               schedule: ScheduleSettings = ScheduleSettings()) -> LayerCosts:
    """The layer costs of a known chip: its roofline, or (a template chip) its schedules, cached."""
    if chip.cost_model == "roofline":
        return roofline_costs(job, graphs_by_width, chip)
    resources = Resources.build(SearchContext(job, chip.template, None, cache_dir, schedule))
    return accelerator_costs(resources, chip.template)


@dataclass(frozen=True)
class Prediction:
    """A priced placement with the throughput figures the field reports."""

    placement: Placement
    step: StepResult
    devices: int
    tokens_per_s: float
    model_flops_per_batch: float
    hardware_flops_per_batch: float
    mfu: float
    hardware_flops_per_s_per_device: float


def megatron_placement(graphs: ExtractedModel, stages: int, degree: int, virtual_stages: int,
                       recompute: str, step: TrainingStep) -> Placement:
    """Megatron's even layout; when the blocks do not split into p·v chunks but do with the embedding
    and the loss counted as a block each, that layout (Megatron's --account-for-embedding-in-pipeline-
    split and --account-for-loss-in-pipeline-split); else ValueError."""
    chunks = megatron_chunks(step.graph, stages, virtual_stages) or megatron_chunks(
        step.graph, stages, virtual_stages, account_for_ends=True)
    if chunks is None:
        blocks = sum(layer.recomputable for layer in graphs.layer_graph.layers)
        raise ValueError(f"pipeline_parallel_width: {stages} stages x {virtual_stages} virtual stages divide neither "
                         f"the {blocks} blocks of {graphs.spec.name} nor {blocks} + 2 (embedding and loss counted)")
    return Placement(chunks, degree, recompute, virtual_stages)


def flops_per_micro_batch(graphs: ExtractedModel, recompute: str) -> tuple[float, float]:
    """(forward matrix FLOPs of the whole model, FLOPs its recomputation repeats) per micro-batch."""
    width = graphs.tensor_parallel_width
    layers = graphs.layer_graph.layers
    forward = sum(layer.forward_flops * (width if layer.tensor_parallel else 1) for layer in layers)
    representative = {member: group[0] for group in graphs.repeat_groups for member in group}
    core = {layer.id: sum(node.flops for node in graphs.op_graph.layer_nodes(representative[layer.id])
                          if node.id in graphs.attention_core) for layer in layers}
    repeated = {"none": 0,
                "selective": sum(core[layer.id] for layer in layers if layer.recomputable),
                "full": sum(layer.forward_flops for layer in layers if layer.recomputable)}[recompute]
    return float(forward), float(repeated * width)


def predict(job: Job, graphs: ExtractedModel, costs: LayerCosts, chip: KnownChip, stages: int, degree: int,
            virtual_stages: int = 1) -> Prediction:
    """Price Megatron's layout of (t = the graphs' width, p, d, v) for the job's one recomputation mode
    and (a mixture of experts) its one expert-parallel width."""
    (recompute,) = job.recompute
    (experts,) = job.expert_parallel_widths
    width = graphs.tensor_parallel_width
    step = training_steps(job, step_graphs({width: graphs}, {width: costs[width]}), chip.hbm_bandwidth,
                          max(job.memory_capacities), recompute, experts)[width]
    placement = megatron_placement(graphs, stages, degree, virtual_stages, recompute, step)
    result = step.evaluate(placement)
    devices = width * stages * degree
    forward, repeated = flops_per_micro_batch(graphs, recompute)
    model = 3 * forward * job.micro_batches
    hardware = model + repeated * job.micro_batches
    time = result.time_per_batch
    return Prediction(
        placement=placement,
        step=result,
        devices=devices,
        tokens_per_s=job.global_batch_size * job.sequence_length / time,
        model_flops_per_batch=model,
        hardware_flops_per_batch=hardware,
        mfu=model / time / (chip.peak_flops * devices),
        hardware_flops_per_s_per_device=hardware / time / devices,
    )
