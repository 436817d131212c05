"""The co-design search for one job (one micro-batch size): candidates evaluated in parallel and cached.

A `SearchContext` is small and picklable: the job, the chip template, the area budget, the cache
folder and the schedule settings. `Resources` holds what evaluating candidates needs (the graphs,
the candidate space, the estimate table, the caches); the driver and every worker process build
their own once and pass them explicitly. Per candidate, the layer costs (schedules) are stored in an
SQLite file keyed by everything that produced them (with the version of each model), so an
interrupted or repeated run never schedules a candidate twice.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from estimator import MODEL_VERSION as ESTIMATOR_VERSION
from estimator import AcceleratorConfig, CandidateSpace, EstimateTable, candidate_space
from graph_extract import ExtractedModel, extract
from graph_extract.serialize import FORMAT_VERSION as GRAPH_VERSION
from solver import search
from solver.bounds import ROUNDING_MARGIN, optimistic_throughputs
from solver.evaluate import (
    Evaluation,
    LayerCost,
    LayerCosts,
    best_of,
    evaluate_placements,
    layer_costs,
    lower_bound_costs,
)
from solver.job import Job
from solver.kvstore import KeyValueStore
from solver.schedule import MODEL_VERSION as SCHEDULE_VERSION
from solver.schedule import ScheduleCache
from solver.workers import WorkerPool

STRATEGIES = ("bounded", "exhaustive", "phaze")
#: Candidates handed to each worker at a time (amortises the inter-process round trip).
BATCH_PER_WORKER = 8
#: Bump when what a cached layer cost means changes.
COSTS_VERSION = 2
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
    """What evaluating a candidate of one job depends on."""

    job: Job
    template: AcceleratorConfig  # technology of every candidate and the area budget's chip
    area_budget: float | None
    cache_dir: Path
    schedule: ScheduleSettings = ScheduleSettings()

    def costs_key(self, accelerator: AcceleratorConfig) -> str:
        """Key of an accelerator's layer costs: the inputs and the version of every model behind them."""
        job = self.job
        record = [
            {"costs": COSTS_VERSION, "graphs": GRAPH_VERSION, "estimates": ESTIMATOR_VERSION,
             "schedules": SCHEDULE_VERSION},
            dataclasses.asdict(job.spec),
            job.micro_batch_size,
            job.sequence_length,
            job.tensor_parallel_widths,
            job.training.sequence_parallel,
            accelerator.to_dict(),
            dataclasses.asdict(self.schedule),
        ]
        return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


@dataclass
class Resources:
    """The graphs, candidate space, estimate table and caches of a context, built once by the process
    that holds them (the driver, or a worker: `Resources.build` is the workers' constructor)."""

    context: SearchContext
    graphs: dict[int, ExtractedModel]
    space: CandidateSpace
    table: EstimateTable
    schedules: ScheduleCache
    costs: KeyValueStore
    placements: dict = field(default_factory=dict)

    @classmethod
    def build(cls, context: SearchContext) -> Resources:
        job = context.job
        graphs = {width: extract(job.spec, job.micro_batch_size, job.sequence_length, width,
                                 cache_dir=context.cache_dir)
                  for width in job.tensor_parallel_widths}
        space = candidate_space(context.template, context.area_budget)
        table = EstimateTable(context.template, space.tc_cores, context.cache_dir / "estimates")
        schedules = ScheduleCache(context.cache_dir / "schedules.sqlite")
        costs = KeyValueStore(context.cache_dir / "evaluations.sqlite", "layer_costs")
        return cls(context, graphs, space, table, schedules, costs)

    @property
    def job(self) -> Job:
        return self.context.job

    def memo(self) -> dict:
        """The placement memo, emptied when it grows past PLACEMENT_MEMO_SIZE."""
        if len(self.placements) > PLACEMENT_MEMO_SIZE:
            self.placements.clear()
        return self.placements


def _stored_costs(graphs: dict[int, ExtractedModel], stored: Any) -> LayerCosts:
    """Layer costs as `accelerator_costs` stores them, checked to cover every layer of `graphs` with
    numbers (ValueError if not, or whatever decoding raises): a bad value is a miss."""
    costs = {int(w): {int(layer): LayerCost(**cost) for layer, cost in layers.items()} for w, layers in stored.items()}
    layers = {width: {layer.id for layer in graph.layer_graph.layers} for width, graph in graphs.items()}
    if {width: set(by_layer) for width, by_layer in costs.items()} != layers or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool)
            for by_layer in costs.values() for cost in by_layer.values() for x in dataclasses.astuple(cost)):
        raise ValueError("not the numeric costs of every layer")
    return costs


def accelerator_costs(resources: Resources, accelerator: AcceleratorConfig) -> LayerCosts:
    """The scheduled layer costs of one accelerator, from the cache or computed and stored."""
    context = resources.context
    key = context.costs_key(accelerator)
    stored = resources.costs.get(key, partial(_stored_costs, resources.graphs))
    if stored is not None:
        return stored
    costs = layer_costs(resources.job, resources.graphs, accelerator, resources.table,
                        context.schedule.scheduler(resources.schedules))
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


def evaluate_accelerator(resources: Resources, accelerator: AcceleratorConfig, index: int = -1) -> CandidateOutcome:
    costs = accelerator_costs(resources, accelerator)
    job = resources.job
    return CandidateOutcome(index, accelerator, {
        hbm: evaluate_placements(job, resources.graphs, accelerator, costs, hbm, resources.memo())
        for hbm in job.memory_capacities
    })


def evaluate_candidates(resources: Resources, indices: Sequence[int]) -> list[CandidateOutcome]:
    return [evaluate_accelerator(resources, resources.space[i], i) for i in indices]


def refined_throughputs(resources: Resources, indices: Sequence[int], hbm_bytes: int) -> list[float]:
    """Throughput upper bounds: the placement search run on the layers' schedule lower bounds."""
    bounds = []
    for index in indices:
        accelerator = resources.space[index]
        costs = lower_bound_costs(resources.job, resources.graphs, accelerator, resources.table)
        evaluations = evaluate_placements(resources.job, resources.graphs, accelerator, costs, hbm_bytes,
                                          resources.memo())
        bounds.append(best_of(evaluations).throughput * (1 + ROUNDING_MARGIN))
    return bounds


class Search:
    """Runs the strategies of one context over its candidates, for each HBM size of the job.

    Every candidate evaluated for one HBM size is evaluated for all of them (the schedules are
    shared; only the placement differs), and `on_outcome` sees each outcome once, as it arrives.
    With `n_jobs` > 1, worker processes (each with its own Resources) evaluate batches; `close`
    stops them.
    """

    def __init__(
        self,
        resources: Resources,
        n_jobs: int = 1,
        on_outcome: Callable[[CandidateOutcome], None] = lambda outcome: None,
        candidates: Sequence[int] | None = None,
    ) -> None:
        self.resources, self.n_jobs, self.on_outcome = resources, n_jobs, on_outcome
        self.context = resources.context
        self.space = resources.space
        self.candidates = list(range(len(self.space))) if candidates is None else list(candidates)
        self.outcomes: dict[int, CandidateOutcome] = {}
        self._refined: dict[tuple[int, int], float] = {}
        self._optimistic: np.ndarray | None = None
        self._pool: WorkerPool | None = None

    def _map(self, function: Callable, indices: list[int], *arguments) -> list:
        """function(resources, chunk, *arguments) over chunks of `indices`, on the workers if any."""
        if self.n_jobs <= 1 or len(indices) == 1:
            return function(self.resources, indices, *arguments)
        if self._pool is None:
            self._pool = WorkerPool(Resources.build, self.context, self.n_jobs)
        chunks = [indices[i:: self.n_jobs] for i in range(self.n_jobs) if indices[i:: self.n_jobs]]
        results = self._pool.map(function, chunks, *arguments)
        by_index = {index: value for chunk, values in zip(chunks, results) for index, value in zip(chunk, values)}
        return [by_index[index] for index in indices]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def _evaluate(self, hbm_bytes: int, positions: list[int]) -> list[float]:
        indices = [self.candidates[p] for p in positions]
        missing = [i for i in dict.fromkeys(indices) if i not in self.outcomes]
        if missing:
            for outcome in self._map(evaluate_candidates, missing):
                self.outcomes[outcome.index] = outcome
                self.on_outcome(outcome)
        return [self.outcomes[i].best(hbm_bytes).throughput for i in indices]

    def _refine(self, hbm_bytes: int, positions: list[int]) -> list[float]:
        indices = [self.candidates[p] for p in positions]
        missing = [i for i in indices if (i, hbm_bytes) not in self._refined]
        if missing:
            for index, value in zip(missing, self._map(refined_throughputs, missing, hbm_bytes)):
                self._refined[index, hbm_bytes] = value
        return [self._refined[i, hbm_bytes] for i in indices]

    def optimistic(self) -> np.ndarray:
        """Level-0 throughput bounds of the candidates (the same for every HBM size)."""
        if self._optimistic is None:
            res = self.resources
            self._optimistic = optimistic_throughputs(res.job, res.graphs, self.space, res.table)[self.candidates]
        return self._optimistic

    def run(self, strategy: str, hbm_bytes: int) -> search.SearchResult:
        """The best candidate for one HBM size; result indices are positions in `candidates`."""
        if strategy not in STRATEGIES:
            raise ValueError(f"search: unknown {strategy!r}; valid: {', '.join(STRATEGIES)}")
        evaluate = partial(self._evaluate, hbm_bytes)
        batch_size = BATCH_PER_WORKER * self.n_jobs
        areas = self.space.area[self.candidates]
        if strategy == "exhaustive":
            return search.exhaustive(len(self.candidates), evaluate, batch_size, areas)
        if strategy == "phaze":
            return search.phaze_sweep(areas, evaluate)
        refine = partial(self._refine, hbm_bytes)
        return search.bounded(self.optimistic(), [refine], evaluate, batch_size, areas)
