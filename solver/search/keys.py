"""What the co-design search's cached results are keyed by: one question at one micro-batch size
(`SearchContext`), the schedule settings, and the version of every model behind a cached value."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property, partial
from pathlib import Path

from estimator import MODEL_VERSION as ESTIMATOR_VERSION
from graph_extract.serialize import FORMAT_VERSION as GRAPH_VERSION
from phaze_hardware import AcceleratorConfig
from solver.question import Axes, Question
from solver.schedule import MODEL_VERSION as SCHEDULE_VERSION
from solver.schedule import ScheduleCache

#: Bump when what a cached layer cost means changes.
COSTS_VERSION = 6
#: Bump when what a cached placement means changes (the training-step model, the placement search,
#: the fields of an Evaluation).
PLACEMENT_VERSION = 4
#: Bump when what the cached schedule lower bounds of the candidates, or their refined throughput
#: bounds, mean changes.
BOUNDS_VERSION = 2


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

    @cached_property
    def _layers_context(self) -> list:
        """What every layer's costs depend on besides the chip: the model's graphs, the kernels."""
        question, axes = self.question, self.axes
        return [
            dataclasses.asdict(question.model),
            axes.micro_batch_size,
            question.sequence_length,
            axes.tensor_parallel_widths,
            [axes.expert_splits(width) for width in axes.tensor_parallel_widths],
            question.kernels.record(),
        ]

    @cached_property
    def _costs_context(self) -> str:
        """The JSON list of a costs key's record up to the accelerator, without its closing bracket."""
        versions = {"costs": COSTS_VERSION, "graphs": GRAPH_VERSION, "estimates": ESTIMATOR_VERSION,
                    "schedules": SCHEDULE_VERSION}
        return json.dumps([versions, *self._layers_context], sort_keys=True)[:-1]

    def costs_key(self, accelerator: AcceleratorConfig) -> str:
        """Key of an accelerator's layer costs: the inputs and the version of every model behind them
        (the SHA-256 of the JSON list of the versions, the layers' context, the accelerator and the
        schedule settings)."""
        record = (f"{self._costs_context}, {json.dumps(accelerator.to_dict(), sort_keys=True)}, "
                  f"{json.dumps(dataclasses.asdict(self.schedule), sort_keys=True)}]")
        return hashlib.sha256(record.encode()).hexdigest()

    @cached_property
    def bounds_key(self) -> str:
        """Key of the schedule lower bounds of every candidate's layers (`solver.bounds.group_bounds`):
        the layers' context, the template and the area budget (the candidate space)."""
        record = [{"bounds": BOUNDS_VERSION, "graphs": GRAPH_VERSION, "estimates": ESTIMATOR_VERSION},
                  *self._layers_context, self.template.to_dict(), self.area_budget]
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

    @cached_property
    def optimistic_key(self) -> str:
        """Key of every candidate's level-0 throughput bound (`solver.bounds.optimistic_throughputs`):
        the group bounds' key and the placement's context at the largest HBM size."""
        record = self.bounds_key.encode() + self._placement_context + b"/%d" % max(self.axes.memory_capacities)
        return hashlib.sha256(record).hexdigest()

    def placement_key(self, memory: int) -> str:
        """What a placement of given layer costs depends on besides them: the question, the axes (all
        but the HBM sizes), the HBM per device [bytes] and bandwidth, and the version of every model
        behind it."""
        return hashlib.sha256(self._placement_context + b"/%d" % memory).hexdigest()


def evaluation_key(context: SearchContext, accelerator: AcceleratorConfig, memory: int) -> str:
    """The key of an accelerator's evaluations for one HBM size."""
    return hashlib.sha256(f"{context.placement_key(memory)}/{context.costs_key(accelerator)}".encode()).hexdigest()
