"""What evaluating candidates needs in one process (the driver, a worker process, a Ray actor): the
graphs, the candidate space, the estimate table and the caches, built once and passed explicitly."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from estimator import CandidateSpace, EstimateTable, candidate_space
from graph_extract import ExtractedModel, extract
from phaze_common.files import atomic_write, read_cache_file
from phaze_common.log import warn_once
from solver.bounds import GroupBounds, group_bounds, optimistic_throughputs
from solver.kvstore import KeyValueStore
from solver.question import Axes, Question
from solver.ray_pool import RayPool
from solver.schedule import ScheduleCache
from solver.schedule.cache import SCHEDULES_TABLE
from solver.search.keys import BOUNDS_VERSION, SearchContext
from solver.workers import WorkerPool

#: Where a run's candidates are evaluated: local worker processes, or Ray actors.
EXECUTORS = ("local", "ray")
#: The tables of evaluations.sqlite by Resources field.
EVALUATION_TABLES = {"costs": "layer_costs", "placements": "placements", "placement_bounds": "placement_bounds"}
#: Placements remembered per process (identical layer costs share one placement search).
PLACEMENT_MEMO_SIZE = 4096


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
    _bound_columns: np.ndarray | None = None  # [candidates x costs]: every candidate's bound_column
    _optimistic: np.ndarray | None = None

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

    def group_bounds(self, compute: Callable[[list[int]], list[GroupBounds]] | None = None) -> dict[int, GroupBounds]:
        """The schedule lower bounds of every width's repeat groups on every candidate: computed once
        (by `compute`, widths -> their bounds, default `width_bounds` here), and kept in the cache
        folder (`group_bounds/<SearchContext.bounds_key>.npz`; a worker without files computes them)."""
        if self._bounds is None:
            widths = list(self.graphs)
            self._bounds = self._kept(
                self.context.bounds_key, partial(_read_bounds, widths=tuple(widths), count=len(self.space)),
                lambda: dict(zip(widths, (compute or partial(width_bounds, self))(widths))), _bounds_arrays)
        return self._bounds

    def optimistic(self) -> np.ndarray:
        """Level-0 throughput bounds of every candidate (`solver.bounds.optimistic_throughputs`): computed
        once, and kept in the cache folder beside the group bounds."""
        if self._optimistic is None:
            self._optimistic = self._kept(
                self.context.optimistic_key, partial(_read_optimistic, count=len(self.space)),
                lambda: optimistic_throughputs(self.question, self.axes, self.graphs, self.space, self.group_bounds()),
                lambda throughputs: {"throughputs": throughputs})
        return self._optimistic

    def _kept(self, key: str, read: Callable[[Path], Any], compute: Callable[[], Any],
              arrays: Callable[[Any], dict[str, np.ndarray]]) -> Any:
        """What `read` takes from the cache folder's `group_bounds/<key>.npz`, or `compute()`, then
        stored there as the named `arrays` of it (a worker without files computes it)."""
        path = None if self.recorded else kept_path(self.context, key)
        found = None if path is None else read_cache_file(path, read, (KeyError, zipfile.BadZipFile),
                                                          "bounds cache: cannot read %s (%s); computing them")
        if found is None:
            found = compute()
            if path is not None:
                _write_arrays(path, arrays(found))
        return found

    def bound_column(self, index: int) -> np.ndarray:
        """Candidate `index`'s lower-bound costs of every width (`GroupBounds.columns`), in one vector."""
        if self._bound_columns is None:
            rows = [bounds.columns() for _, bounds in sorted(self.group_bounds().items())]
            self._bound_columns = np.ascontiguousarray(np.concatenate(rows).T)
        return self._bound_columns[index]

    def bound_key(self, index: int, memory: int) -> str:
        """The key of candidate `index`'s refined bound: its lower-bound costs, the placement's context."""
        key = (self.context.placement_key(memory).encode() + b"/bounds%d/" % BOUNDS_VERSION
               + self.bound_column(index).tobytes())
        return hashlib.sha256(key).hexdigest()


def kept_path(context: SearchContext, key: str) -> Path:
    """Where `Resources._kept` keeps the arrays stored under `key`."""
    return context.cache_dir / "group_bounds" / f"{key}.npz"


def bounds_path(context: SearchContext) -> Path:
    """Where `Resources.group_bounds` keeps a context's group bounds."""
    return kept_path(context, context.bounds_key)


def width_bounds(resources: Resources, widths: list[int]) -> list[GroupBounds]:
    """`solver.bounds.group_bounds` of each of these widths' graphs."""
    return [group_bounds(resources.graphs[width], resources.space, resources.table, resources.question.kernels,
                         resources.axes.expert_splits(width)) for width in widths]


def _bounds_arrays(bounds: dict[int, GroupBounds]) -> dict[str, np.ndarray]:
    """The arrays `_read_bounds` reads: each width's three bound arrays and, as JSON, its groups."""
    groups = {str(width): found.groups for width, found in bounds.items()}
    return {"groups": np.array(json.dumps(groups)),
            **{f"{width}/{name}": getattr(found, name) for width, found in bounds.items()
               for name in ("forward", "backward", "attention_core")}}


def _write_arrays(path: Path, arrays: dict[str, np.ndarray]) -> None:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    try:
        atomic_write(path, buffer.getvalue())
    except OSError as error:
        warn_once(("unwritable", path.parent), "bounds cache: cannot write to %s (%s); the bounds are not stored",
                  path.parent, error.strerror or error)


def _read_optimistic(path: Path, count: int) -> np.ndarray:
    with np.load(path, allow_pickle=False) as stored:
        throughputs = stored["throughputs"]
    if throughputs.shape != (count,):
        raise ValueError("bounds of another candidate space")
    return throughputs


def _read_bounds(path: Path, widths: tuple[int, ...], count: int) -> dict[int, GroupBounds]:
    """The bounds of `widths` stored at `path`, each for `count` candidates (ValueError if not)."""
    with np.load(path, allow_pickle=False) as stored:
        groups = json.loads(str(stored["groups"]))
        bounds = {width: GroupBounds(tuple(tuple(group) for group in groups[str(width)]),
                                     *(stored[f"{width}/{name}"] for name in ("forward", "backward", "attention_core")))
                  for width in widths}
    for found in bounds.values():
        arrays = (found.forward, found.backward, found.attention_core)
        if any(array.shape != (len(found.groups), count) for array in arrays):
            raise ValueError("bounds of another candidate space")
    return bounds


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
