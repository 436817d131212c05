"""Optimistic throughputs of every candidate accelerator at once, from schedule lower bounds.

For each layer the schedule lower bound (critical path on the shorter latencies, work per core
type over all its cores: `solver.schedule.lower_bound`) is computed for all candidates as numpy
vectors: a layer's forward plus backward bound. The job's step model turns these into a lower
bound on the time per batch of every placement (`TrainingStep.time_lower_bound`, or the
original's `original.time_lower_bound`), and the throughput bound is global batch / the least of
them over the widths.
"""

from __future__ import annotations

import numpy as np

from estimator import CandidateSpace, EstimateTable
from estimator.workload import prepare_layer
from solver.evaluate import DIRECTIONS, original_graphs, original_settings, step_graphs, training_steps
from solver.job import Job
from solver.placement.capped import degrees
from solver.training_step import original

#: Scheduled latencies are those of problems rounded to 6 significant digits (ScheduleCache); a
#: throughput bound this much larger stays an upper bound of the scheduled throughput.
ROUNDING_MARGIN = 1e-5


def lower_bounds(latency: np.ndarray, parallel: np.ndarray, core_types: list[str], edges, num_tc, num_vc) -> np.ndarray:
    """`solver.schedule.lower_bound` of one layer for many candidates: arrays [operators x candidates]."""
    shortest = np.minimum(latency, parallel)
    finish = np.zeros_like(shortest)
    predecessors: dict[int, list[int]] = {}
    for source, dest in edges:
        predecessors.setdefault(dest, []).append(source)
    for op in range(len(core_types)):  # operators are numbered in a topological order
        before = predecessors.get(op)
        finish[op] = shortest[op] + (finish[before].max(axis=0) if before else 0.0)
    bound = finish.max(axis=0) if len(core_types) else np.zeros(latency.shape[1])
    for cores, kinds in ((num_tc, ("TC", "TCandVC")), (num_vc, ("VC", "TCandVC"))):
        rows = [i for i, kind in enumerate(core_types) if kind in kinds]
        if rows:
            work = np.minimum(latency[rows], cores * parallel[rows]).sum(axis=0)
            bound = np.maximum(bound, work / cores)
    return bound


def layer_work(graphs, space: CandidateSpace, table: EstimateTable, sequence_parallel: bool) -> np.ndarray:
    """Forward + backward schedule lower bound of every layer (rows, program order) on every candidate."""
    num_tc, num_vc = space.num_tc.astype(float), space.num_vc.astype(float)
    row = {layer.id: index for index, layer in enumerate(graphs.layer_graph.layers)}
    work = np.zeros((len(row), len(space)))
    for group in graphs.repeat_groups:
        total = np.zeros(len(space))
        for direction in DIRECTIONS:
            prepared = prepare_layer(graphs.op_graph, group[0], direction, table, sequence_parallel)
            latency, parallel = prepared.candidate_prices(space)
            core_types = [op.core_type for op in prepared.ops]
            total += lower_bounds(latency, parallel, core_types, prepared.edges, num_tc, num_vc)
        work[[row[layer] for layer in group]] = total
    return work


def optimistic_throughputs(job: Job, graphs_by_width, space: CandidateSpace, table: EstimateTable) -> np.ndarray:
    """An upper bound on the throughput [samples/s] of every candidate of `space` (module docstring)."""
    best_time = np.full(len(space), np.inf)
    graphs = step_graphs(graphs_by_width, None)
    memory = max(job.memory_capacities)
    for width, extracted in graphs_by_width.items():
        work = layer_work(extracted, space, table, job.training.sequence_parallel)
        if job.step_model == "original":
            time = _original_bound(job, {width: graphs[width]}, work, memory)
        else:
            step = training_steps(job, {width: graphs[width]}, space.template.hbm_bandwidth, memory, "none")[width]
            time = step.time_lower_bound(work, degrees(step))
        best_time = np.minimum(best_time, time)
    with np.errstate(divide="ignore"):
        return job.global_batch_size / best_time * (1 + ROUNDING_MARGIN)


def _original_bound(job: Job, graphs, work: np.ndarray, memory: int) -> np.ndarray:
    """The original model's bound: its layer latencies carry the collectives on the flat link."""
    ((width, placement_graph),) = original_graphs(job, graphs).items()
    collectives = np.array([layer.collective_latency for layer in placement_graph.layers])[:, None]
    latency = work + collectives
    devices = np.array([width if layer.tensor_parallel else 1 for layer in placement_graph.layers])[:, None]
    sources = {layer.id for layer in placement_graph.layers} - {edge.dest for edge in placement_graph.edges}
    source_parameters = min(layer.parameter_bytes for layer in placement_graph.layers if layer.id in sources)
    step = original_settings(job, memory, "none")
    return original.time_lower_bound(latency.sum(axis=0), latency.max(axis=0), (latency * devices).sum(axis=0),
                                     source_parameters, step)
