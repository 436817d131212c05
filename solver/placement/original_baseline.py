"""The original program's fixed baseline, scored by its step model (`fixedConfigTimePerBatch` of
msr-fiddle/phaze at fed7cde, `Solver/device_placement/device_placement.cpp` lines 1079-1113)."""

from __future__ import annotations

from solver.training_step.original import Infeasible, OriginalStep, price

from .inputs import FixedStrategy
from .layer_graph import WidthGraph


def baseline_stages(layers: int, strategy: FixedStrategy) -> list[list[int]]:
    """Positions of each stage of the fixed baseline (see FixedStrategy), first to last."""
    blocks = strategy.num_transformer_layers
    per_stage = -(-blocks // strategy.pipeline_parallel_width)
    stages: list[list[int]] = [[] for _ in range(strategy.pipeline_parallel_width)]
    for position in range(blocks):
        stages[position // per_stage].append(position)
    stages[-1].extend(range(blocks, layers))
    return stages


def baseline_time(graphs: dict[int, WidthGraph], strategy: FixedStrategy, step: OriginalStep) -> float:
    """Time per batch of the fixed baseline; raises Infeasible (e.g. out of memory)."""
    width = strategy.tensor_parallel_width
    if width not in graphs:
        raise Infeasible(f"tensor-parallel width {width} has no layer graph (widths: {sorted(graphs)})")
    if strategy.num_transformer_layers > graphs[width].n:
        raise Infeasible(
            f"num_transformer_layers {strategy.num_transformer_layers} exceeds the {graphs[width].n} layers of the graph"
        )
    stages = baseline_stages(graphs[width].n, strategy)
    return price(graphs[width], stages, [width] * len(stages), strategy.data_parallel_width, step).time_per_batch
