"""The evaluation of one chip for one question: its best placement in each recomputation mode (from
its layer costs, by the question's step model), with throughput, energy and core utilisation, and
the question's fixed baseline on it. Units are SI; throughput in samples per second.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from phaze_hardware import AcceleratorConfig, KnownChip
from solver.layer_costs import LayerCosts, step_graphs
from solver.placement import PlacementResult
from solver.question import Axes, Question
from solver.step_models import step_model
from solver.training_step.records import StepGraph


@dataclass(frozen=True)
class Evaluation:
    """The best placement of a question on a chip in one recomputation mode."""

    recompute: str
    placement: PlacementResult
    throughput: float  # samples/s; 0 when no placement fits
    energy_per_batch: float  # J, all devices
    tc_utilisation: float  # mean busy fraction of the tensor cores while computing
    vc_utilisation: float
    tc_peak: float
    vc_peak: float
    schedule_gap: float

    @property
    def feasible(self) -> bool:
        return self.throughput > 0

    @classmethod
    def from_record(cls, record: dict) -> Evaluation:
        """The inverse of `dataclasses.asdict` (a cached evaluation)."""
        return cls(**{**record, "placement": PlacementResult.from_record(record["placement"])})


#: A chip the evaluation prices: a template accelerator, or a known chip (a GPU has no cores to report).
Chip = AcceleratorConfig | KnownChip


def _cores(chip: Chip) -> tuple[int, int] | None:
    """Tensor and vector cores of a template chip, None for a GPU."""
    template = chip.template if isinstance(chip, KnownChip) else chip
    return None if template is None else (template.num_tc, template.num_vc)


def _evaluation(question: Question, axes: Axes, costs: LayerCosts, graphs: dict[int, StepGraph], chip: Chip,
                result: PlacementResult) -> Evaluation:
    if not result.feasible:
        return Evaluation(result.recompute, result, 0.0, math.inf, 0.0, 0.0, 0.0, 0.0, 0.0)
    width = result.layout.tensor_parallel_width
    width_costs = costs[width]
    layers = list(width_costs.values())
    blocks = [width_costs[layer.id] for layer in graphs[width].layers if layer.is_block]
    rerun = sum(c.recomputed(result.recompute) for c in blocks)  # the step model re-runs blocks only
    computing = sum(c.forward + c.backward for c in layers) + rerun
    energy_shard = sum(c.energy for c in layers)  # recomputed forwards add little; not counted
    num_tc, num_vc = _cores(chip) or (0, 0)
    return Evaluation(
        recompute=result.recompute,
        placement=result,
        throughput=question.global_batch_size / result.time_per_batch,
        energy_per_batch=energy_shard * width * question.micro_batches(axes.micro_batch_size),
        tc_utilisation=sum(c.tc_busy for c in layers) / (num_tc * computing) if computing and num_tc else 0.0,
        vc_utilisation=sum(c.vc_busy for c in layers) / (num_vc * computing) if computing and num_vc else 0.0,
        tc_peak=max(c.tc_peak for c in layers),
        vc_peak=max(c.vc_peak for c in layers),
        schedule_gap=max(c.gap for c in layers),
    )


def fastest_time(question: Question, axes: Axes, graphs_by_width, chip: Chip, costs: LayerCosts,
                 upper_bound: float = math.inf) -> float:
    """The least time per batch [s] over the placements in every recomputation mode of the axes (one
    micro-batch and HBM size), if below `upper_bound` (each mode's search is cut at the best time
    found so far), else math.inf."""
    graphs, best, model = step_graphs(graphs_by_width, costs), upper_bound, step_model(question)
    for recompute in axes.recompute:
        best = min(best, model.place(question, axes.at(recompute=recompute), graphs, chip.hbm_bandwidth,
                                     best).time_per_batch)
    return best if best < upper_bound else math.inf


def evaluate_placements(question: Question, axes: Axes, graphs_by_width, chip: Chip, costs: LayerCosts,
                        memo: dict | None = None) -> tuple[Evaluation, ...]:
    """The best placement in each recomputation mode of the axes (one micro-batch and HBM size).
    `memo` (owned by the caller, for one question) shares the placement of identical layer costs
    between chips."""
    graphs, model = step_graphs(graphs_by_width, costs), step_model(question)
    evaluations = []
    for recompute in axes.recompute:
        key = (tuple(graphs.items()), axes.memory_capacity, chip.hbm_bandwidth, recompute)
        if memo is not None and key in memo:
            result = memo[key]
        else:
            result = model.place(question, axes.at(recompute=recompute), graphs, chip.hbm_bandwidth)
            if memo is not None:
                memo[key] = result
        evaluations.append(_evaluation(question, axes, costs, graphs, chip, result))
    return tuple(evaluations)


def fixed_baseline(question: Question, axes: Axes, graphs_by_width, chip: Chip,
                   costs: LayerCosts) -> tuple[PlacementResult | None, str | None]:
    """The question's fixed Megatron layout on this chip in its best recomputation mode of the axes
    (one micro-batch and HBM size): (result, None), or (None, why it cannot run)."""
    baseline = question.baseline
    if baseline is None:
        return None, "the model defines no fixed_megatron"
    graphs = step_graphs(graphs_by_width, costs)
    if baseline.tensor_parallel_width not in graphs:
        return None, f"tensor-parallel width {baseline.tensor_parallel_width} is not among the widths searched"
    blocks, stages = question.model.num_layers, baseline.pipeline_parallel_width
    if stages > blocks:
        return None, f"{stages} pipeline stages but {question.model.name} has {blocks} blocks: a stage would be empty"
    best, reasons, model = None, [], step_model(question)
    for recompute in axes.recompute:
        result, why = model.fixed(question, axes.at(recompute=recompute), graphs, chip.hbm_bandwidth)
        if result is not None and (best is None or result.time_per_batch < best.time_per_batch):
            best = result
        elif result is None:
            reasons.append(why)
    return (best, None) if best is not None else (None, reasons[0])


def best_of(evaluations: tuple[Evaluation, ...]) -> Evaluation:
    """The evaluation with the highest throughput (the earlier recomputation mode wins a tie)."""
    return max(evaluations, key=lambda evaluation: evaluation.throughput)
