"""Evaluation of one accelerator for one training job: schedule every unique layer, then place.

Per tensor-parallel width, the representative of each repeat group is scheduled forward and
backward on the accelerator's cores (and its attention core forward, what selective
recomputation re-runs); every layer of the group gets that cost. Collectives take no core time in
a schedule: the training-step model charges them on the cluster. The best placement is then
searched for each recomputation mode of the job. Units are SI; throughput in samples per second.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from estimator import AcceleratorConfig, EstimateTable, FusedLayer, layer_workload
from estimator.known import KnownChip
from graph_extract.trace import TRAINING_DTYPE_BYTES
from solver.job import Job
from solver.placement import (PlacedStage, PlacementEdge, PlacementGraph, PlacementLayer, PlacementResult,
                              PlacementSettings)
from solver.placement import solve as place_original
from solver.placement.evaluate import baseline_stages
from solver.placement.search import best_over_expert_widths, fixed_megatron
from solver.schedule import ScheduleProblem, ScheduleResult
from solver.training_step.model import Device, StepGraph, StepLayer, TrainingStep

DIRECTIONS = ("forward", "backward")


@dataclass(frozen=True)
class LayerCost:
    """One layer of one shard on one accelerator, per micro-batch [s, J].

    `attention_core_forward` is the forward time of its attention core (0 without one). Busy
    core-seconds (summed over forward and backward) give the utilisation over many layers.
    """

    forward: float
    backward: float
    attention_core_forward: float
    energy: float
    tc_busy: float
    vc_busy: float
    tc_peak: float
    vc_peak: float
    gap: float  # the largest relative optimality gap of its schedules


#: width -> layer id -> cost
LayerCosts = dict[int, dict[int, LayerCost]]

#: A scheduler: problem -> result (e.g. a ScheduleCache's solve with fixed backend options).
Scheduler = Callable[[ScheduleProblem], ScheduleResult]


def schedule_problem(fused: FusedLayer, accelerator: AcceleratorConfig) -> ScheduleProblem:
    """The scheduling problem of a fused layer on the accelerator's cores."""
    return ScheduleProblem.from_workload(fused, accelerator.num_tc, accelerator.num_vc)


def core_problem(fused: FusedLayer, core: frozenset[int], accelerator: AcceleratorConfig) -> ScheduleProblem | None:
    """The scheduling problem of the attention-core operators of a forward layer, or None."""
    keep = [index for index, op in enumerate(fused.ops) if op.members[0] in core]
    if not keep:
        return None
    position = {old: new for new, old in enumerate(keep)}
    edges = tuple((position[a], position[b]) for a, b in fused.edges if a in position and b in position)
    part = FusedLayer(fused.layer, fused.direction, tuple(fused.ops[i] for i in keep), edges)
    return schedule_problem(part, accelerator)


def _layer_problems(job: Job, graphs_by_width, accelerator: AcceleratorConfig, table: EstimateTable):
    """(width, group, forward, backward, attention core or None) problems of every repeat group."""
    parallel = job.training.sequence_parallel
    for width, graphs in graphs_by_width.items():
        for group in graphs.repeat_groups:
            forward, backward = (layer_workload(graphs.op_graph, group[0], direction, accelerator, table, parallel)
                                 for direction in DIRECTIONS)
            yield (width, group, schedule_problem(forward, accelerator), schedule_problem(backward, accelerator),
                   core_problem(forward, graphs.attention_core, accelerator))


def layer_costs(job: Job, graphs_by_width, accelerator: AcceleratorConfig, table: EstimateTable,
                schedule: Scheduler, on_layer: Callable[[], None] = lambda: None) -> LayerCosts:
    """Schedule each repeat group's representative; its cost is the group's. `on_layer` is called
    after each group (progress)."""
    costs: LayerCosts = {}
    for width, group, forward, backward, core in _layer_problems(job, graphs_by_width, accelerator, table):
        results = [schedule(forward), schedule(backward)]
        core_result = schedule(core) if core is not None else None
        busy = [
            sum(getattr(r, f"{kind}_utilisation").mean * r.makespan for r in results) * count
            for kind, count in (("tc", accelerator.num_tc), ("vc", accelerator.num_vc))
        ]
        cost = LayerCost(
            forward=results[0].makespan,
            backward=results[1].makespan,
            attention_core_forward=core_result.makespan if core_result else 0.0,
            energy=results[0].energy + results[1].energy,
            tc_busy=busy[0],
            vc_busy=busy[1],
            tc_peak=max(r.tc_utilisation.peak for r in results),
            vc_peak=max(r.vc_utilisation.peak for r in results),
            gap=max(r.gap for r in results + ([core_result] if core_result else [])),
        )
        costs.setdefault(width, {}).update({layer: cost for layer in group})
        on_layer()
    return costs


#: Costs of a layer that takes no time (the graph facts alone).
NO_COST = LayerCost(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


def step_graphs(graphs_by_width, costs: LayerCosts | None) -> dict[int, StepGraph]:
    """The layer graph of every width with the layers' scheduled times (positions: program order);
    without `costs`, every layer takes no time."""
    graphs = {}
    for width, extracted in graphs_by_width.items():
        layer_graph = extracted.layer_graph
        position = {layer.id: index for index, layer in enumerate(layer_graph.layers)}
        cost = {layer.id: costs[width][layer.id] if costs else NO_COST for layer in layer_graph.layers}
        layers = tuple(
            StepLayer(
                id=layer.id,
                forward=cost[layer.id].forward,
                backward=cost[layer.id].backward,
                attention_core_forward=cost[layer.id].attention_core_forward,
                parameters=layer.parameter_bytes / TRAINING_DTYPE_BYTES,
                activation_bytes=layer.activation_bytes,
                replicated_activation_bytes=layer.replicated_activation_bytes,
                attention_core_activation_bytes=layer.attention_core_activation_bytes,
                input_bytes=layer.input_bytes,
                replicated_input_bytes=layer.replicated_input_bytes,
                recomputable=layer.recomputable,
                forward_collective_bytes=layer.forward_collective_bytes,
                backward_collective_bytes=layer.backward_collective_bytes,
                expert_parameters=layer.expert_parameter_bytes / TRAINING_DTYPE_BYTES,
                all_to_all_bytes=layer.all_to_all_bytes,
            )
            for layer in layer_graph.layers
        )
        edges = tuple((position[e.source], position[e.dest], float(e.bytes)) for e in layer_graph.edges)
        if any(source >= dest for source, dest, _ in edges):
            raise ValueError(f"layer graph of width {width}: an edge goes backwards in program order")
        graphs[width] = StepGraph(width, layers, edges)
    return graphs


def training_steps(job: Job, graphs: dict[int, StepGraph], hbm_bandwidth: float, memory: int,
                   recompute: str, expert_parallel_width: int = 1) -> dict[int, TrainingStep]:
    """The step model of every width for one chip's HBM (size and bandwidth), recomputation mode and
    expert-parallel width."""
    device = Device(memory, hbm_bandwidth)
    return {width: TrainingStep(graph, job.system, job.training, device, job.micro_batches, recompute,
                                expert_parallel_width)
            for width, graph in graphs.items()}


def original_graphs(job: Job, graphs: dict[int, StepGraph]) -> dict[int, PlacementGraph]:
    """The original program's inputs: latencies with the collectives on the flat link inside."""
    result = {}
    for width, graph in graphs.items():
        link = job.system.tensor_parallel(width)
        layers = []
        for layer in graph.layers:
            forward = sum(link.scalar(size) for size in layer.forward_collective_bytes)
            backward = sum(link.scalar(size) for size in layer.backward_collective_bytes)
            layers.append(PlacementLayer(
                id=layer.id,
                parameter_bytes=layer.parameters * TRAINING_DTYPE_BYTES,
                activation_bytes=layer.activation_bytes,
                forward_latency=layer.forward + forward,
                backward_latency=layer.backward + backward,
                tensor_parallel=width > 1,
                collective_latency=forward + backward,
            ))
        edges = tuple(PlacementEdge(graph.ids[s], graph.ids[d], size) for s, d, size in graph.edges)
        result[width] = PlacementGraph(tuple(layers), edges)
    return result


def original_settings(job: Job, memory: int, recompute: str) -> PlacementSettings:
    return PlacementSettings(
        devices=job.devices,
        memory_per_device=memory,
        bandwidth=job.system.tiers[0].effective_bandwidth,
        micro_batches_per_batch=job.micro_batches,
        activation_recomputation=recompute == "full",
        optimizer={"sgd": "SGD", "adam": "Adam"}[job.training.optimizer],
        fixed_baseline=job.fixed_megatron,
    )


@dataclass(frozen=True)
class Evaluation:
    """The best placement of a job on an accelerator in one recomputation mode."""

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


#: A chip the evaluation prices: a template accelerator, or a known chip (a GPU has no cores to report).
Chip = AcceleratorConfig | KnownChip


def _cores(chip: Chip) -> tuple[int, int] | None:
    """Tensor and vector cores of a template chip, None for a GPU."""
    template = chip.template if isinstance(chip, KnownChip) else chip
    return None if template is None else (template.num_tc, template.num_vc)


def _evaluation(job: Job, costs: LayerCosts, chip: Chip, result: PlacementResult) -> Evaluation:
    if not result.feasible:
        return Evaluation(result.recompute, result, 0.0, math.inf, 0.0, 0.0, 0.0, 0.0, 0.0)
    width_costs = costs[result.tensor_parallel_width]
    layers = list(width_costs.values())
    rerun = {"none": 0.0, "selective": sum(c.attention_core_forward for c in layers),
             "full": sum(c.forward for c in layers)}[result.recompute]
    computing = sum(c.forward + c.backward for c in layers) + rerun
    energy_shard = sum(c.energy for c in layers)  # recomputed forwards add little; not counted
    num_tc, num_vc = _cores(chip) or (0, 0)
    return Evaluation(
        recompute=result.recompute,
        placement=result,
        throughput=job.global_batch_size / result.time_per_batch,
        energy_per_batch=energy_shard * result.tensor_parallel_width * job.micro_batches,
        tc_utilisation=sum(c.tc_busy for c in layers) / (num_tc * computing) if computing and num_tc else 0.0,
        vc_utilisation=sum(c.vc_busy for c in layers) / (num_vc * computing) if computing and num_vc else 0.0,
        tc_peak=max(c.tc_peak for c in layers),
        vc_peak=max(c.vc_peak for c in layers),
        schedule_gap=max(c.gap for c in layers),
    )


def place(job: Job, graphs: dict[int, StepGraph], chip: Chip, memory: int, recompute: str,
          upper_bound: float = math.inf) -> PlacementResult:
    """The best placement in one recomputation mode, under the job's step model; with the training
    step's, only one faster than `upper_bound` [s] (none: an infeasible result)."""
    if job.step_model == "original":
        return place_original(original_graphs(job, graphs), original_settings(job, memory, recompute))
    steps = {experts: training_steps(job, graphs, chip.hbm_bandwidth, memory, recompute, experts)
             for experts in job.expert_parallel_widths}
    return best_over_expert_widths(steps, job.virtual_stages, upper_bound)


def fastest_time(job: Job, graphs_by_width, chip: Chip, costs: LayerCosts, memory: int,
                 upper_bound: float = math.inf) -> float:
    """The least time per batch [s] over the placements in every recomputation mode, if below
    `upper_bound` (each mode's search is cut at the best time found so far), else math.inf."""
    graphs, best = step_graphs(graphs_by_width, costs), upper_bound
    for recompute in job.recompute:
        best = min(best, place(job, graphs, chip, memory, recompute, best).time_per_batch)
    return best if best < upper_bound else math.inf


def evaluate_placements(job: Job, graphs_by_width, chip: Chip, costs: LayerCosts, memory: int,
                        memo: dict | None = None) -> tuple[Evaluation, ...]:
    """The best placement in each recomputation mode of the job. `memo` (owned by the caller)
    shares the placement of identical layer costs between accelerators."""
    graphs = step_graphs(graphs_by_width, costs)
    evaluations = []
    for recompute in job.recompute:
        key = (tuple(graphs.items()), memory, chip.hbm_bandwidth, recompute)
        if memo is not None and key in memo:
            result = memo[key]
        else:
            result = place(job, graphs, chip, memory, recompute)
            if memo is not None:
                memo[key] = result
        evaluations.append(_evaluation(job, costs, chip, result))
    return tuple(evaluations)


def empty_stage(job: Job, layers: int) -> str | None:
    """Why the job's fixed pipeline would have a stage without a transformer block (its time would
    compare the search against idle devices), or None. Megatron's even split has one when there are
    fewer blocks than stages; the original's layout of ceil(blocks / stages) blocks per stage (over
    a graph of `layers` layers) can leave a middle stage empty even then."""
    fixed = job.fixed_megatron
    blocks, stages = fixed.num_transformer_layers, fixed.pipeline_stages
    if stages > blocks:
        return f"{stages} pipeline stages but {job.spec.name} has {blocks} blocks: a stage would be empty"
    if job.step_model == "original":
        layout = baseline_stages(layers, fixed)
        empty = next((stage for stage, positions in enumerate(layout) if not positions), None)
        if empty is not None:
            return (f"{stages} pipeline stages of ceil({blocks} / {stages}) = {-(-blocks // stages)} of the {blocks} "
                    f"blocks of {job.spec.name} (the original's layout): stage {empty} would be empty")
    return None


def fixed_baseline(job: Job, graphs_by_width, chip: Chip, costs: LayerCosts,
                   memory: int) -> tuple[PlacementResult | None, str | None]:
    """The job's fixed Megatron (p, t, d) on this accelerator in its best recomputation mode, with the
    widest of the job's expert-parallel widths that divides d: (result, None), or (None, why it
    cannot run)."""
    fixed = job.fixed_megatron
    if fixed is None:
        return None, "the model defines no fixed_megatron"
    graphs = step_graphs(graphs_by_width, costs)
    if fixed.tensor_parallel_width not in graphs:
        return None, f"tensor-parallel width {fixed.tensor_parallel_width} is not among the widths searched"
    if (empty := empty_stage(job, graphs[fixed.tensor_parallel_width].n)) is not None:
        return None, empty
    best, reasons = None, []
    for recompute in job.recompute:
        if job.step_model == "original":
            original = place_original(original_graphs(job, graphs), original_settings(job, memory, recompute))
            time, why = original.fixed_baseline_time, original.fixed_baseline_infeasible_reason
            result = None if time is None else PlacementResult((), fixed.data_parallel_degree,
                                                                fixed.tensor_parallel_width, time, recompute=recompute)
        else:
            experts = max((e for e in job.expert_parallel_widths if fixed.data_parallel_degree % e == 0), default=1)
            steps = training_steps(job, graphs, chip.hbm_bandwidth, memory, recompute, experts)
            result, why = fixed_megatron(steps[fixed.tensor_parallel_width], fixed.pipeline_stages,
                                         fixed.data_parallel_degree)
        if result is not None and (best is None or result.time_per_batch < best.time_per_batch):
            best = result
        elif result is None:
            reasons.append(why)
    return (best, None) if best is not None else (None, reasons[0])


def evaluation_from_record(record: dict) -> Evaluation:
    """The inverse of `dataclasses.asdict` on an Evaluation (a cached one)."""
    placement = dict(record["placement"])
    placement["stages"] = tuple(PlacedStage(**{**stage, "layer_ids": tuple(stage["layer_ids"])})
                                for stage in placement["stages"])
    return Evaluation(**{**record, "placement": PlacementResult(**placement)})


def best_of(evaluations: tuple[Evaluation, ...]) -> Evaluation:
    """The evaluation with the highest throughput (the earlier recomputation mode wins a tie)."""
    return max(evaluations, key=lambda evaluation: evaluation.throughput)
