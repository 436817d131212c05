"""`solve`: the original program's best pipeline × tensor-parallel × data-parallel placement over all
widths (`system=original`; `solver.placement.best` places with the faithful training step)."""

from __future__ import annotations

import math
from collections.abc import Mapping

from solver.layout import Layout
from solver.training_step.original import Infeasible, price

from .candidates import chain_space, downset_space
from .first_stage import WidthPlacement, candidates, place
from .inputs import PlacementGraph, PlacementSettings
from .layer_graph import checked_widths, topological_order, width_graph
from .original_baseline import baseline_time
from .result import PlacedStage, PlacementResult


def place_original(graphs: Mapping[int, PlacementGraph], settings: PlacementSettings) -> PlacementResult:
    """Place the layer graph (one PlacementGraph per tensor-parallel width) on the cluster.

    Widths are tried in ascending order and a larger width wins only if strictly faster. Chains
    use the interval DP, other DAGs the downset DP; both give the original's results on chains.
    Raises ValueError on malformed input.
    """
    widths = checked_widths(graphs)
    order = topological_order(graphs[widths[0]])
    by_width = {width: width_graph(graphs[width], width, order) for width in widths}
    reference = by_width[widths[0]]
    space = chain_space(reference.n) if reference.is_chain() else downset_space(reference)
    best: WidthPlacement | None = None
    for width in widths:
        graph = by_width[width]
        placement = place(candidates(graph, settings, space), graph, settings)
        if placement is not None and (best is None or placement.time_per_batch < best.time_per_batch):
            best = placement
    baseline, reason = None, None
    if settings.fixed_baseline is not None:
        try:
            baseline = baseline_time(by_width, settings.fixed_baseline, settings)
        except Infeasible as infeasible:
            reason = str(infeasible)
    recompute = "full" if settings.activation_recomputation else "none"
    if best is None:
        return PlacementResult((), None, math.inf, recompute, fixed_baseline_time=baseline,
                               fixed_baseline_infeasible_reason=reason)
    graph = by_width[best.width]
    scored = price(graph, best.stages, best.stage_devices, best.data_parallel_width, settings)
    stages = tuple(
        PlacedStage(tuple(order[p] for p in positions), devices, parameters, memory)
        for positions, devices, parameters, memory in zip(best.stages, best.stage_devices, scored.parameters,
                                                          scored.memory)
    )
    layout = Layout(best.width, len(best.stages), best.data_parallel_width)
    return PlacementResult(stages, layout, best.time_per_batch, recompute, scored.breakdown, baseline, reason)
