"""Optimistic throughputs of every candidate accelerator at once, from schedule lower bounds.

For each layer the schedule lower bound (critical path on the shorter latencies, work per core
type over all its cores: `solver.schedule.lower_bound`) is computed for all candidates as numpy
vectors; w(v) is a layer's forward plus backward bound. With data-parallel degree d, each of the d
pipelines has K_d = floor(K/d) devices and m = ceil(B/d) micro-batches, and the placement DP's time
per batch is L·(m + p − 1) + sync, with L the largest of the p stage loads. Then

* L ≥ W/p, W = Σ_v w(v) (the stage loads add up to at least W);
* L ≥ M = max(max_v w(v), D/K_d): the heaviest layer is in some stage; and the stage loads times
  their devices add up to D = Σ_v w(v)·a(v) (a(v) = t for a tensor-parallel layer, else 1) over at
  most K_d devices;
* so L·(m + p − 1) ≥ max(W/p, M)·(m + p − 1) ≥ W + M·(m − 1) for every p (the minimum over a
  real p is at p = W/M), and also ≥ m·D/K_d;
* the gradient sync is 4(d−1)/d · P1 / bandwidth, and the first stage holds at least the
  parameters of one source layer (the embedding).

The throughput bound is global batch / the least of these times over widths and degrees d.
"""

from __future__ import annotations

import numpy as np

from estimator import CandidateSpace, EstimateTable
from estimator.workload import prepare_layer
from solver.evaluate import DIRECTIONS, TrainingJob

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


def least_time_per_batch(work: np.ndarray, heaviest: np.ndarray, device_seconds: np.ndarray,
                         source_parameters: float, job: TrainingJob, bandwidth: float) -> np.ndarray:
    """The module docstring's bound on the time per batch, minimised over the data-parallel degree."""
    best = np.full(work.shape, np.inf)
    batches = job.micro_batches
    for degree in range(1, min(job.devices, batches) + 1):
        micro_batches, devices = -(-batches // degree), job.devices // degree
        spread = device_seconds / devices
        pipeline = np.maximum(work + np.maximum(heaviest, spread) * (micro_batches - 1), micro_batches * spread)
        sync = 4.0 * (degree - 1) / degree * source_parameters / bandwidth
        best = np.minimum(best, pipeline + sync)
    return best


def optimistic_throughputs(job: TrainingJob, space: CandidateSpace, table: EstimateTable) -> np.ndarray:
    """An upper bound on the throughput [samples/s] of every candidate of `space` (module docstring)."""
    best_time = np.full(len(space), np.inf)
    num_tc, num_vc = space.num_tc.astype(float), space.num_vc.astype(float)
    for width, graphs in job.graphs.items():
        layer_graph = graphs.layer_graph
        sources = {layer.id for layer in layer_graph.layers} - {edge.dest for edge in layer_graph.edges}
        source_parameters = min(layer_graph.layer(layer).parameter_bytes for layer in sources)
        work, heaviest, device_seconds = np.zeros(len(space)), np.zeros(len(space)), np.zeros(len(space))
        for group in graphs.repeat_groups:
            layer_work = np.zeros(len(space))
            for direction in DIRECTIONS:
                prepared = prepare_layer(graphs.op_graph, group[0], direction, table)
                latency, parallel = prepared.candidate_prices(space)
                core_types = [op.core_type for op in prepared.ops]
                layer_work += lower_bounds(latency, parallel, core_types, prepared.edges, num_tc, num_vc)
            devices = sum(width if layer_graph.layer(layer).tensor_parallel else 1 for layer in group)
            work += len(group) * layer_work
            heaviest = np.maximum(heaviest, layer_work)
            device_seconds += devices * layer_work
        bandwidth = space.template.link_bandwidth
        best_time = np.minimum(
            best_time, least_time_per_batch(work, heaviest, device_seconds, source_parameters, job, bandwidth)
        )
    with np.errstate(divide="ignore"):
        return job.global_batch_size / best_time * (1 + ROUNDING_MARGIN)
