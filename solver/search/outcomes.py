"""One candidate evaluated through the caches: its scheduled layer costs, its best placement per
HBM size, and the throughput bound the placement search gives on its schedule lower bounds."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from phaze_common.progress import Progress
from graph_extract import ExtractedModel
from phaze_hardware import AcceleratorConfig, KnownChip
from solver import strategies
from solver.bounds import FLOAT_MARGIN
from solver.evaluate import Evaluation, best_of, evaluate_placements, fastest_time
from solver.layer_costs import LayerCost, LayerCosts, layer_costs, roofline_costs
from solver.question import Axes, Question
from solver.search.keys import ScheduleSettings, SearchContext, evaluation_key
from solver.search.resources import Resources

#: Relative slack of the refinement's cut: a candidate that could tie with the best (throughputs
#: tie within `strategies.RESOLUTION`) is not cut, and a cut bound is below the best's resolution.
TIE_MARGIN = 2 * strategies.RESOLUTION


def _stored_costs(graphs: dict[int, ExtractedModel], stored: Any) -> LayerCosts:
    """Layer costs as `accelerator_costs` stores them, checked to cover every layer of `graphs` with
    numbers (ValueError if not, or whatever decoding raises): a bad value is a miss."""
    def cost_of(record: dict) -> LayerCost:
        split = tuple(tuple(entry) for entry in record.get("expert_parallel_times", ()))  # JSON's lists
        modules = tuple((str(name), seconds) for name, seconds in record.get("module_forward", ()))
        return LayerCost(**{**record, "expert_parallel_times": split, "module_forward": modules})

    def numbers(cost: LayerCost) -> list:
        return [*(getattr(cost, item.name) for item in dataclasses.fields(cost)
                  if item.name not in ("expert_parallel_times", "module_forward")),
                *(x for entry in cost.expert_parallel_times for x in entry),
                *(seconds for _, seconds in cost.module_forward)]

    costs = {int(w): {int(layer): cost_of(cost) for layer, cost in layers.items()} for w, layers in stored.items()}
    layers = {width: {layer.id for layer in graph.layer_graph.layers} for width, graph in graphs.items()}
    if {width: set(by_layer) for width, by_layer in costs.items()} != layers or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool)
            for by_layer in costs.values() for cost in by_layer.values() for x in numbers(cost)):
        raise ValueError("not the numeric costs of every layer")
    return costs


def accelerator_costs(resources: Resources, accelerator: AcceleratorConfig) -> LayerCosts:
    """The scheduled layer costs of one accelerator, from the cache or computed and stored."""
    context = resources.context
    key = context.costs_key(accelerator)
    stored = resources.costs.get(key, partial(_stored_costs, resources.graphs))
    if stored is not None:
        return stored
    chip = (f"{accelerator.num_tc} TC {accelerator.tc_width}x{accelerator.tc_depth}, {accelerator.num_vc} VC, "
            f"{accelerator.glb_bytes // 2**20} MiB")
    groups = sum(len(graphs.repeat_groups) for graphs in resources.graphs.values())
    with Progress(f"layer schedules of {chip}", groups, "unique layers") as progress:
        costs = layer_costs(resources.question.kernels, resources.graphs, accelerator, resources.table,
                            context.schedule.scheduler(resources.schedules), progress.advance,
                            context.axes.expert_splits)
    resources.costs.put(key, {w: {layer: c.record() for layer, c in layers.items()}
                              for w, layers in costs.items()})
    return costs


@dataclass(frozen=True)
class CandidateOutcome:
    """Evaluations of one accelerator: per HBM size [bytes], one per recomputation mode."""

    index: int  # position in the candidate space, -1 for an accelerator outside it
    accelerator: AcceleratorConfig
    evaluations: dict[int, tuple[Evaluation, ...]]

    def best(self, hbm_bytes: int) -> Evaluation:
        return best_of(self.evaluations[hbm_bytes])


def _evaluations(records: list) -> tuple[Evaluation, ...]:
    return tuple(map(Evaluation.from_record, records))


def evaluate_accelerator(resources: Resources, accelerator: AcceleratorConfig, index: int = -1,
                         compute: bool = True) -> CandidateOutcome | None:
    """The accelerator's best placements for every HBM size of the axes, from the cache or (`compute`)
    computed and stored; None when not all are cached and `compute` is false."""
    costs, evaluations = None, {}
    for hbm in resources.axes.memory_capacities:
        key = evaluation_key(resources.context, accelerator, hbm)
        stored = resources.placements.get(key, _evaluations)
        if stored is not None:
            evaluations[hbm] = stored
            continue
        if not compute:
            return None
        costs = costs or accelerator_costs(resources, accelerator)
        evaluations[hbm] = evaluate_placements(resources.question, resources.axes.at(memory_capacity=hbm),
                                               resources.graphs, accelerator, costs, resources.placement_memo())
        resources.placements.put(key, [dataclasses.asdict(evaluation) for evaluation in evaluations[hbm]])
    return CandidateOutcome(index, accelerator, evaluations)


def evaluate_candidates(resources: Resources, indices: Sequence[int]) -> list[CandidateOutcome]:
    return [evaluate_accelerator(resources, resources.space[i], i) for i in indices]


@dataclass(frozen=True)
class RefinedBound:
    """An upper bound on a candidate's throughput [samples/s] from the placement search on its
    layers' schedule lower bounds: `exact` when that search ran to the end, else a search cut at a
    time no candidate beating the best so far could exceed (the bound is then just below that best)."""

    value: float
    exact: bool


def refined_throughputs(resources: Resources, indices: Sequence[int], hbm_bytes: int,
                        best: float = 0.0) -> list[RefinedBound]:
    """Throughput upper bounds: the placement search run on the layers' schedule lower bounds, cut
    where the candidate could no longer reach `best` (a throughput found already)."""
    question, bounds = resources.question, resources.group_bounds()
    axes = resources.axes.at(memory_capacity=hbm_bytes)
    # The exact throughput may exceed its bound's by FLOAT_MARGIN; a cut just above the time
    # matching `best` keeps a candidate that could tie with it.
    batch = question.global_batch_size
    cut = batch * (1 + FLOAT_MARGIN) / (best * (1 - TIE_MARGIN)) if best > 0 else math.inf
    values = []
    for index in indices:
        costs = {width: width_bounds.costs(index) for width, width_bounds in bounds.items()}
        time = fastest_time(question, axes, resources.graphs, resources.space[index], costs, cut)
        if math.isfinite(time):
            values.append(RefinedBound(batch / time * (1 + FLOAT_MARGIN), True))
        else:
            values.append(RefinedBound(batch / cut * (1 + FLOAT_MARGIN) if best > 0 else 0.0, best <= 0))
    return values


def refined_bound(record: dict) -> RefinedBound:
    bound = RefinedBound(float(record["value"]), record["exact"])
    if not (bound.value >= 0 and isinstance(bound.exact, bool)):
        raise ValueError(f"not a throughput bound: {record!r}")
    return bound


def chip_costs(question: Question, axes: Axes, graphs_by_width: dict[int, ExtractedModel], chip: KnownChip,
               cache_dir: Path, schedule: ScheduleSettings = ScheduleSettings()) -> LayerCosts:
    """The layer costs of a known chip at the axes' micro-batch size: its roofline, or (a template
    chip) its schedules, cached in `cache_dir`."""
    if chip.cost_model == "roofline":
        return roofline_costs(question.kernels, graphs_by_width, chip)
    context = SearchContext(question, axes, chip.template, None, cache_dir, schedule)
    return accelerator_costs(Resources.build(context), chip.template)
