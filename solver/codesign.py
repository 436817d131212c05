"""The co-design search for one micro-batch size: candidates evaluated in parallel and cached.

A `SearchContext` is small and picklable: a worker process rebuilds the job (graphs from the graph
cache), the estimate table (from the estimate cache) and the candidate space once, and keeps them.
Per candidate, the layer costs (schedules) are stored in an SQLite file keyed by the context and
the accelerator, so an interrupted or repeated run never schedules a candidate twice.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import joblib
import numpy as np

from estimator import AcceleratorConfig, CandidateSpace, EstimateTable, candidate_space
from graph_extract import ModelSpec, extract
from solver import search
from solver.bounds import ROUNDING_MARGIN, optimistic_throughputs
from solver.evaluate import (
    Evaluation,
    LayerCost,
    LayerCosts,
    TrainingJob,
    best_of,
    evaluate_placements,
    layer_costs,
    lower_bound_costs,
)
from solver.kvstore import KeyValueStore
from solver.schedule import ScheduleCache

STRATEGIES = ("bounded", "exhaustive", "phaze")
#: Candidates handed to each worker at a time (amortises the inter-process round trip).
BATCH_PER_WORKER = 8
#: Bump when what a cached layer cost means changes.
COSTS_VERSION = 1


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
    """What evaluating a candidate of one micro-batch size depends on (besides the HBM size)."""

    spec: ModelSpec
    micro_batch_size: int
    sequence_length: int
    widths: tuple[int, ...]
    global_batch_size: int
    devices: int
    optimizer: str
    sync_cost: str
    template: AcceleratorConfig  # technology of every candidate and the area budget's chip
    area_budget: float | None
    cache_dir: Path
    schedule: ScheduleSettings = ScheduleSettings()

    def costs_key(self, accelerator: AcceleratorConfig) -> str:
        record = [
            COSTS_VERSION,
            dataclasses.asdict(self.spec),
            self.micro_batch_size,
            self.sequence_length,
            self.widths,
            accelerator.to_dict(),
            dataclasses.asdict(self.schedule),
        ]
        return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


@dataclass
class _Resources:
    job: TrainingJob
    space: CandidateSpace
    table: EstimateTable
    schedules: ScheduleCache
    costs: KeyValueStore


_RESOURCES: dict[SearchContext, _Resources] = {}


def resources(context: SearchContext) -> _Resources:
    """The job, space, estimate table and caches of a context, built once per process."""
    if context not in _RESOURCES:
        graphs = {
            width: extract(context.spec, context.micro_batch_size, context.sequence_length, width,
                           cache_dir=context.cache_dir)
            for width in context.widths
        }
        job = TrainingJob(graphs, context.global_batch_size, context.devices, context.optimizer, context.sync_cost)
        space = candidate_space(context.template, context.area_budget)
        table = EstimateTable(context.template, space.tc_cores, context.cache_dir / "estimates")
        schedules = ScheduleCache(context.cache_dir / "schedules.sqlite")
        costs = KeyValueStore(context.cache_dir / "evaluations.sqlite", "layer_costs")
        _RESOURCES[context] = _Resources(job, space, table, schedules, costs)
    return _RESOURCES[context]


def accelerator_costs(context: SearchContext, accelerator: AcceleratorConfig) -> LayerCosts:
    """The scheduled layer costs of one accelerator, from the cache or computed and stored."""
    res = resources(context)
    key = context.costs_key(accelerator)
    stored = res.costs.get(key)
    if stored is not None:
        return {int(w): {int(layer): LayerCost(**cost) for layer, cost in layers.items()} for w, layers in stored.items()}
    costs = layer_costs(res.job, accelerator, res.table, context.schedule.scheduler(res.schedules))
    res.costs.put(key, {w: {layer: dataclasses.asdict(c) for layer, c in layers.items()} for w, layers in costs.items()})
    return costs


@dataclass(frozen=True)
class CandidateOutcome:
    """Evaluations of one accelerator: per HBM size [bytes], recomputation off and on."""

    index: int  # position in the candidate space, -1 for an accelerator outside it
    accelerator: AcceleratorConfig
    evaluations: dict[int, tuple[Evaluation, Evaluation]]

    def best(self, hbm_bytes: int) -> Evaluation:
        return best_of(self.evaluations[hbm_bytes])


def evaluate_accelerator(
    context: SearchContext, accelerator: AcceleratorConfig, hbm_sizes: Sequence[int], index: int = -1
) -> CandidateOutcome:
    job = resources(context).job
    costs = accelerator_costs(context, accelerator)
    return CandidateOutcome(
        index, accelerator, {hbm: evaluate_placements(job, accelerator, costs, hbm) for hbm in hbm_sizes}
    )


def evaluate_candidates(context: SearchContext, indices: Sequence[int], hbm_sizes: Sequence[int]) -> list[CandidateOutcome]:
    space = resources(context).space
    return [evaluate_accelerator(context, space[i], hbm_sizes, i) for i in indices]


def refined_throughputs(context: SearchContext, indices: Sequence[int], hbm_bytes: int) -> list[float]:
    """Throughput upper bounds: the placement DP run on the layers' schedule lower bounds."""
    res = resources(context)
    bounds = []
    for index in indices:
        accelerator = res.space[index]
        costs = lower_bound_costs(res.job, accelerator, res.table)
        throughput = best_of(evaluate_placements(res.job, accelerator, costs, hbm_bytes)).throughput
        bounds.append(throughput * (1 + ROUNDING_MARGIN))
    return bounds


class Search:
    """Runs the strategies of one context over its candidates, for several HBM sizes.

    Every candidate evaluated for one HBM size is evaluated for all of them (the schedules are
    shared; only the placement differs), and `on_outcome` sees each outcome once, as it arrives.
    """

    def __init__(
        self,
        context: SearchContext,
        hbm_sizes: Sequence[int],
        n_jobs: int = 1,
        on_outcome: Callable[[CandidateOutcome], None] = lambda outcome: None,
        candidates: Sequence[int] | None = None,
    ) -> None:
        self.context, self.hbm_sizes, self.n_jobs, self.on_outcome = context, tuple(hbm_sizes), n_jobs, on_outcome
        self.space = resources(context).space
        self.candidates = list(range(len(self.space))) if candidates is None else list(candidates)
        self.outcomes: dict[int, CandidateOutcome] = {}
        self._refined: dict[tuple[int, int], float] = {}
        self._optimistic: np.ndarray | None = None
        self._pool: joblib.Parallel | None = None

    def _map(self, function: Callable, indices: list[int], *arguments) -> list:
        """function(context, chunk, *arguments) over chunks of `indices`, on the worker pool if any."""
        if self._pool is None or len(indices) == 1:
            return function(self.context, indices, *arguments)
        chunks = [indices[i:: self.n_jobs] for i in range(self.n_jobs) if indices[i:: self.n_jobs]]
        results = self._pool(joblib.delayed(function)(self.context, chunk, *arguments) for chunk in chunks)
        by_index = {index: value for chunk, values in zip(chunks, results) for index, value in zip(chunk, values)}
        return [by_index[index] for index in indices]

    def _evaluate(self, hbm_bytes: int, positions: list[int]) -> list[float]:
        indices = [self.candidates[p] for p in positions]
        missing = [i for i in dict.fromkeys(indices) if i not in self.outcomes]
        if missing:
            for outcome in self._map(evaluate_candidates, missing, self.hbm_sizes):
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
            res = resources(self.context)
            self._optimistic = optimistic_throughputs(res.job, self.space, res.table)[self.candidates]
        return self._optimistic

    def run(self, strategy: str, hbm_bytes: int) -> search.SearchResult:
        """The best candidate for one HBM size; result indices are positions in `candidates`."""
        if strategy not in STRATEGIES:
            raise ValueError(f"search: unknown {strategy!r}; valid: {', '.join(STRATEGIES)}")
        evaluate = partial(self._evaluate, hbm_bytes)
        batch_size = BATCH_PER_WORKER * self.n_jobs
        pool = joblib.Parallel(n_jobs=self.n_jobs, max_nbytes=None) if self.n_jobs > 1 else nullcontext()
        areas = self.space.area[self.candidates]
        with pool as self._pool:
            try:
                if strategy == "exhaustive":
                    return search.exhaustive(len(self.candidates), evaluate, batch_size, areas)
                if strategy == "phaze":
                    return search.phaze_sweep(areas, evaluate)
                refine = partial(self._refine, hbm_bytes)
                return search.bounded(self.optimistic(), [refine], evaluate, batch_size, areas)
            finally:
                self._pool = None
