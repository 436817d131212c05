"""Evaluation of one accelerator for one training job: schedule every unique layer, then place.

Per tensor-parallel width, the representative of each repeat group is scheduled forward and
backward on the accelerator's cores; every layer of the group gets that cost. The placement DP
then runs on the layer graphs of all widths, with activation recomputation off and on.
Units are SI: seconds, bytes, bytes/s, joules; throughput in samples per second.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache

from estimator import AcceleratorConfig, EstimateTable, FusedLayer, layer_workload
from graph_extract import ExtractedModel
from solver.placement import FixedStrategy, PlacementEdge, PlacementGraph, PlacementLayer, PlacementResult, PlacementSettings
from solver.placement import solve as place
from solver.schedule import ScheduleProblem, ScheduleResult, lower_bound

DIRECTIONS = ("forward", "backward")


@dataclass(frozen=True)
class TrainingJob:
    """A model at one micro-batch size (its graphs at every width) trained on a cluster."""

    graphs: Mapping[int, ExtractedModel]  # tensor-parallel width -> graphs of rank 0
    global_batch_size: int
    devices: int
    optimizer: str = "SGD"
    sync_cost: str = "first_stage"

    @property
    def micro_batch_size(self) -> int:
        return next(iter(self.graphs.values())).micro_batch_size

    @property
    def micro_batches(self) -> int:
        """Micro-batches per global batch."""
        return self.global_batch_size // self.micro_batch_size


@dataclass(frozen=True)
class LayerCost:
    """One layer of one shard on one accelerator, per micro-batch.

    Busy core-seconds (summed over forward and backward) give the utilisation over many layers.
    """

    forward: float
    backward: float
    energy: float
    tc_busy: float
    vc_busy: float
    tc_peak: float
    vc_peak: float
    gap: float  # the larger relative optimality gap of the two schedules


#: width -> layer id -> cost
LayerCosts = dict[int, dict[int, LayerCost]]

#: A scheduler: problem -> result (e.g. a ScheduleCache's solve with fixed backend options).
Scheduler = Callable[[ScheduleProblem], ScheduleResult]


def schedule_problem(fused: FusedLayer, accelerator: AcceleratorConfig) -> ScheduleProblem:
    """The scheduling problem of a fused layer on the accelerator's cores."""
    return ScheduleProblem.from_workload(fused, accelerator.num_tc, accelerator.num_vc)


def _layer_problems(job: TrainingJob, accelerator: AcceleratorConfig, table: EstimateTable):
    """(width, group, forward problem, backward problem) for every repeat group of every width."""
    for width, graphs in job.graphs.items():
        for group in graphs.repeat_groups:
            yield width, group, *(
                schedule_problem(layer_workload(graphs.op_graph, group[0], direction, accelerator, table), accelerator)
                for direction in DIRECTIONS
            )


def layer_costs(
    job: TrainingJob, accelerator: AcceleratorConfig, table: EstimateTable, schedule: Scheduler
) -> LayerCosts:
    """Schedule each repeat group's representative forward and backward; its cost is the group's."""
    costs: LayerCosts = {}
    for width, group, forward, backward in _layer_problems(job, accelerator, table):
        results = [schedule(forward), schedule(backward)]
        busy = [
            sum(getattr(r, f"{kind}_utilisation").mean * r.makespan for r in results) * count
            for kind, count in (("tc", accelerator.num_tc), ("vc", accelerator.num_vc))
        ]
        cost = LayerCost(
            forward=results[0].makespan,
            backward=results[1].makespan,
            energy=results[0].energy + results[1].energy,
            tc_busy=busy[0],
            vc_busy=busy[1],
            tc_peak=max(r.tc_utilisation.peak for r in results),
            vc_peak=max(r.vc_utilisation.peak for r in results),
            gap=max(r.gap for r in results),
        )
        costs.setdefault(width, {}).update({layer: cost for layer in group})
    return costs


def lower_bound_costs(job: TrainingJob, accelerator: AcceleratorConfig, table: EstimateTable) -> LayerCosts:
    """Layer costs from the schedules' lower bounds: no schedule is faster (energy etc. zero)."""
    costs: LayerCosts = {}
    for width, group, forward, backward in _layer_problems(job, accelerator, table):
        cost = LayerCost(lower_bound(forward), lower_bound(backward), 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
        costs.setdefault(width, {}).update({layer: cost for layer in group})
    return costs


def placement_graphs(job: TrainingJob, costs: LayerCosts) -> dict[int, PlacementGraph]:
    """The layer graph of every width with the layers' scheduled latencies."""
    graphs = {}
    for width, extracted in job.graphs.items():
        layer_graph = extracted.layer_graph
        layers = tuple(
            PlacementLayer(
                id=layer.id,
                parameter_bytes=layer.parameter_bytes,
                activation_bytes=layer.activation_bytes,
                forward_latency=costs[width][layer.id].forward,
                backward_latency=costs[width][layer.id].backward,
                tensor_parallel=layer.tensor_parallel,
            )
            for layer in layer_graph.layers
        )
        edges = tuple(PlacementEdge(e.source, e.dest, e.bytes) for e in layer_graph.edges)
        graphs[width] = PlacementGraph(layers, edges)
    return graphs


@dataclass(frozen=True)
class Evaluation:
    """The best placement of a job on an accelerator with recomputation off or on."""

    activation_recomputation: bool
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


def _evaluation(
    job: TrainingJob, costs: LayerCosts, accelerator: AcceleratorConfig, recompute: bool, result: PlacementResult
) -> Evaluation:
    if not result.feasible:
        return Evaluation(recompute, result, 0.0, math.inf, 0.0, 0.0, 0.0, 0.0, 0.0)
    width_costs = costs[result.tensor_parallel_width]
    layers = list(width_costs.values())
    last_stage = set(result.stages[-1].layer_ids)
    recomputed = sum(c.forward for layer, c in width_costs.items() if layer not in last_stage) if recompute else 0.0
    computing = sum(c.forward + c.backward for c in layers) + recomputed
    energy_shard = sum(c.energy for c in layers)  # recomputed forwards add little; not counted
    return Evaluation(
        activation_recomputation=recompute,
        placement=result,
        throughput=job.global_batch_size / result.time_per_batch,
        energy_per_batch=energy_shard * result.tensor_parallel_width * job.micro_batches,
        tc_utilisation=sum(c.tc_busy for c in layers) / (accelerator.num_tc * computing) if computing else 0.0,
        vc_utilisation=sum(c.vc_busy for c in layers) / (accelerator.num_vc * computing) if computing else 0.0,
        tc_peak=max(c.tc_peak for c in layers),
        vc_peak=max(c.vc_peak for c in layers),
        schedule_gap=max(c.gap for c in layers),
    )


def placement_settings(
    job: TrainingJob, accelerator: AcceleratorConfig, memory_per_device: int, recompute: bool,
    fixed: FixedStrategy | None = None,
) -> PlacementSettings:
    return PlacementSettings(
        devices=job.devices,
        memory_per_device=memory_per_device,
        bandwidth=accelerator.link_bandwidth,
        micro_batches_per_batch=job.micro_batches,
        activation_recomputation=recompute,
        optimizer=job.optimizer,
        fixed_baseline=fixed,
        sync_cost=job.sync_cost,
    )


@lru_cache(maxsize=4096)
def _place(graphs: tuple[tuple[int, PlacementGraph], ...], settings: PlacementSettings) -> PlacementResult:
    """The placement DP, memoised: candidates whose layers cost the same share one solve."""
    return place(dict(graphs), settings)


def evaluate_placements(
    job: TrainingJob, accelerator: AcceleratorConfig, costs: LayerCosts, memory_per_device: int,
    fixed: FixedStrategy | None = None,
) -> tuple[Evaluation, Evaluation]:
    """The best placement with recomputation off and with it on."""
    graphs = tuple(placement_graphs(job, costs).items())
    return tuple(  # type: ignore[return-value]
        _evaluation(job, costs, accelerator, recompute,
                    _place(graphs, placement_settings(job, accelerator, memory_per_device, recompute, fixed)))
        for recompute in (False, True)
    )


def best_of(evaluations: tuple[Evaluation, ...]) -> Evaluation:
    """The evaluation with the highest throughput (recomputation off wins a tie)."""
    return max(evaluations, key=lambda evaluation: evaluation.throughput)
