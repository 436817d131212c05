"""The co-design search of one question at one micro-batch size: the strategies run over the
candidates, each candidate evaluated once for every HBM size, in parallel and through the caches."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np

from phaze_hardware import AcceleratorConfig
from solver import strategies
from solver.bounds import GroupBounds, optimistic_throughputs
from solver.evaluate import Evaluation
from solver.ray_pool import RayPool
from solver.search.outcomes import (CandidateOutcome, RefinedBound, refined_bound, evaluate_accelerator, evaluate_candidates,
                                    refined_throughputs)
from solver.search.keys import SearchContext
from solver.search.resources import Resources, width_bounds
from solver.workers import WorkerPool

STRATEGIES = ("bounded", "exhaustive", "phaze")
#: Candidates a strategy takes per step, per worker (the workers take them one at a time).
BATCH_PER_WORKER = 8


@dataclass(frozen=True)
class Baseline:
    """A chip a search's results are measured against: `accelerator` evaluated in `context` (its own
    technology, HBM or system), `index` its position in that context's candidate space (-1 outside)."""

    context: SearchContext
    accelerator: AcceleratorConfig
    index: int = -1


def _own_resources(baseline: Baseline, resources: Resources | None) -> Resources:
    """`resources` if built for the baseline's context, else the baseline's own."""
    return resources if resources is not None and resources.context == baseline.context else Resources.build(
        baseline.context)


def evaluate_baseline(baseline: Baseline, resources: Resources | None = None) -> CandidateOutcome:
    """A baseline's evaluations, through the caches (`resources`: used if of the baseline's context)."""
    return evaluate_accelerator(_own_resources(baseline, resources), baseline.accelerator, baseline.index)


def prepare_item(item: Baseline | tuple[SearchContext, int]) -> GroupBounds | None:
    """A baseline's evaluations computed into the caches (None), or the group bounds of one width of
    a context (a worker's stateless call, `WorkerPool.call`: the state it holds for another context
    is kept)."""
    if isinstance(item, Baseline):
        evaluate_baseline(item)
        return None
    context, width = item
    return width_bounds(Resources.build(context), [width])[0]


def evaluate_or_refine(resources: Resources, items: list[tuple[str, int]], hbm_bytes: int,
                       best: float) -> list[CandidateOutcome | RefinedBound]:
    """Per (kind, candidate): its evaluation ("evaluate"), or its refined bound for one HBM size cut at
    `best` ("refine"): an evaluation's workers refine what the search comes to next beside it."""
    evaluated = iter(evaluate_candidates(resources, [index for kind, index in items if kind == "evaluate"]))
    return [next(evaluated) if kind == "evaluate" else refined_throughputs(resources, [index], hbm_bytes, best)[0]
            for kind, index in items]


def baseline_missing(baseline: Baseline, resources: Resources | None = None) -> bool:
    """Whether the caches lack some of a baseline's evaluations (`resources`: built already, used if
    of the baseline's context)."""
    return evaluate_accelerator(_own_resources(baseline, resources), baseline.accelerator, baseline.index,
                                compute=False) is None


def _prepared(resources: Resources, tasks: list[int], work: list) -> list:
    """Items of `work` a search needs before or beside its candidates: a width (int: its group
    bounds) or a `Baseline` (its evaluations, stored in the caches)."""
    done = []
    for task in tasks:
        item = work[task]
        if isinstance(item, int):
            done.extend(width_bounds(resources, [item]))
            continue
        done.append(evaluate_baseline(item, resources))
    return done


class RefinedColumns:
    """The lower-bound columns of the candidates refined so far (rows of a matrix that doubles as it
    fills) and their refined bounds: which of them dominate a candidate is one comparison."""

    def __init__(self) -> None:
        self._columns = np.empty((0, 0))
        self._values = np.empty(0)
        self._count = 0

    def add(self, column: np.ndarray, value: float) -> None:
        if self._count == len(self._columns):
            grown = np.empty((max(16, 2 * self._count), len(column)))
            grown[: self._count] = self._columns[: self._count] if self._count else 0.0
            self._columns, self._values = grown, np.resize(self._values, len(grown))
        self._columns[self._count], self._values[self._count] = column, value
        self._count += 1

    def least_dominating(self, columns: np.ndarray) -> np.ndarray:
        """Per row of `columns`, the least bound of a refined candidate whose columns are nowhere above
        it (math.inf without one)."""
        if not self._count:
            return np.full(len(columns), math.inf)
        dominating = np.all(self._columns[None, : self._count] <= columns[:, None], axis=2)
        return np.where(dominating, self._values[None, : self._count], math.inf).min(axis=1)


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
        self._refined_columns: dict[int, RefinedColumns] = {}  # per HBM size
        self._optimistic = optimistic  # level-0 bounds of the candidates (in their order), once computed
        self._order: np.ndarray | None = None  # positions by descending level-0 bound
        self._cursor: dict[int, int] = {}  # per HBM size: where `_speculative` goes on in `_order`

    @property
    def workers(self) -> int:
        return self.pool.processes if self.pool is not None else 1

    def _map(self, function: Callable, indices: list[int], *arguments) -> list:
        """function(resources, [index], *arguments) for each of `indices`, on the workers if any: one
        item a call, so a worker takes the next as soon as it is free (items vary in time tenfold)."""
        if self.pool is None or len(indices) == 1:
            return function(self.resources, indices, *arguments)
        results = self.pool.map(self.context, function, [[index] for index in indices], *arguments)
        return [value for (value,) in results]

    def _evaluate(self, hbm_bytes: int, positions: list[int]) -> list[float]:
        indices = [self.candidates[p] for p in positions]
        missing = [i for i in dict.fromkeys(indices) if i not in self.outcomes]
        stored = [evaluate_accelerator(self.resources, self.space[i], i, compute=False) for i in missing]
        to_compute = [i for i, o in zip(missing, stored) if o is None]
        best = max(self._best.get(hbm_bytes, 0.0), self.floor)
        extra = self._speculative(hbm_bytes, best, (-len(to_compute)) % self.workers, {}) if to_compute else {}
        work = [("evaluate", index) for index in to_compute] + [("refine", index) for index in extra.values()]
        done = self._map(evaluate_or_refine, work, hbm_bytes, best) if work else []
        for key, bound in zip(extra, done[len(to_compute):]):
            self._keep(key, bound)
        computed = iter(done[: len(to_compute)])
        for outcome in stored:
            outcome = outcome or next(computed)
            self.outcomes[outcome.index] = outcome
            for hbm in outcome.evaluations:
                self._best[hbm] = max(self._best.get(hbm, 0.0), outcome.best(hbm).throughput)
            self.on_outcome(outcome)
        if self.objective is not None:
            return [self.objective.value(i, self.outcomes[i].best(hbm_bytes)) for i in indices]
        return [self.outcomes[i].best(hbm_bytes).throughput for i in indices]

    def _keep(self, key: str, bound: RefinedBound) -> None:
        """A refined bound computed: in memory and in the cache."""
        self.resources.placement_bounds.put(key, dataclasses.asdict(bound))
        self._bounds[key] = bound

    def _usable(self, bound: RefinedBound | None, best: float) -> bool:
        """A refined bound settles a candidate when exact, or when cut and below the best found (as
        the strategies compare throughputs)."""
        return bound is not None and (bound.exact or strategies.resolved(bound.value) < strategies.resolved(best))

    def _dominated(self, hbm_bytes: int, indices: list[int]) -> dict[int, float]:
        """Bounds from the refined ones: a candidate whose lower-bound costs are nowhere below a
        refined candidate's has no higher refined bound (a step's time never falls as a layer's cost
        grows), so the least such bound bounds it too (math.inf without one)."""
        refined = self._refined_columns.get(hbm_bytes)
        if refined is None or not indices:
            return dict.fromkeys(indices, math.inf)
        columns = np.array([self.resources.bound_column(index) for index in indices])
        return dict(zip(indices, refined.least_dominating(columns).tolist()))

    def _refine(self, hbm_bytes: int, positions: list[int]) -> list[float | strategies.Provisional]:
        """Refined bounds: a candidate evaluated already (for another HBM size: every size is evaluated
        at once) has its exact throughput; else from memory or the cache when they settle the
        candidate; else, when a refined candidate dominates it with a lower bound than its last, that
        bound, provisionally; else the placement search on its lower-bound costs (once per distinct
        costs)."""
        store = self.resources.placement_bounds
        # the cut is in throughput: with another objective every refined bound is exact
        best = 0.0 if self.objective is not None else max(self._best.get(hbm_bytes, 0.0), self.floor)
        optimistic = self.optimistic()
        provisional: dict[int, strategies.Provisional] = {}
        position_of = {self.candidates[position]: position for position in positions}
        exact = {index: self.outcomes[index].best(hbm_bytes).throughput
                 for index in position_of if index in self.outcomes}
        keys = {index: self.resources.bound_key(index, hbm_bytes) for index in position_of
                if (index, hbm_bytes) not in self._refined and index not in exact}
        stored_bounds = store.get_many([key for key in keys.values() if not self._usable(self._bounds.get(key), best)],
                                       refined_bound)
        todo: dict[str, int] = {}  # bound key -> the candidate it is computed on
        unsettled = []
        for index, key in keys.items():
            if self._usable(self._bounds.get(key), best):
                continue
            stored = stored_bounds.get(key)
            if self._usable(stored, best):
                self._bounds[key] = stored
                continue
            unsettled.append(index)
        dominated_by = self._dominated(hbm_bytes, unsettled)
        for index in unsettled:
            key, dominated = keys[index], dominated_by[index]
            last = self._provisional.get((index, hbm_bytes), float(optimistic[position_of[index]]))
            if dominated < last:
                provisional[index] = strategies.Provisional(dominated)
                self._provisional[index, hbm_bytes] = dominated
                del keys[index]
            else:
                todo.setdefault(key, index)
        if todo:
            todo.update(self._speculative(hbm_bytes, best, (-len(todo)) % self.workers, todo))
            for key, bound in zip(todo, self._map(refined_throughputs, list(todo.values()), hbm_bytes, best)):
                self._keep(key, bound)
        refined = self._refined_columns.setdefault(hbm_bytes, RefinedColumns())
        for index, key in keys.items():
            self._refined[index, hbm_bytes] = self._bounds[key].value
            refined.add(self.resources.bound_column(index), self._bounds[key].value)
        return [exact[i] if i in exact else provisional.get(i) or self._refined[i, hbm_bytes]
                for i in (self.candidates[p] for p in positions)]

    def _speculative(self, hbm_bytes: int, best: float, count: int, taken: dict[str, int]) -> dict[str, int]:
        """Up to `count` more candidates to refine beside `taken` (bound key -> candidate), so that no
        worker waits: the unsettled ones with the highest level-0 bounds that can still reach `best`
        (the order in which the strategy would come to them, unless a better chip is found first).
        A refined bound stays valid as the best rises, so one computed early is never wrong (at worst
        not needed)."""
        if self.pool is None or not count or self.objective is not None:
            return {}
        optimistic, store = self.optimistic(), self.resources.placement_bounds
        if self._order is None:
            self._order = np.argsort(-optimistic, kind="stable")
        cursor, found = self._cursor.get(hbm_bytes, 0), {}
        while cursor < len(self._order) and len(found) < count:
            position = int(self._order[cursor])
            if best > 0 and strategies.resolved(float(optimistic[position])) < strategies.resolved(best):
                break  # neither it nor any after it can reach the best
            cursor += 1
            index = self.candidates[position]
            if (index, hbm_bytes) in self._refined or index in self.outcomes:
                continue
            key = self.resources.bound_key(index, hbm_bytes)
            if key in taken or key in found or self._usable(self._bounds.get(key), best):
                continue
            if self._usable(store.get_many([key], refined_bound).get(key), best):
                continue
            if best > 0 and strategies.resolved(self._dominated(hbm_bytes, [index])[index]) < strategies.resolved(best):
                continue  # a refined candidate that it dominates settles it
            found[key] = index
        self._cursor[hbm_bytes] = cursor
        return found

    def prepare(self, baselines: Sequence[Baseline] = ()) -> None:
        """Compute on the workers, side by side, what the search needs first (every width's group
        bounds, unless cached) and the evaluations of `baselines` (into the caches, where the driver
        reads them when it asks)."""
        if self.pool is None:
            return
        baselines, computed = self._shareable(baselines), []

        def bounds_with_baselines(widths: list[int]) -> list:
            computed.append(widths)
            work = [*widths, *baselines]
            return self._map(_prepared, list(range(len(work))), work)[: len(widths)]

        self.resources.group_bounds(bounds_with_baselines)
        if not computed and baselines:  # the bounds were cached: the baselines alone
            self._map(_prepared, list(range(len(baselines))), baselines)

    def _shareable(self, baselines: Sequence[Baseline]) -> list[Baseline]:
        """The baselines the workers should evaluate: those not in the caches yet and, Ray's workers
        having no cache folder, of this search's context only (the driver stores what they
        computed; it computes the others itself)."""
        return [baseline for baseline in baselines if baseline_missing(baseline, self.resources)
                and (baseline.context == self.context or not isinstance(self.pool, RayPool))]

    def optimistic(self) -> np.ndarray:
        """Level-0 throughput bounds of the candidates (the same for every HBM size)."""
        if self._optimistic is None:
            res = self.resources
            if self.candidates == list(range(len(self.space))):
                self._optimistic = res.optimistic()
            else:
                self._optimistic = optimistic_throughputs(res.question, res.axes, res.graphs, self.space,
                                                          res.group_bounds(), np.asarray(self.candidates))
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
