"""The exact 1F1B placement (v = 1) at one width under the training-step model.

    time = (m_d + p − 1) · max_i ℓ_i + max_i tail_i

m_d = B/d micro-batches per replica (the layouts of `solver.layout.layouts`); ℓ_i is stage i's load with its
transfers on the tier of the pipeline's slowest link; tail_i its exposed data-parallel sync and
optimizer step, which grows with the stage's parameters (`DataParallel.tail`). The max-plus-max
objective is made exact with caps: for a cap c on the stages' key (their parameters, or their tail
itself when the sync overlaps the backward pass), F(c) is the best time over placements whose
stages all have key ≤ c, charged the tail of c. F(c) never undercharges its placement and equals
the optimum at c = the optimum's largest key, so min_c F(c) is the optimum.

Scenarios: what decides a stage's feasibility and load is the degree d (memory: optimizer shard and
m_d micro-batches in flight at most) and the tier between stages (which depends on p); one DP table
column per distinct (feasibility, load, key) and cap. Caps are searched by branch and bound: with
F(c_u) known for a cap c_u, every smaller cap c has F(c) ≥ (m + p − 1)·Q_u + tail(c), where Q_u is
the DP value at c_u, so caps whose bound reaches the best time found are never filled.
Ties: smallest d, then fewest stages, then smallest cap; the back-trace takes the shortest next
stage (the original's rule).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from solver.layout import FitRules, Layout, layouts
from solver.training_step.model import TrainingStep
from solver.training_step.records import Placement, StageTerms, StepResult

from .candidates import DeviceModel, StateSpace
from .dp import INFTY, StageTable, backtrace, fill_tables

#: Caps filled per class in one pass of the branch and bound.
CAPS_PER_PASS = 8


def deepest_position(step: TrainingStep, terms: StageTerms, degree: int, limit: int) -> np.ndarray:
    """Per stage of `step`, the largest q ≤ `limit` such that the stage fits in memory as the q-th
    from the end of a 1F1B pipeline (holding min(q, m) micro-batches); 0 if it never fits."""
    if step.sharding_problem(degree) is not None:
        return np.zeros(len(terms.parameters), dtype=np.int64)
    micro_batches = step.micro_batches // degree
    capacity = step.device.memory_capacity
    fits_all = step.memory_bytes(terms, min(limit, micro_batches), degree) <= capacity
    room = capacity - step.memory_bytes(terms, 0, degree)
    held = terms.held_activations
    with np.errstate(divide="ignore", invalid="ignore"):
        guess = np.floor(np.where(held > 0, room / np.where(held > 0, held, 1.0), 0.0))
    guess = np.clip(guess, 0, limit).astype(np.int64)
    # the closed form may be off by one in floating point: settle it with the model itself
    guess = np.where(step.memory_bytes(terms, guess, degree) <= capacity, guess, guess - 1)
    above = np.minimum(guess + 1, limit)
    guess = np.where((above > guess) & (step.memory_bytes(terms, above, degree) <= capacity), above, guess)
    return np.where(fits_all, limit, np.maximum(guess, 0))


@dataclass(frozen=True)
class Scenario:
    """A data-parallel degree with the depths whose slowest stage boundary is on `tier`."""

    degree: int
    tier: int
    fewest: int
    most: int
    column: int  # its class


@dataclass
class _Best:
    time: float = math.inf
    order: tuple = ()
    table: np.ndarray | None = None
    stages: StageTable | None = None
    x: int = 0
    depth: int = 0
    degree: int = 0


def plain_layouts(step: TrainingStep) -> dict[int, int]:
    """The most stages of a plain pipeline (v = 1) per data-parallel width d of the step's shard
    (every shallower pipeline fits too)."""
    return dict(_plain_layouts(step.fit_rules(), step.shard))


@lru_cache(maxsize=256)
def _plain_layouts(rules: FitRules, shard: Layout) -> tuple[tuple[int, int], ...]:
    return tuple((layout.data_parallel_width, layout.pipeline_parallel_width) for layout in layouts(rules, shard, (1,)))


def place_capped(step: TrainingStep, space: StateSpace, terms: StageTerms | None = None,
                 upper_bound: float = math.inf) -> tuple[Placement, StepResult] | None:
    """The fastest feasible 1F1B placement at this width and recomputation mode, or None (also
    when none beats `upper_bound`). `terms` are the stage terms of `space`'s candidate stages."""
    terms = step.stage_terms(space.members) if terms is None else terms
    depth_cap = min(int(space.sizes[-1]), step.cluster.num_devices // step.stage_devices)
    scenarios, columns = [], {}
    loads, feasible, keys = [], [], []
    by_parameters = step.data_parallel.tail_keys_are_parameters()
    for degree, most_stages in plain_layouts(step).items():
        if step.time_floor(degree, np.arange(1, most_stages + 1)).min() >= upper_bound:
            continue  # no pipeline of this width can beat the bound
        fits = deepest_position(step, terms, degree, depth_cap)
        if not fits.any():
            continue
        key = terms.parameters if by_parameters else sum(step.data_parallel.tail(terms, degree))
        sharded = step.data_parallel.sharded_traffic(terms, degree)[0]  # the same on every tier
        for tier, fewest, most in step.pipeline_tier_depths(degree, most_stages):
            load = step.load(terms, tier) + sharded
            signature = (fits.tobytes(), load.tobytes(), key.tobytes())
            if signature not in columns:
                columns[signature] = len(loads)
                loads.append(load)
                feasible.append(fits)
                keys.append(key)
            scenarios.append(Scenario(degree, tier, fewest, most, columns[signature]))
    if not scenarios:
        return None
    search = _CapSearch(step, space, scenarios, np.array(loads).T, np.array(feasible).T, np.array(keys).T,
                        depth_cap, by_parameters, upper_bound)
    best = search.run()
    if best.table is None:
        return None
    pairs = backtrace(space, best.table, best.stages, best.x, DeviceModel(step.stage_devices, 1), len(space.sizes) - 1,
                      best.depth, best.depth * step.stage_devices)
    chunks = tuple(tuple(space.stage_positions(pair)) for pair in pairs)
    placement = Placement(step.layout(best.depth, best.degree), chunks, step.recompute)
    result = step.price(placement)
    if not result.feasible or result.time_per_batch > best.time * (1 + 1e-12):
        raise RuntimeError(f"capped placement DP: the rebuilt placement scores {result.time_per_batch} "
                           f"({result.infeasible_reason}), the DP {best.time} (internal error)")
    return placement, result


class _CapSearch:
    """Branch and bound over the caps of every class (module docstring)."""

    def __init__(self, step, space, scenarios, loads, feasible, keys, depth_cap, by_parameters, upper_bound):
        self.step, self.space, self.scenarios = step, space, scenarios
        self.loads, self.feasible, self.keys, self.depth_cap = loads, feasible, keys, depth_cap
        self.by_parameters, self.upper_bound = by_parameters, upper_bound
        classes = loads.shape[1]
        self.caps = [np.unique(keys[feasible[:, c] > 0, c]) for c in range(classes)]
        self.depths = [max(s.most for s in scenarios if s.column == c) for c in range(classes)]
        self.evaluated: list[dict[int, np.ndarray]] = [{} for _ in range(classes)]  # cap index -> Q[s]
        self.best = _Best()
        self._charges: dict[tuple[int, int], np.ndarray] = {}

    def charges(self, c: int, scenario: Scenario) -> np.ndarray:
        """The tail charged to a placement whose stages' keys are at most each cap of class c."""
        if not self.by_parameters:
            return self.caps[c]
        found = self._charges.get((c, scenario.degree))
        if found is None:
            found = self._charges[c, scenario.degree] = self.step.data_parallel.tail_time(self.caps[c],
                                                                                          scenario.degree)
        return found

    def pipelines(self, scenario: Scenario, values: np.ndarray) -> np.ndarray:
        """(m + p − 1)·Q over the scenario's depths p for DP values `values[p]` (∞ where no split)."""
        depths = np.arange(scenario.fewest, scenario.most + 1)
        micro_batches = self.step.micro_batches // scenario.degree
        pipeline = self.step.pipeline_time(micro_batches, depths, 1, values[depths])
        return np.where(values[depths] < INFTY / 2, pipeline, np.inf)

    def bound(self) -> float:
        return min(self.best.time, self.upper_bound)

    def remaining(self, c: int) -> list[int]:
        """Unevaluated cap indices of class c whose lower bound is below the best time."""
        caps, done = self.caps[c], self.evaluated[c]
        ends = sorted(done)
        alive = list(range(ends[-1] + 1, len(caps))) if ends else list(range(len(caps)))
        for low, high in zip([-1, *ends[:-1]], ends):
            between = np.arange(low + 1, high)
            if not len(between):
                continue
            floor = np.full(len(between), np.inf)
            for scenario in (s for s in self.scenarios if s.column == c):
                fastest = self.pipelines(scenario, done[high]).min(initial=np.inf)
                floor = np.minimum(floor, fastest + self.charges(c, scenario)[between])
            alive.extend(between[floor < self.bound()].tolist())
        return sorted(alive)

    def run(self) -> _Best:
        """First every class without a cap (its largest key), then the caps that can still win,
        `CAPS_PER_PASS` at a time per class, spread over the range that is left."""
        per_class = 1
        while True:
            batch = []
            for c in range(len(self.caps)):
                alive = self.remaining(c)
                if alive:
                    picks = np.linspace(0, len(alive) - 1, min(per_class, len(alive))).round().astype(int)
                    batch.extend((c, alive[i]) for i in sorted({len(alive) - 1, *picks.tolist()}))
            if not batch:
                return self.best
            for depth in sorted({self.depths[c] for c, _ in batch}):  # shallow classes fill a shallow table
                self.fill([item for item in batch if self.depths[item[0]] == depth], depth)
            per_class = CAPS_PER_PASS

    def fill(self, batch: list[tuple[int, int]], depth_cap: int) -> None:
        """Fill the DP for these (class, cap index) columns and record what they give."""
        columns = np.array([c for c, _ in batch])
        caps = np.array([self.caps[c][i] for c, i in batch])
        allowed = self.keys[:, columns] <= caps[None, :]
        loads = self.loads[:, columns]
        stages = StageTable(np.full(len(loads), self.step.stage_devices), loads, loads,
                            np.where(allowed, np.minimum(self.feasible[:, columns], depth_cap), 0))
        table = fill_tables(self.space, stages, depth_cap, DeviceModel(self.step.stage_devices, 1), include_full=True)
        values = np.full((self.depth_cap + 1, len(batch)), INFTY)
        values[: depth_cap + 1] = table[-1, :, 0, :]  # [s, x]
        for x, (c, index) in enumerate(batch):
            self.evaluated[c][index] = values[:, x]
            cap = self.caps[c][index]
            for scenario in (s for s in self.scenarios if s.column == c):
                times = self.pipelines(scenario, values[:, x]) + float(self.charges(c, scenario)[index])
                if not times.size or not times.min() < np.inf:
                    continue
                s = int(np.argmin(times))
                order = (float(times[s]), scenario.degree, scenario.fewest + s, float(cap))
                if order[0] < self.upper_bound and (self.best.table is None or order < self.best.order):
                    self.best = _Best(order[0], order, table[..., x], stages, x, scenario.fewest + s, scenario.degree)
