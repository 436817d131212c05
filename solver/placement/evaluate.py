"""Score a given placement (stages, devices, data-parallel degree): the DP's check and the baseline."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .inputs import FixedStrategy, PlacementSettings
from .layer_graph import WidthGraph
from .stage_cost import stage_costs, sync_time


class Infeasible(Exception):
    """A placement that cannot run; the message says why."""


@dataclass(frozen=True)
class Score:
    """Time per batch of a placement and the peak memory per device of each stage [bytes]."""

    time_per_batch: float
    memory_bytes: tuple[float, ...]


def score(
    graph: WidthGraph,
    stages: Sequence[Sequence[int]],
    stage_devices: Sequence[int],
    data_parallel_degree: int,
    settings: PlacementSettings,
) -> Score:
    """Time per batch of a 1F1B pipeline of `stages` (positions, first to last), replicated d times.

    time = max stage load × (⌈B/d⌉ + p − 1) + data-parallel sync; raises Infeasible. Each stage
    gets `stage_devices` devices, at least what its layers need.
    """
    devices, batch = settings.devices, settings.micro_batches_per_batch
    if max(stage_devices) > devices:
        raise Infeasible(f"wrong number of devices for a stage: {max(stage_devices)} (cluster has {devices})")
    if data_parallel_degree > min(devices, batch):
        raise Infeasible(
            f"wrong data-parallel degree {data_parallel_degree}: at most {min(devices, batch)} "
            "(the devices and the micro-batches per batch)"
        )
    used = sum(stage_devices) * data_parallel_degree
    if used > devices:
        raise Infeasible(f"too many devices used: {used} > {devices}")
    costs = stage_costs(graph, stages, settings)
    depth = len(stages)
    max_load, memory = 0.0, []
    for index, cost in enumerate(costs):
        in_flight = depth - index
        if in_flight > cost.max_in_flight:
            raise Infeasible(
                f"memory usage too high: stage {index} needs {cost.memory_bytes(in_flight):.6g} bytes per device "
                f"with {in_flight} micro-batches in flight, {settings.memory_per_device:.6g} available"
            )
        max_load = max(max_load, cost.load(in_flight))
        memory.append(cost.memory_bytes(in_flight))
    if settings.sync_cost == "first_stage":
        sync_bytes = costs[0].parameter_bytes
    else:
        sync_bytes = max(cost.parameter_bytes for cost in costs)
    micro_batches = -(-batch // data_parallel_degree)
    time = max_load * float(micro_batches + depth - 1) + sync_time(data_parallel_degree, sync_bytes, settings.bandwidth)
    return Score(time, tuple(memory))


def baseline_stages(layers: int, strategy: FixedStrategy) -> list[list[int]]:
    """Positions of each stage of the fixed baseline (see FixedStrategy), first to last."""
    blocks = strategy.num_transformer_layers
    per_stage = -(-blocks // strategy.pipeline_stages)
    stages: list[list[int]] = [[] for _ in range(strategy.pipeline_stages)]
    for position in range(blocks):
        stages[position // per_stage].append(position)
    stages[-1].extend(range(blocks, layers))
    return stages


def baseline_time(graphs: dict[int, WidthGraph], strategy: FixedStrategy, settings: PlacementSettings) -> float:
    """Time per batch of the fixed baseline; raises Infeasible (e.g. out of memory)."""
    width = strategy.tensor_parallel_width
    if width not in graphs:
        raise Infeasible(f"tensor-parallel width {width} has no layer graph (widths: {sorted(graphs)})")
    if strategy.num_transformer_layers > graphs[width].n:
        raise Infeasible(
            f"num_transformer_layers {strategy.num_transformer_layers} exceeds the {graphs[width].n} layers of the graph"
        )
    stages = baseline_stages(graphs[width].n, strategy)
    return score(graphs[width], stages, [width] * len(stages), strategy.data_parallel_degree, settings).time_per_batch
