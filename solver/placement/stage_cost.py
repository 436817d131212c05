"""Time and memory of one pipeline stage (a convex set of layers), as the original defines them.

Execution rule. The layers of a stage run one after another, in ascending topological position,
on the stage's devices. A layer starts when the previous layer of the stage has finished, when
every in-stage predecessor has finished, and when the bytes of every edge from an earlier stage
have arrived (edge bytes / bandwidth, counted from the start of the stage: transfers overlap with
compute and with each other, and only the receiving stage pays). The backward pass mirrors this
from the last layer to the first, receiving gradients of the same size over the edges to later
stages. With activation recomputation, a stage that is not the last one first re-runs its forward
pass (without communication) and starts its backward pass after it.

On a chain stage (each layer fed by the previous one) this is exactly the original program's
cost; the original rejects any other stage ("branching ... not supported"), the rule above extends
it to branching layer graphs. Costs are computed for many stages at once (numpy over stages, one
layer at a time); every value gets the same additions in the same order as the original's, so the
results are bit-identical.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .inputs import PlacementSettings
from .layer_graph import WidthGraph


@dataclass(frozen=True)
class StageCost:
    """Cost of one stage per micro-batch: devices, loads [s], memory [bytes] per device."""

    devices: int
    load_last: float
    load_inner: float
    parameter_bytes: float
    resident_bytes: float
    stash_bytes: float
    max_in_flight: int

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


def sync_time(data_parallel_degree, parameter_bytes, bandwidth: float):
    """Data-parallel gradient all-reduce time: 4(d-1)/d · bytes / bandwidth (original's order)."""
    return (((4.0 * (data_parallel_degree - 1)) * parameter_bytes) / bandwidth) / data_parallel_degree


def stage_cost(graph: WidthGraph, positions: Sequence[int], settings: PlacementSettings) -> StageCost:
    """Cost of the stage holding the layers at `positions` (a convex set)."""
    return stage_costs(graph, [positions], settings)[0]


def stage_costs(graph: WidthGraph, stages: Sequence[Sequence[int]], settings: PlacementSettings) -> list[StageCost]:
    """Costs of a few stages given as lists of positions."""
    members = np.zeros((graph.n, len(stages)), dtype=bool)
    for column, positions in enumerate(stages):
        members[list(positions), column] = True
    table = stage_cost_table(graph, members, settings)
    fields = [getattr(table, name) for name in StageCost.__dataclass_fields__]
    return [StageCost(*(value[column].item() for value in fields)) for column in range(len(stages))]


def stage_cost_table(graph: WidthGraph, members: np.ndarray, settings: PlacementSettings) -> StageCostTable:
    """Costs of many stages: `members[v, k]` says layer position v is in stage k (a convex set)."""
    bandwidth = settings.bandwidth
    forward = _forward(graph, members, bandwidth)
    load_last = forward + _backward(graph, members, bandwidth, np.zeros(members.shape[1]))
    parameters = _sum(members, graph.parameter_bytes)
    activations = _sum(members, graph.activation_bytes)
    if settings.activation_recomputation:
        load_inner = forward + _backward(graph, members, bandwidth, _forward(graph, members, None))
        stash = _incoming_bytes(graph, members)
    else:
        load_inner, stash = load_last, activations
    resident = resident_bytes(parameters, activations, settings.optimizer)
    tensor_parallel = (members & np.array(graph.tensor_parallel, dtype=bool)[:, None]).any(axis=0)
    return StageCostTable(
        devices=np.where(tensor_parallel, graph.width, 1),
        load_last=load_last,
        load_inner=load_inner,
        parameter_bytes=parameters,
        resident_bytes=resident,
        stash_bytes=stash,
        max_in_flight=max_in_flight(resident, stash, settings.memory_per_device, settings.devices),
    )


def _forward(graph: WidthGraph, members: np.ndarray, bandwidth: float | None) -> np.ndarray:
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


def _backward(graph: WidthGraph, members: np.ndarray, bandwidth: float, begin: np.ndarray) -> np.ndarray:
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


def _sum(members: np.ndarray, values: tuple[float, ...]) -> np.ndarray:
    """Sum of `values` over each stage's layers, added in ascending position (adding 0.0 is exact)."""
    total = np.zeros(members.shape[1])
    for v, value in enumerate(values):
        total = total + np.where(members[v], value, 0.0)
    return total


def _incoming_bytes(graph: WidthGraph, members: np.ndarray) -> np.ndarray:
    """Bytes entering each stage from earlier stages, layer by layer, edges in list order."""
    total = np.zeros(members.shape[1])
    for v in range(graph.n):
        for u, transfer in graph.in_edges[v]:
            total = total + np.where(members[v] & ~members[u], transfer, 0.0)
    return total
