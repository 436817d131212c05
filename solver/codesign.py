"""The co-design search for one question at one micro-batch size: candidates evaluated in parallel and
cached.

A `SearchContext` is small and picklable: the question, its axes at one micro-batch size, the chip
template, the area budget, the cache folder and the schedule settings. `Resources` holds what
evaluating candidates needs (the graphs, the candidate space, the estimate table, the caches); the
driver and every worker process build their own once and pass them explicitly. Per candidate, the
layer costs (schedules) are stored in an SQLite file keyed by everything that produced them (with
the version of each model), so an interrupted or repeated run never schedules a candidate twice.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property, partial
from pathlib import Path
from typing import Any

import numpy as np

from phaze_common.progress import Progress
from estimator import MODEL_VERSION as ESTIMATOR_VERSION
from estimator import CandidateSpace, EstimateTable, candidate_space
from graph_extract import ExtractedModel, extract
from graph_extract.serialize import FORMAT_VERSION as GRAPH_VERSION
from phaze_hardware import AcceleratorConfig, KnownChip
from solver import strategies
from solver.bounds import ROUNDING_MARGIN, GroupBounds, group_bounds, optimistic_throughputs
from solver.evaluate import Evaluation, best_of, evaluate_placements, fastest_time
from solver.kvstore import KeyValueStore
from solver.layer_costs import LayerCost, LayerCosts, layer_costs, roofline_costs
from solver.question import Axes, Question
from solver.ray_pool import RayPool
from solver.schedule import MODEL_VERSION as SCHEDULE_VERSION
from solver.schedule import ScheduleCache
from solver.schedule.cache import SCHEDULES_TABLE
from solver.workers import WorkerPool

STRATEGIES = ("bounded", "exhaustive", "phaze")
#: Where a run's candidates are evaluated: local worker processes, or Ray actors.
EXECUTORS = ("local", "ray")
#: Candidates handed to each worker at a time (amortises the inter-process round trip).
BATCH_PER_WORKER = 8
#: Bump when what a cached layer cost means changes.
COSTS_VERSION = 4
#: Bump when what a cached placement means changes (the training-step model, the placement search,
#: the fields of an Evaluation).
PLACEMENT_VERSION = 3
#: Relative slack of the refinement's cut: a candidate that could tie with the best is not cut.
TIE_MARGIN = 1e-9
#: The tables of evaluations.sqlite by Resources field.
EVALUATION_TABLES = {"costs": "layer_costs", "placements": "placements", "placement_bounds": "placement_bounds"}
#: Placements remembered per process (identical layer costs share one placement search).
PLACEMENT_MEMO_SIZE = 4096


@dataclass(frozen=True)
class ScheduleSettings:
    """How every layer is scheduled (see `solver.schedule.solve`)."""

    backend: str = "cpsat"
    time_limit: float = 10.0  # seconds per layer
    milp_solver: str = "cbc"
    relative_gap: float = 0.0

    def scheduler(self, cache: ScheduleCache) -> Callable:
        """problem -> result, through the cache."""
        return partial(cache.solve, backend=self.backend, time_limit=self.time_limit,
                       milp_solver=self.milp_solver, relative_gap=self.relative_gap)


@dataclass(frozen=True)
class SearchContext:
    """What evaluating a candidate of one question at one micro-batch size depends on."""

    question: Question
    axes: Axes  # at one micro-batch size
    template: AcceleratorConfig  # technology of every candidate and the area budget's chip
    area_budget: float | None
    cache_dir: Path
    schedule: ScheduleSettings = ScheduleSettings()

    def costs_key(self, accelerator: AcceleratorConfig) -> str:
        """Key of an accelerator's layer costs: the inputs and the version of every model behind them."""
        question, axes = self.question, self.axes
        record = [
            {"costs": COSTS_VERSION, "graphs": GRAPH_VERSION, "estimates": ESTIMATOR_VERSION,
             "schedules": SCHEDULE_VERSION},
            dataclasses.asdict(question.model),
            axes.micro_batch_size,
            question.sequence_length,
            axes.tensor_parallel_widths,
            [axes.expert_splits(width) for width in axes.tensor_parallel_widths],
            question.kernels.record(),
            accelerator.to_dict(),
            dataclasses.asdict(self.schedule),
        ]
        return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()

    @cached_property
    def _placement_context(self) -> bytes:
        """The part of every placement key that does not depend on the HBM size (a search asks for
        thousands of keys: the question is written out once)."""
        record = [
            {"placement": PLACEMENT_VERSION, "graphs": GRAPH_VERSION, "estimates": ESTIMATOR_VERSION},
            self.question.record(),
            {**self.axes.record(), "memory_capacities": None},
            self.template.hbm_bandwidth,
        ]
        return json.dumps(record, sort_keys=True).encode()

    def placement_key(self, memory: int) -> str:
        """What a placement of given layer costs depends on besides them: the question, the axes (all
        but the HBM sizes), the HBM per device [bytes] and bandwidth, and the version of every model
        behind it."""
        return hashlib.sha256(self._placement_context + b"/%d" % memory).hexdigest()


@dataclass
class Resources:
    """The graphs, candidate space, estimate table and caches of a context, built once by the process
    that holds them (the driver, or a worker: `Resources.build` is the workers' constructor; a Ray
    actor's are `Resources.without_files`, built by the driver)."""

    context: SearchContext
    graphs: dict[int, ExtractedModel]
    space: CandidateSpace
    table: EstimateTable
    schedules: ScheduleCache
    costs: KeyValueStore
    placements: KeyValueStore  # an accelerator's evaluations, per HBM size
    placement_bounds: KeyValueStore  # refined throughput bounds, by the bounds' content
    memo: dict = field(default_factory=dict)  # placements of identical layer costs, in this process
    recorded: dict[str, RecordingStore] = field(default_factory=dict)  # a worker without files: its caches by name
    _bounds: dict[int, GroupBounds] | None = None

    @classmethod
    def build(cls, context: SearchContext) -> Resources:
        space = candidate_space(context.template, context.area_budget)
        table = EstimateTable(context.template, space.tc_cores, context.cache_dir / "estimates")
        schedules = ScheduleCache(context.cache_dir / "schedules.sqlite")
        return cls(context, _graphs(context), space, table, schedules, *_evaluation_stores(context).values())

    @classmethod
    def without_files(cls, context: SearchContext) -> Resources:
        """For a worker that has no cache folder (a Ray worker): the graphs of this process's cache,
        estimates computed where needed, and caches that only record what the worker computes
        (`cache_writes` takes it; the driver stores it)."""
        space = candidate_space(context.template, context.area_budget)
        recorded = {name: RecordingStore() for name in ("schedules", *EVALUATION_TABLES)}
        return cls(context, _graphs(context), space, EstimateTable(context.template, space.tc_cores),
                   ScheduleCache(store=recorded["schedules"]), recorded["costs"], recorded["placements"],
                   recorded["placement_bounds"], recorded=recorded)

    @property
    def question(self) -> Question:
        return self.context.question

    @property
    def axes(self) -> Axes:
        return self.context.axes

    def placement_memo(self) -> dict:
        """The placement memo, emptied when it grows past PLACEMENT_MEMO_SIZE."""
        if len(self.memo) > PLACEMENT_MEMO_SIZE:
            self.memo.clear()
        return self.memo

    def group_bounds(self) -> dict[int, GroupBounds]:
        """The schedule lower bounds of every width's repeat groups on every candidate (computed once)."""
        if self._bounds is None:
            self._bounds = {width: group_bounds(graphs, self.space, self.table, self.question.kernels,
                                                self.axes.expert_splits(width))
                            for width, graphs in self.graphs.items()}
        return self._bounds

    def bound_column(self, index: int) -> np.ndarray:
        """Candidate `index`'s lower-bound costs of every width (`GroupBounds.column`), in one vector."""
        return np.concatenate([bounds.column(index) for _, bounds in sorted(self.group_bounds().items())])

    def bound_key(self, index: int, memory: int) -> str:
        """The key of candidate `index`'s refined bound: its lower-bound costs, the placement's context."""
        key = self.context.placement_key(memory).encode() + self.bound_column(index).tobytes()
        return hashlib.sha256(key).hexdigest()


def _graphs(context: SearchContext) -> dict[int, ExtractedModel]:
    """The question's layer graphs per tensor-parallel width, from the cache or traced (and cached)."""
    question, axes = context.question, context.axes
    return {width: extract(question.model, axes.micro_batch_size, question.sequence_length, width,
                           cache_dir=context.cache_dir)
            for width in axes.tensor_parallel_widths}


def _evaluation_stores(context: SearchContext) -> dict[str, KeyValueStore]:
    """The caches of evaluations.sqlite by Resources field."""
    path = context.cache_dir / "evaluations.sqlite"
    return {name: KeyValueStore(path, table) for name, table in EVALUATION_TABLES.items()}


class RecordingStore:
    """A cache of a worker without files: every lookup misses (the driver looked up what it holds
    before handing out the work) and every value stored waits, as JSON, for `take`."""

    def __init__(self) -> None:
        self._waiting: list[tuple[str, str]] = []

    def get(self, key: str, decode: Callable[[Any], Any] = lambda value: value) -> None:
        return None

    def put(self, key: str, value: Any) -> None:
        self._waiting.append((key, json.dumps(value)))

    def take(self) -> list[tuple[str, str]]:
        """The (key, JSON value) pairs stored since the last call."""
        taken, self._waiting = self._waiting, []
        return taken


def cache_writes(resources: Resources) -> list[tuple[str, str, str]]:
    """What a worker built by `Resources.without_files` stored since the last call: (cache, key, JSON)."""
    return [(name, key, value) for name, store in resources.recorded.items() for key, value in store.take()]


def share_with_workers(context: SearchContext) -> tuple[Resources, Callable[[list[tuple[str, str, str]]], None]]:
    """For workers without the cache folder: their Resources (`Resources.without_files`) and, in
    this process, the function that stores what they computed (`cache_writes`) in this cache."""
    stores = {"schedules": KeyValueStore(context.cache_dir / "schedules.sqlite", SCHEDULES_TABLE),
              **_evaluation_stores(context)}

    def store(writes: list[tuple[str, str, str]]) -> None:
        for name, key, value in writes:
            stores[name].put(key, json.loads(value))

    return Resources.without_files(context), store


def worker_pool(executor: str, n_jobs: int, ray_address: str | None = None) -> WorkerPool | RayPool | None:
    """The workers of a run's candidate evaluations: local processes (none for one job), or Ray actors
    (a private local Ray when `ray_address` is None; `n_jobs` -1: the cluster's CPUs)."""
    if executor == "ray":
        return RayPool(share_with_workers, cache_writes, n_jobs, ray_address)
    return WorkerPool(Resources.build, n_jobs) if n_jobs > 1 else None


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
    resources.costs.put(key, {w: {layer: dataclasses.asdict(c) for layer, c in layers.items()}
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


def evaluation_key(resources: Resources, accelerator: AcceleratorConfig, memory: int) -> str:
    """The key of an accelerator's evaluations for one HBM size."""
    context = resources.context
    return hashlib.sha256(f"{context.placement_key(memory)}/{context.costs_key(accelerator)}".encode()).hexdigest()


def evaluate_accelerator(resources: Resources, accelerator: AcceleratorConfig, index: int = -1,
                         compute: bool = True) -> CandidateOutcome | None:
    """The accelerator's best placements for every HBM size of the axes, from the cache or (`compute`)
    computed and stored; None when not all are cached and `compute` is false."""
    costs, evaluations = None, {}
    for hbm in resources.axes.memory_capacities:
        key = evaluation_key(resources, accelerator, hbm)
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
    # The exact throughput may exceed its bound's by ROUNDING_MARGIN; a cut just above the time
    # matching `best` keeps a candidate that could tie with it.
    batch = question.global_batch_size
    cut = batch * (1 + ROUNDING_MARGIN) / best * (1 + TIE_MARGIN) if best > 0 else math.inf
    values = []
    for index in indices:
        costs = {width: width_bounds.costs(index) for width, width_bounds in bounds.items()}
        time = fastest_time(question, axes, resources.graphs, resources.space[index], costs, cut)
        if math.isfinite(time):
            values.append(RefinedBound(batch / time * (1 + ROUNDING_MARGIN), True))
        else:
            values.append(RefinedBound(batch / cut * (1 + ROUNDING_MARGIN) if best > 0 else 0.0, best <= 0))
    return values


def _refined_bound(record: dict) -> RefinedBound:
    bound = RefinedBound(float(record["value"]), record["exact"])
    if not (bound.value >= 0 and isinstance(bound.exact, bool)):
        raise ValueError(f"not a throughput bound: {record!r}")
    return bound


@dataclass(frozen=True)
class Objective:
    """What a search maximises when it is not the throughput (`solver.system_search`): the value of a
    candidate's best evaluation (`value(index, evaluation)`), and per candidate of the space a weight
    such that weight × a throughput bound bounds the value (exact for tokens per dollar; for tokens
    per joule with the step's dynamic energy taken as zero)."""

    weights: np.ndarray
    value: Callable[[int, Evaluation], float]


class Search:
    """Runs the strategies of one context over its candidates, for each HBM size of the axes.

    Every candidate evaluated for one HBM size is evaluated for all of them (the schedules are
    shared; only the placement differs), and `on_outcome` sees each outcome once, as it arrives.
    What the caches hold (evaluations, refined bounds) is read here; only the rest goes to the
    `pool`'s worker processes (each with its own Resources) or Ray actors (`Resources.without_files`:
    the driver stores what they computed), or is computed here without one.
    Candidates whose lower-bound costs are equal share one refined bound.
    `objective` (default: the throughput), `floor` (a value found in another part of a larger
    search: candidates that cannot reach it are not looked at) and `optimistic` (the candidates'
    level-0 bounds, computed already) serve the system space's search.
    """

    def __init__(
        self,
        resources: Resources,
        pool: WorkerPool | RayPool | None = None,
        on_outcome: Callable[[CandidateOutcome], None] = lambda outcome: None,
        candidates: Sequence[int] | None = None,
        objective: Objective | None = None,
        floor: float = 0.0,
        optimistic: np.ndarray | None = None,
    ) -> None:
        self.resources, self.pool, self.on_outcome = resources, pool, on_outcome
        self.objective, self.floor = objective, floor
        self.context = resources.context
        self.space = resources.space
        self.candidates = list(range(len(self.space))) if candidates is None else list(candidates)
        self.outcomes: dict[int, CandidateOutcome] = {}
        self._refined: dict[tuple[int, int], float] = {}
        self._bounds: dict[str, RefinedBound] = {}  # refined bound by bound key
        self._best: dict[int, float] = {}  # the highest throughput found so far, per HBM size
        self._provisional: dict[tuple[int, int], float] = {}  # the last provisional bound of a candidate
        self._refined_columns: dict[int, tuple[list[np.ndarray], list[float]]] = {}  # per HBM size
        self._optimistic = optimistic  # level-0 bounds of the candidates (in their order), once computed

    @property
    def workers(self) -> int:
        return self.pool.processes if self.pool is not None else 1

    def _map(self, function: Callable, indices: list[int], *arguments) -> list:
        """function(resources, chunk, *arguments) over chunks of `indices`, on the workers if any."""
        if self.pool is None or len(indices) == 1:
            return function(self.resources, indices, *arguments)
        step = self.pool.processes
        chunks = [indices[i::step] for i in range(step) if indices[i::step]]
        results = self.pool.map(self.context, function, chunks, *arguments)
        by_index = {index: value for chunk, values in zip(chunks, results) for index, value in zip(chunk, values)}
        return [by_index[index] for index in indices]

    def _evaluate(self, hbm_bytes: int, positions: list[int]) -> list[float]:
        indices = [self.candidates[p] for p in positions]
        missing = [i for i in dict.fromkeys(indices) if i not in self.outcomes]
        stored = [evaluate_accelerator(self.resources, self.space[i], i, compute=False) for i in missing]
        computed = iter(self._map(evaluate_candidates, [i for i, o in zip(missing, stored) if o is None])
                        if None in stored else ())
        for outcome in stored:
            outcome = outcome or next(computed)
            self.outcomes[outcome.index] = outcome
            for hbm in outcome.evaluations:
                self._best[hbm] = max(self._best.get(hbm, 0.0), outcome.best(hbm).throughput)
            self.on_outcome(outcome)
        if self.objective is not None:
            return [self.objective.value(i, self.outcomes[i].best(hbm_bytes)) for i in indices]
        return [self.outcomes[i].best(hbm_bytes).throughput for i in indices]

    def _usable(self, bound: RefinedBound | None, best: float) -> bool:
        """A refined bound settles a candidate when exact, or when cut and below the best found."""
        return bound is not None and (bound.exact or bound.value < best)

    def _dominated(self, hbm_bytes: int, index: int) -> float:
        """A bound from the refined ones: a candidate whose lower-bound costs are nowhere below a
        refined candidate's has no higher refined bound (a step's time never falls as a layer's cost
        grows), so the least such bound bounds it too (math.inf without one)."""
        columns, values = self._refined_columns.get(hbm_bytes, ([], []))
        if not values:
            return math.inf
        dominating = np.all(np.array(columns) <= self.resources.bound_column(index), axis=1)
        return float(np.array(values)[dominating].min()) if dominating.any() else math.inf

    def _refine(self, hbm_bytes: int, positions: list[int]) -> list[float | strategies.Provisional]:
        """Refined bounds: from memory or the cache when they settle the candidate; else, when a
        refined candidate dominates it with a lower bound than its last, that bound, provisionally;
        else the placement search on its lower-bound costs (once per distinct costs)."""
        store = self.resources.placement_bounds
        # the cut is in throughput: with another objective every refined bound is exact
        best = 0.0 if self.objective is not None else max(self._best.get(hbm_bytes, 0.0), self.floor)
        optimistic = self.optimistic()
        provisional: dict[int, strategies.Provisional] = {}
        keys: dict[int, str] = {}
        todo: dict[str, int] = {}  # bound key -> the candidate it is computed on
        for position in positions:
            index = self.candidates[position]
            if (index, hbm_bytes) in self._refined:
                continue
            key = keys[index] = self.resources.bound_key(index, hbm_bytes)
            if self._usable(self._bounds.get(key), best):
                continue
            stored = store.get(key, _refined_bound)
            if self._usable(stored, best):
                self._bounds[key] = stored
                continue
            dominated = self._dominated(hbm_bytes, index)
            last = self._provisional.get((index, hbm_bytes), float(optimistic[position]))
            if dominated < last:
                provisional[index] = strategies.Provisional(dominated)
                self._provisional[index, hbm_bytes] = dominated
                del keys[index]
            else:
                todo.setdefault(key, index)
        if todo:
            for key, bound in zip(todo, self._map(refined_throughputs, list(todo.values()), hbm_bytes, best)):
                store.put(key, dataclasses.asdict(bound))
                self._bounds[key] = bound
        columns, values = self._refined_columns.setdefault(hbm_bytes, ([], []))
        for index, key in keys.items():
            self._refined[index, hbm_bytes] = self._bounds[key].value
            columns.append(self.resources.bound_column(index))
            values.append(self._bounds[key].value)
        return [provisional.get(i) or self._refined[i, hbm_bytes] for i in (self.candidates[p] for p in positions)]

    def optimistic(self) -> np.ndarray:
        """Level-0 throughput bounds of the candidates (the same for every HBM size)."""
        if self._optimistic is None:
            res = self.resources
            every = self.candidates == list(range(len(self.space)))
            self._optimistic = optimistic_throughputs(res.question, res.axes, res.graphs, self.space, res.group_bounds(),
                                                      None if every else np.asarray(self.candidates))
        return self._optimistic

    def run(self, strategy: str, hbm_bytes: int) -> strategies.SearchResult:
        """The best candidate for one HBM size; result indices are positions in `candidates`."""
        if strategy not in STRATEGIES:
            raise ValueError(f"search: unknown {strategy!r}; valid: {', '.join(STRATEGIES)}")
        evaluate = partial(self._evaluate, hbm_bytes)
        batch_size = BATCH_PER_WORKER * self.workers
        areas = self.space.area[self.candidates]
        if strategy == "exhaustive":
            return strategies.exhaustive(len(self.candidates), evaluate, batch_size, areas)
        if strategy == "phaze":
            return strategies.phaze_sweep(areas, evaluate)
        optimistic, refine = self.optimistic(), partial(self._refine, hbm_bytes)
        if self.objective is not None:
            weights = self.objective.weights[self.candidates]
            optimistic = optimistic * weights

            def refine(positions: list[int], bare: Callable = refine) -> list:
                return [strategies.Provisional(value.value * weights[p]) if isinstance(value, strategies.Provisional)
                        else value * weights[p] for p, value in zip(positions, bare(positions))]

        return strategies.bounded(optimistic, [refine], evaluate, batch_size, areas, self.floor)


def chip_costs(question: Question, axes: Axes, graphs_by_width: dict[int, ExtractedModel], chip: KnownChip,
               cache_dir: Path, schedule: ScheduleSettings = ScheduleSettings()) -> LayerCosts:
    """The layer costs of a known chip at the axes' micro-batch size: its roofline, or (a template
    chip) its schedules, cached in `cache_dir`."""
    if chip.cost_model == "roofline":
        return roofline_costs(question.kernels, graphs_by_width, chip)
    context = SearchContext(question, axes, chip.template, None, cache_dir, schedule)
    return accelerator_costs(Resources.build(context), chip.template)
