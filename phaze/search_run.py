"""A run of the co-design search (`phaze run_solver`, `phaze.search`): every micro-batch size and HBM
size searched, with its baselines.

Writes into the run directory: results.parquet/.csv (one row per evaluated architecture,
micro-batch size, HBM size and recomputation), best.json, and plots; with
`architecture_space=system` (solver.system_search) also pareto.parquet/.csv/.png, the chips
evaluated that no other beats in throughput, peak power and cost. Ctrl-C stops the search and
still writes what was evaluated (best.json then says "complete": false); the caches make a re-run
resume where it stopped.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from phaze_common.progress import Progress
from estimator import CandidateSpace, candidate_space, layer_workload, prepopulate
from phaze_hardware import KNOWN_CHIPS, AcceleratorConfig
from phaze import interrupt, plots, results
from phaze.extracted import extract_all
from phaze.settings import Settings
from solver.search import (
    Baseline,
    CandidateOutcome,
    Resources,
    Search,
    SearchContext,
    accelerator_costs,
    chip_costs,
    evaluate_baseline,
    worker_pool,
)
from solver.evaluate import evaluate_placements, fixed_baseline
from solver.layer_costs import LayerCosts, schedule_problem
from solver.question import Axes
from solver.schedule import plot_gantt
from solver.strategies import SearchResult
from solver.system_search import ChipFigures, SystemOption, SystemSearch, tokens_per_joule
from solver.training_step.options import pipeline_sharding_note
from solver.workers import WorkerPool

log = logging.getLogger(__name__)


def sample(count: int, size: int | None) -> list[int]:
    """`size` candidate indices evenly spaced over `count` (all of them when size is None)."""
    if size is None or size >= count:
        return list(range(count))
    return sorted(set(np.linspace(0, count - 1, size).round().astype(int).tolist()))


def index_in_space(space: CandidateSpace, accelerator: AcceleratorConfig) -> int:
    """The accelerator's position in the candidate space, or -1."""
    match = np.flatnonzero(
        (space.num_tc == accelerator.num_tc) & (space.num_vc == accelerator.num_vc) & (space.width == accelerator.tc_width)
        & (space.depth == accelerator.tc_depth) & (space.glb_bytes == accelerator.glb_bytes)
        & (accelerator.vc_width == accelerator.tc_width)
    )
    return int(match[0]) if len(match) else -1


def _speedup(best: float, baseline: float) -> float | None:
    return best / baseline if baseline > 0 else None


def tpuv4_baseline(settings: Settings, resources: Resources, hbm: int, best: float) -> dict:
    """The budget accelerator (TPUv4-like preset) with its best placement."""
    outcome = evaluate_baseline(Baseline(resources.context, settings.accelerator,
                                         index_in_space(resources.space, settings.accelerator)), resources)
    record = results.best_record(outcome, resources.question, resources.axes, hbm)
    return {**record, "speedup": _speedup(best, record["throughput"])}


#: The known chip every architecture search is measured against: TPU v4 as validated on MaxText's
#: runs (its own figures, systolic feed and fitted tensor-core efficiency; `phaze validate`).
VALIDATED_BASELINE = "tpuv4"


def validated_context(context: SearchContext) -> SearchContext:
    """The validated TPU v4's search context: the run's, with the chip's technology and own HBM."""
    chip = KNOWN_CHIPS[VALIDATED_BASELINE]
    return dataclasses.replace(context, axes=context.axes.at(memory_capacity=chip.hbm_capacity),
                               template=chip.template, area_budget=None)


def baselines(settings: Settings, resources: Resources) -> list[Baseline]:
    """The chips every setting of a micro-batch size is measured against (`Search.prepare`)."""
    index = index_in_space(resources.space, settings.accelerator)
    return [Baseline(resources.context, settings.accelerator, index),
            Baseline(validated_context(resources.context), KNOWN_CHIPS[VALIDATED_BASELINE].template)]


def validated_baseline(resources: Resources, best: float) -> dict:
    """The validated TPU v4 with its best placement on the run's system, with its own HBM (its
    schedules and placements cached as a candidate's are)."""
    chip, context = KNOWN_CHIPS[VALIDATED_BASELINE], resources.context
    baseline = Baseline(validated_context(context), chip.template)
    evaluations = evaluate_baseline(baseline).evaluations
    record = results.best_record(CandidateOutcome(-1, chip, evaluations), context.question, baseline.context.axes,
                                 chip.hbm_capacity)
    return {**record, "speedup": _speedup(best, record["throughput"])}


def fixed_megatron_baseline(settings: Settings, axes: Axes, graphs: dict, costs: LayerCosts, best: CandidateOutcome,
                            hbm: int) -> dict:
    """The model's fixed Megatron-style (p, t, d) on the best accelerator, in its best recomputation mode."""
    fixed = settings.question.baseline
    if fixed is None:
        return {"feasible": False, "throughput": 0.0, "speedup": None,
                "infeasible_reason": "the model defines no fixed_megatron"}
    result, reason = fixed_baseline(settings.question, axes.at(memory_capacity=hbm), graphs, best.accelerator, costs)
    throughput = settings.question.global_batch_size / result.time_per_batch if result else 0.0
    record = {
        "feasible": result is not None,
        "placement": {"pipeline_parallel_width": fixed.pipeline_parallel_width,
                      "tensor_parallel_width": fixed.tensor_parallel_width,
                      "data_parallel_width": fixed.data_parallel_width,
                      **{name: getattr(fixed, name) for name in ("virtual_stages", "expert_parallel_width")
                         if getattr(fixed, name) > 1},
                      **({"expert_tensor_parallel_width": fixed.expert_tensor_parallel_width}
                         if fixed.expert_tensor_parallel_width is not None else {}),
                      "recompute": result.recompute if result else None},
        "throughput": throughput,
        "time_per_batch_s": result.time_per_batch if result else None,
        "speedup": _speedup(best.best(hbm).throughput, throughput),
        "infeasible_reason": reason,
    }
    if result is not None and result.breakdown:
        record["breakdown_s"] = result.breakdown
    return record


@dataclass
class Run:
    """What a run has produced so far; `write` can be called at any time (e.g. after Ctrl-C)."""

    settings: Settings
    directory: Path
    rows: list[dict] = field(default_factory=list)
    per_setting: list[dict] = field(default_factory=list)
    evaluated: set = field(default_factory=set)
    costs: dict = field(default_factory=dict)  # known chips: the layer costs per micro-batch size
    chips: dict = field(default_factory=dict)  # architecture_space=system: a row per (mbs, memory, links, candidate)

    def add(self, outcome: CandidateOutcome, axes: Axes) -> None:
        self.evaluated.add((axes.micro_batch_size, outcome.index))
        for hbm, evaluations in outcome.evaluations.items():
            self.rows.extend(results.evaluation_row(outcome, self.settings.question, axes, hbm, e) for e in evaluations)

    def add_system(self, option: SystemOption, figures: ChipFigures, outcome: CandidateOutcome, axes: Axes,
                   question) -> None:
        """A candidate of the system space: its rows (with its memory, links, power and cost) and its
        point of the Pareto front (its best evaluation)."""
        hbm = int(option.memory.capacity)
        key = (axes.micro_batch_size, option.name(), outcome.index)
        if key in self.chips:
            return
        chip = system_chip_record(option, figures, outcome.index)
        for evaluation in outcome.evaluations[hbm]:
            self.rows.append({**results.evaluation_row(outcome, question, axes, hbm, evaluation), **chip})
        best = outcome.best(hbm)
        self.chips[key] = {"micro_batch_size": axes.micro_batch_size,
                           **results.accelerator_record(outcome.accelerator, outcome.index), **chip,
                           "throughput": best.throughput,
                           "energy_per_token_j": energy_per_token(best, question, chip["idle_power_w"])}
        self.evaluated.add(key)

    def setting(self, search: Search, hbm: int, found: SearchResult | None) -> dict:
        """best.json's record of one (micro-batch, HBM) setting: the search's result, or (`found` None,
        an interrupted search) the best of the outcomes seen so far."""
        axes, complete = search.context.axes, found is not None
        evaluated = len(found.evaluated) if complete else len(search.outcomes)
        if complete:
            best = None if found.best is None else search.outcomes[search.candidates[found.best]]
        else:
            feasible = [o for o in search.outcomes.values() if o.best(hbm).feasible]
            best = max(feasible, key=lambda o: (o.best(hbm).throughput, -o.accelerator.area, -o.index), default=None)
        base = {"micro_batch_size": axes.micro_batch_size, "hbm_size_gib": results.gibibytes(hbm),
                "architectures_evaluated": evaluated, "complete": complete}
        if best is None:
            reason = self.nothing_fits(hbm, complete, evaluated, len(search.candidates))
            return {**base, "feasible": False, "reason": reason, "throughput": 0.0}
        record = {**results.best_record(best, self.settings.question, axes, hbm), **base}
        if (width := record["placement"]["tensor_parallel_width"]) is not None:
            record.update(self.settings.plan_record(axes.micro_batch_size, width))
        if complete:
            record["baselines"] = {
                "tpuv4_like": tpuv4_baseline(self.settings, search.resources, hbm, record["throughput"]),
                VALIDATED_BASELINE: validated_baseline(search.resources, record["throughput"]),
                "fixed_megatron": fixed_megatron_baseline(
                    self.settings, axes, search.resources.graphs, accelerator_costs(search.resources, best.accelerator),
                    best, hbm),
            }
        return record

    def nothing_fits(self, hbm: int, complete: bool, evaluated: int, candidates: int) -> str:
        """Why a setting has no best: nothing of what was searched fits, or the search was interrupted
        before it evaluated any accelerator."""
        if not complete and not evaluated:
            return f"interrupted before any of the {candidates} candidate accelerators was evaluated"
        scope = f"the {candidates} candidate" if complete else f"the {evaluated} evaluated"
        return (f"no placement of {self.settings.spec.name} fits in {results.gibibytes(hbm):.4g} GiB per device on "
                f"any of {scope} accelerators")

    def write(self, complete: bool) -> dict:
        frame = results.write_table(self.directory, [{**row, "run_complete": complete} for row in self.rows])
        per_setting = [noted(setting) for setting in self.per_setting]
        # the best setting by the objective (the system space's `objective_value`; else the throughput)
        best = max(per_setting, key=lambda record: record.get("objective_value", record["throughput"]), default={})
        summary = {
            "model": self.settings.spec.name,
            "sequence_length": self.settings.question.sequence_length,
            "search": self.settings.search,
            "global_batch_size": self.settings.question.global_batch_size,
            "num_devices": self.settings.devices,
            **results.question_record(self.settings.question),
            **best,
            "architectures_evaluated": len(self.evaluated),
            "per_setting": per_setting,
        }
        summary["complete"] = complete
        if self.settings.system_design is not None:
            front = results.write_pareto(self.directory, list(self.chips.values()))
            summary["pareto_front"] = len(front)
            if len(front):
                plots.plot_pareto(front, self.directory / "pareto.png",
                                  f"{self.settings.spec.name}: throughput, peak power and cost of the chips evaluated",
                                  pd.DataFrame(list(self.chips.values())))
        results.write_best(self.directory, summary)
        if len(frame) and "area" in frame:  # a known chip has no area to plot against
            marks = {}
            if best.get("feasible"):
                marks["best"] = (best["accelerator"]["area"], best["throughput"])
                tpu = best.get("baselines", {}).get("tpuv4_like")
                if tpu and tpu["feasible"]:
                    marks["tpuv4_like"] = (tpu["accelerator"]["area"], tpu["throughput"])
            plots.plot_throughput_vs_area(frame.assign(series=plots.series_label(frame)), marks, self.directory / "throughput_vs_area.png",
                                          f"{self.settings.spec.name}: {self.settings.search} search")
        return summary


def noted(setting: dict) -> dict:
    """A setting of best.json with, when its placement shards weights or gradients in a pipeline of two
    or more stages, `notes` in the placement on which frameworks run that
    (`solver.training_step.options.pipeline_sharding_note`)."""
    placement = setting.get("placement") if setting.get("feasible") else None
    note = placement and pipeline_sharding_note(placement["data_parallel_sharding"],
                                                placement["pipeline_parallel_width"])
    return {**setting, "placement": {**placement, "notes": [note]}} if note else setting


def plot_stages(settings: Settings, summary: dict, costs: LayerCosts, directory: Path) -> None:
    """The best placement's compute per stage and micro-batch."""
    width = summary["placement"]["tensor_parallel_width"]
    costs = costs[width]
    stages = summary["placement"]["stages"]
    loads = [sum(costs[layer].forward + costs[layer].backward for layer in stage["layers"]) for stage in stages]
    plots.plot_stages(loads, [plots.layer_ranges(stage["layers"]) for stage in stages], directory / "placement.png",
                      plots.layout_title(settings.spec.name, summary["placement"]))


def plot_best(settings: Settings, summary: dict, directory: Path) -> None:
    """The best placement's stages and the Gantt chart of its largest repeated layer, forward."""
    res = Resources.build(settings.search_context(summary["micro_batch_size"]))
    accelerator = settings.accelerator.with_dimensions(
        **{name: summary["accelerator"][name] for name in settings.accelerator.dimensions()})
    width = summary["placement"]["tensor_parallel_width"]
    plot_stages(settings, summary, accelerator_costs(res, accelerator), directory)
    graphs = res.graphs[width]
    layer = max(graphs.repeat_groups, key=len)[0]
    workload = layer_workload(graphs.op_graph, layer, "forward", accelerator, res.table,
                              settings.question.kernels)
    problem = res.schedules.problem_solved(schedule_problem(workload, accelerator))
    schedule = settings.schedule.scheduler(res.schedules)(problem)
    name = graphs.layer_graph.layer(layer).name
    plot_gantt(problem, schedule, directory / "gantt.png", f"{settings.spec.name} {name} forward, width {width}")


def setting_count(settings: Settings) -> int:
    """The (micro-batch, HBM) settings of a run."""
    return len(settings.axes.micro_batch_sizes) * len(settings.axes.memory_capacities)


def search_known(settings: Settings, record: Run) -> None:
    """A chip that exists: no architecture search, the best placement of every (micro-batch, HBM)
    setting over t, p, d, v and recomputation, and the model's fixed Megatron placement beside it."""
    chip, graphs = settings.known_chip, extract_all(settings)
    with Progress(f"placement on {chip.name} per (micro-batch, HBM)", setting_count(settings), "settings",
                  log) as placement:
        for micro_batch_size in settings.axes.micro_batch_sizes:
            axes = settings.axes.at(micro_batch_size=micro_batch_size)
            costs = chip_costs(settings.question, axes, graphs[micro_batch_size], chip, settings.cache_dir,
                               settings.schedule)
            outcome = CandidateOutcome(-1, chip, {
                hbm: evaluate_placements(settings.question, axes.at(memory_capacity=hbm), graphs[micro_batch_size],
                                         chip, costs)
                for hbm in axes.memory_capacities})
            placement.advance(len(axes.memory_capacities))
            record.add(outcome, axes)
            record.costs[micro_batch_size] = costs
            for hbm in axes.memory_capacities:
                setting = {**results.best_record(outcome, settings.question, axes, hbm), "architectures_evaluated": 1,
                           "complete": True}
                if not setting["feasible"]:
                    setting["reason"] = (f"no placement of {settings.spec.name} fits in "
                                         f"{results.gibibytes(hbm):.4g} GiB per device of {chip.name}")
                else:
                    setting["baselines"] = {"fixed_megatron": fixed_megatron_baseline(
                        settings, axes, graphs[micro_batch_size], costs, outcome, hbm)}
                record.per_setting.append(setting)


def system_chip_record(option: SystemOption, figures: ChipFigures, index: int) -> dict:
    """A candidate's memory, links, die area, peak and idle power and cost in the system space."""
    return {**option.record(), "die_area": float(figures.die_area[index]), "power_w": float(figures.peak_power[index]),
            "idle_power_w": float(figures.idle_power[index]), "cost_usd": float(figures.cost[index])}


def energy_per_token(evaluation, question, idle_power: float) -> float | None:
    """J a token: the inverse of `tokens_per_joule` (None when nothing fits)."""
    value = tokens_per_joule(evaluation, question, idle_power)
    return 1 / value if value > 0 else None


def search_system(settings: Settings, record: Run) -> None:
    """The system space's search (solver.system_search) of every micro-batch size, into `record`."""
    design = settings.system_design
    pool = worker_pool(settings.executor, settings.n_jobs, settings.ray_address)
    options = len(design.options)
    try:
        graphs_and_estimates(settings, pool, design.compute_budget)
        with (Progress(f"system space ({settings.search} search over {options} memories and links)",
                       len(settings.axes.micro_batch_sizes), "micro-batch sizes", log) as progress,
              Progress("chips of the system space", None, "architectures", log, step=False) as chips):
            for micro_batch_size in settings.axes.micro_batch_sizes:
                context = settings.search_context(micro_batch_size)
                space = candidate_space(settings.accelerator, design.compute_budget)
                candidates = sample(len(space), settings.candidate_sample)

                def on_outcome(option: SystemOption, figures: ChipFigures, outcome: CandidateOutcome,
                               axes: Axes = context.axes) -> None:
                    question = dataclasses.replace(settings.question, cluster=option.cluster)
                    record.add_system(option, figures, outcome, axes.at(memory_capacity=int(option.memory.capacity)),
                                      question)
                    chips.advance()

                search = SystemSearch(context, design, pool, on_outcome, candidates)
                own = Resources.build(context)
                search.prepare(baselines(settings, own))
                found, evaluated = search.run(settings.search)
                record.per_setting.append(system_setting(settings, own, found, evaluated))
                progress.advance()
    finally:
        if pool is not None:
            with interrupt.held(raise_after=False):
                pool.close()


def system_setting(settings: Settings, own: Resources, found, evaluated: int) -> dict:
    """best.json's record of one micro-batch size in the system space (`own`: the run's resources at
    that size, where the baselines are evaluated)."""
    design, context = settings.system_design, own.context
    base = {"micro_batch_size": context.axes.micro_batch_size, "architectures_evaluated": evaluated, "complete": True,
            "objective": design.objective}
    if found is None or found.best is None:
        return {**base, "hbm_size_gib": 0.0, "feasible": False, "throughput": 0.0,
                "reason": f"no chip of the system space within the budgets fits {settings.spec.name}"}
    option, outcome, resources = found.option, found.best, found.resources
    hbm = int(option.memory.capacity)
    record = {**results.best_record(outcome, resources.question, resources.axes, hbm), **base,
              "objective_value": found.value}
    chip = system_chip_record(option, found.figures, outcome.index)
    record["accelerator"].update(chip)
    record.update(power_w=chip["power_w"], cost_usd=chip["cost_usd"],
                  energy_per_token_j=energy_per_token(outcome.best(hbm), resources.question, chip["idle_power_w"]))
    record["baselines"] = {
        "tpuv4_like": tpuv4_baseline(settings, own, context.axes.memory_capacities[0], record["throughput"]),
        VALIDATED_BASELINE: validated_baseline(own, record["throughput"]),
    }
    return record


def graphs_and_estimates(settings: Settings, pool: WorkerPool | None, area_budget: float | None) -> None:
    """Trace the run's graphs and estimate their GEMMs on the candidate space within `area_budget`
    (into the cache folder), on the local workers when there are some (Ray's keep no cache folder)."""
    call = pool.call if isinstance(pool, WorkerPool) else None
    graphs = extract_all(settings, call)
    prepopulate([g for by_width in graphs.values() for g in by_width.values()], settings.accelerator,
                cache_dir=settings.cache_dir / "estimates", area_budget=area_budget, call=call)


def search_all(settings: Settings, record: Run) -> None:
    """The co-design search of every (micro-batch, HBM) setting, into `record`."""
    pool = worker_pool(settings.executor, settings.n_jobs, settings.ray_address)
    try:
        graphs_and_estimates(settings, pool, settings.area_budget)
        space = candidate_space(settings.accelerator, settings.area_budget)
        candidates = sample(len(space), settings.candidate_sample)
        searched = len(candidates) * len(settings.axes.micro_batch_sizes)
        name, total = f"candidates ({settings.search} search)", searched
        if settings.search != "exhaustive":  # it stops early: all candidates are only an upper bound
            name, total = f"candidates ({settings.search} search, at most {searched:,})", None
        with (Progress("placement per (micro-batch, HBM)", setting_count(settings), "settings", log) as placement,
              Progress(name, total, "architectures", log, step=False) as progress):
            for micro_batch_size in settings.axes.micro_batch_sizes:
                resources = Resources.build(settings.search_context(micro_batch_size))

                def on_outcome(outcome: CandidateOutcome, axes: Axes = resources.axes) -> None:
                    record.add(outcome, axes)
                    progress.advance()

                search = Search(resources, pool, on_outcome, candidates)
                search.prepare(baselines(settings, resources))
                for hbm in resources.axes.memory_capacities:
                    try:
                        found = search.run(settings.search, hbm)
                    except KeyboardInterrupt:
                        record.per_setting.append(record.setting(search, hbm, None))
                        raise
                    record.per_setting.append(record.setting(search, hbm, found))
                    placement.advance()
    finally:
        if pool is not None:
            with interrupt.held(raise_after=False):
                pool.close()


def execute(settings: Settings, directory: Path) -> dict:
    """Search every (micro-batch, HBM) setting, write the run's files into `directory`, return best.json.

    Interrupted (Ctrl-C, SIGTERM), it writes what was done, marked `"complete": false`, and returns."""
    record = Run(settings, directory)
    complete = False
    try:
        if settings.known_chip is not None:
            search_known(settings, record)
        elif settings.system_design is not None:
            search_system(settings, record)
        else:
            search_all(settings, record)
        complete = True
    except KeyboardInterrupt:
        pass
    finally:  # on an error too: what was done is written, incomplete
        with interrupt.held(raise_after=complete):
            summary = record.write(complete)
    if complete and summary.get("feasible") and settings.system_design is None:
        if settings.known_chip is not None:
            plot_stages(settings, summary, record.costs[summary["micro_batch_size"]], directory)
        else:
            plot_best(settings, summary, directory)
    return summary
