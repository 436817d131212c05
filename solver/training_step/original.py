"""The original program's training step, kept bit for bit as the preset `system=original`: the stage
cost (`getLoadOfStageForA`) and the time per batch (`getTimePerBatchForResult`) of msr-fiddle/phaze
at fed7cde, `Solver/device_placement/device_placement.cpp` lines 774-1055.

* One flat link of `bandwidth` for every transfer; latencies and bytes/bandwidth are simply added
  (the original's JSON mixes ms and s; the model is unit-agnostic).
* Stage load per micro-batch: the layers of a stage run one after another in ascending topological
  position. A layer starts when the previous layer of the stage, its in-stage predecessors and the
  transfers from earlier stages (edge bytes / bandwidth, counted from the stage's start, in
  parallel, paid by the receiver) are done; the backward pass mirrors it with gradients of the same
  size. With activation recomputation, a stage that is not the last one first re-runs its forward
  pass (without communication) before its backward pass. On a chain this is exactly the original's
  cost; the original rejects other stages, the rule extends it to branching layer graphs.
* Memory of the stage q-th from the end: 2P (+P with Adam) + A + (q − 1)·stash, stash = A, or the
  bytes entering the stage with recomputation.
* time = largest stage load × (⌈B/d⌉ + p − 1) + 4(d − 1)/d · P_first / bandwidth: the data-parallel
  sync of the first stage only (the original charges the first stage's parameters, not the largest
  stage's, device_placement.cpp lines 1036 and 1053; kept for parity).

Costs are computed for many stages at once (numpy over stages, one layer at a time); every value
gets the same additions in the same order as the original's, so the results are bit-identical.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from solver.training_step.records import StepResult
from solver.training_step.stages import stage_sum

OPTIMIZERS = ("SGD", "Adam")


class Infeasible(Exception):
    """A placement that cannot run; the message says why (the original's FAIL messages)."""


@dataclass(frozen=True)
class OriginalStep:
    """The original's step on `devices` devices of `memory_per_device` bytes joined by one link."""

    devices: int
    memory_per_device: float
    bandwidth: float
    micro_batches_per_batch: int
    activation_recomputation: bool = False
    optimizer: str = "SGD"


@dataclass(frozen=True)
class StageCost:
    """Cost of one stage per micro-batch: devices, loads, memory per device."""

    devices: int
    load_last: float
    load_inner: float
    parameter_bytes: float
    resident_bytes: float
    stash_bytes: float
    max_in_flight: int
    forward: float  # Σ forward latencies (what recomputation re-runs)
    compute: float  # Σ forward + backward latencies

    def load(self, position_from_end: int) -> float:
        """Forward+backward time when the stage is `position_from_end`-th from the end (1 = last)."""
        return self.load_inner if position_from_end > 1 else self.load_last

    def memory_bytes(self, position_from_end: int) -> float:
        """Peak bytes per device with `position_from_end` micro-batches in flight."""
        return self.resident_bytes + (position_from_end - 1) * self.stash_bytes


@dataclass(frozen=True)
class StageCostTable:
    """The fields of `StageCost` as arrays over many stages.

    load_last: forward + backward, used for the last stage or without recomputation;
    load_inner: the load of any other stage (with recomputation, forward + re-run + backward);
    max_in_flight: most micro-batches the stage can hold in memory (it fits q-th from the end iff
    q <= max_in_flight).
    """

    devices: np.ndarray
    load_last: np.ndarray
    load_inner: np.ndarray
    parameter_bytes: np.ndarray
    resident_bytes: np.ndarray
    stash_bytes: np.ndarray
    max_in_flight: np.ndarray
    forward: np.ndarray
    compute: np.ndarray


def resident_bytes(parameter_bytes, activation_bytes, optimizer: str):
    """Weights + gradients (+ one more copy for Adam) + one live micro-batch of activations."""
    optimizer_bytes = parameter_bytes if optimizer == "Adam" else 0.0
    return (2.0 * parameter_bytes + optimizer_bytes) + activation_bytes


def max_in_flight(resident, stash, memory: float, devices: int) -> np.ndarray:
    """Largest number of micro-batches in flight that fit in `memory` (capped at `devices`).

    Works elementwise on arrays; the original's float expressions, in its order.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        partial = 1.0 + np.floor((memory - resident) / stash)
    fits_all = resident + float(devices - 1) * stash <= memory
    return np.where(fits_all, devices, np.where(resident > memory, 0, partial)).astype(np.int64)


def sync_time(data_parallel_width, parameter_bytes, bandwidth: float):
    """Data-parallel gradient all-reduce time: 4(d-1)/d · bytes / bandwidth (original's order)."""
    return (((4.0 * (data_parallel_width - 1)) * parameter_bytes) / bandwidth) / data_parallel_width


def pipeline_time(max_load, micro_batches, stages):
    """Largest stage load × (m + p − 1), the original's 1F1B formula."""
    return max_load * (micro_batches + stages - 1)


def time_lower_bound(work, heaviest, device_seconds, source_parameters: float, step: OriginalStep):
    """A lower bound on the original's time per batch of any placement, minimised over d, for
    layers of at least these costs (arrays, e.g. over candidate chips).

    With ⌊K/d⌋ devices and m = ⌈B/d⌉ micro-batches per replica, the largest stage load L of p
    stages is at least W/p (W = Σ loads) and at least M (the heaviest layer) and, stage loads
    times their devices adding up to D, at least D/⌊K/d⌋; so L·(m + p − 1) ≥ W + M·(m − 1) (the
    least over a real p) and ≥ m·D/⌊K/d⌋; the first stage holds at least `source_parameters`.
    """
    best = np.full(np.shape(work), np.inf)
    batches = step.micro_batches_per_batch
    for degree in range(1, min(step.devices, batches) + 1):
        micro_batches, devices = -(-batches // degree), step.devices // degree
        spread = device_seconds / devices
        pipeline = np.maximum(work + np.maximum(heaviest, spread) * (micro_batches - 1), micro_batches * spread)
        best = np.minimum(best, pipeline + sync_time(degree, source_parameters, step.bandwidth))
    return best


def stage_costs(graph, stages: Sequence[Sequence[int]], step: OriginalStep) -> list[StageCost]:
    """Costs of a few stages given as lists of positions."""
    members = np.zeros((graph.n, len(stages)), dtype=bool)
    for column, positions in enumerate(stages):
        members[list(positions), column] = True
    table = stage_cost_table(graph, members, step)
    fields = [getattr(table, name) for name in StageCost.__dataclass_fields__]
    return [StageCost(*(value[column].item() for value in fields)) for column in range(len(stages))]


def stage_cost(graph, positions: Sequence[int], step: OriginalStep) -> StageCost:
    """Cost of the stage holding the layers at `positions` (a convex set)."""
    return stage_costs(graph, [positions], step)[0]


def stage_cost_table(graph, members: np.ndarray, step: OriginalStep) -> StageCostTable:
    """Costs of many stages: `members[v, k]` says layer position v is in stage k (a convex set).

    `graph` is a `solver.placement.layer_graph.WidthGraph` (layers at topological positions).
    """
    bandwidth = step.bandwidth
    forward = _forward(graph, members, bandwidth)
    load_last = forward + _backward(graph, members, bandwidth, np.zeros(members.shape[1]))
    parameters = stage_sum(members, graph.parameter_bytes)
    activations = stage_sum(members, graph.activation_bytes)
    rerun = _forward(graph, members, None)
    if step.activation_recomputation:
        load_inner = forward + _backward(graph, members, bandwidth, rerun)
        stash = _incoming_bytes(graph, members)
    else:
        load_inner, stash = load_last, activations
    resident = resident_bytes(parameters, activations, step.optimizer)
    tensor_parallel = (members & np.array(graph.tensor_parallel, dtype=bool)[:, None]).any(axis=0)
    return StageCostTable(
        devices=np.where(tensor_parallel, graph.width, 1),
        load_last=load_last,
        load_inner=load_inner,
        parameter_bytes=parameters,
        resident_bytes=resident,
        stash_bytes=stash,
        max_in_flight=max_in_flight(resident, stash, step.memory_per_device, step.devices),
        forward=rerun,
        compute=stage_sum(members, graph.forward) + stage_sum(members, graph.backward),
    )


def _forward(graph, members: np.ndarray, bandwidth: float | None) -> np.ndarray:
    """Forward pass time of each stage; without `bandwidth`, the re-run that receives nothing."""
    finish = np.zeros(members.shape)
    done = np.zeros(members.shape[1])
    for v in range(graph.n):
        start = done
        for u, transfer in graph.in_edges[v]:
            outside = 0.0 if bandwidth is None else transfer / bandwidth
            start = np.maximum(start, np.where(members[u], finish[u], outside))
        finish[v] = start + graph.forward[v]
        done = np.where(members[v], finish[v], done)
    return done


def _backward(graph, members: np.ndarray, bandwidth: float, begin: np.ndarray) -> np.ndarray:
    """Backward pass time of each stage, which may start at `begin`."""
    finish = np.zeros(members.shape)
    done = begin
    for v in range(graph.n - 1, -1, -1):
        start = done
        for w, transfer in graph.out_edges[v]:
            start = np.maximum(start, np.where(members[w], finish[w], transfer / bandwidth))
        finish[v] = start + graph.backward[v]
        done = np.where(members[v], finish[v], done)
    return done


def _incoming_bytes(graph, members: np.ndarray) -> np.ndarray:
    """Bytes entering each stage from earlier stages, layer by layer, edges in list order."""
    total = np.zeros(members.shape[1])
    for v in range(graph.n):
        for u, transfer in graph.in_edges[v]:
            total = total + np.where(members[v] & ~members[u], transfer, 0.0)
    return total


def price(
    graph,
    stages: Sequence[Sequence[int]],
    stage_devices: Sequence[int],
    data_parallel_width: int,
    step: OriginalStep,
) -> StepResult:
    """Time per batch of a 1F1B pipeline of `stages` (positions, first to last), replicated d times,
    with its breakdown and each stage's peak memory per device; raises Infeasible.

    Each stage gets `stage_devices` devices, at least what its layers need. The part of the
    latencies spent in collectives (`graph.collective`, per position) is its own breakdown term.
    """
    devices, batch = step.devices, step.micro_batches_per_batch
    if max(stage_devices) > devices:
        raise Infeasible(f"wrong number of devices for a stage: {max(stage_devices)} (cluster has {devices})")
    if data_parallel_width > min(devices, batch):
        raise Infeasible(
            f"wrong data-parallel degree {data_parallel_width}: at most {min(devices, batch)} "
            "(the devices and the micro-batches per batch)"
        )
    used = sum(stage_devices) * data_parallel_width
    if used > devices:
        raise Infeasible(f"too many devices used: {used} > {devices}")
    costs = stage_costs(graph, stages, step)
    depth = len(stages)
    max_load, slowest, memory = 0.0, 0, []
    for index, cost in enumerate(costs):
        in_flight = depth - index
        if in_flight > cost.max_in_flight:
            raise Infeasible(
                f"memory usage too high: stage {index} needs {cost.memory_bytes(in_flight):.6g} bytes per device "
                f"with {in_flight} micro-batches in flight, {step.memory_per_device:.6g} available"
            )
        if cost.load(in_flight) > max_load:
            max_load, slowest = cost.load(in_flight), index
        memory.append(cost.memory_bytes(in_flight))
    micro_batches = -(-batch // data_parallel_width)
    sync = sync_time(data_parallel_width, costs[0].parameter_bytes, step.bandwidth)
    time = pipeline_time(max_load, float(micro_batches), depth) + sync
    bottleneck = costs[slowest]
    collectives = sum(graph.collective[p] for p in stages[slowest]) if graph.collective else 0.0
    rerun = bottleneck.forward if step.activation_recomputation and depth - slowest > 1 else 0.0
    breakdown = {
        "compute": micro_batches * (bottleneck.compute - collectives),
        "recompute": micro_batches * rerun,
        "tensor_parallel": micro_batches * collectives,
        "expert_parallel": 0.0,
        "bubble": (depth - 1) * max_load,
        "pipeline_transfer": micro_batches * (max_load - bottleneck.compute - rerun),
        "data_parallel_sync": float(sync),
        "optimizer": 0.0,
    }
    memory_by_kind = []
    for cost, total in zip(costs, memory):
        state = cost.parameter_bytes if step.optimizer == "Adam" else 0.0
        memory_by_kind.append({"weights": cost.parameter_bytes, "gradients": cost.parameter_bytes,
                               "optimizer_state": state, "activations": total - (2 * cost.parameter_bytes + state),
                               "total": total})
    return StepResult(float(time), breakdown, tuple(cost.parameter_bytes / 2 for cost in costs), tuple(memory_by_kind))
