"""A cache of solved layers keyed by the problem's content, in memory and optionally on disk."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from functools import partial
from pathlib import Path
from typing import Any

from solver.kvstore import KeyValueStore
from solver.schedule import MODEL_VERSION
from solver.schedule.problem import ScheduleProblem
from solver.schedule.result import ScheduleResult
from solver.schedule.solve import solve

#: Significant digits of the latencies and energies a schedule is computed on; the search's
#: bounds (`solver.bounds`) round the candidates' latencies to as many, so they bound the schedules.
SCHEDULE_DIGITS = 6

#: The table of the schedules in their SQLite file.
SCHEDULES_TABLE = "schedules"


def stored_result(ops: int, stored: Any) -> ScheduleResult:
    """A stored result, checked to schedule `ops` operators with numeric times (ValueError if not,
    or whatever `ScheduleResult.from_dict` raises): a bad value is a miss, not a wrong schedule."""
    result = ScheduleResult.from_dict(stored)
    numbers = (result.makespan, result.energy, result.lower_bound, result.gap, *result.start,
               *dataclasses.astuple(result.tc_utilisation), *dataclasses.astuple(result.vc_utilisation))
    if (len(result.start) != ops or len(result.parallel) != ops
            or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in numbers)):
        raise ValueError(f"not a schedule of {ops} operators")
    return result


class ScheduleCache:
    """Solve each distinct layer once per run and, with an SQLite `path`, once across runs.

    Latencies and energies are rounded to SCHEDULE_DIGITS significant digits (as the search's bounds
    round them) and the rounded problem is the one solved, so every problem with the same key gets the
    result of the same problem. The key also holds the core counts, the backend, the time limit and
    the options. SQLite transactions make the file safe for several processes of a multirun.
    """

    def __init__(self, path: str | Path | None = None, store: Any = None):
        self.solved = 0  # solver runs made by this cache object (misses)
        self._memory: dict[str, ScheduleResult] = {}
        # `store`: instead of a file, any object with KeyValueStore's get and put
        self._store = store if path is None else KeyValueStore(path, SCHEDULES_TABLE)

    def key(self, problem: ScheduleProblem, backend: str, time_limit: float, **options) -> str:
        """The content key of a (rounded) problem solved with these settings."""
        content = {
            "ops": [[op.core, op.latency, op.parallel_latency, op.energy, op.parallel_energy] for op in problem.ops],
            "edges": problem.edges,
            "cores": [problem.num_tc, problem.num_vc],
            "solve": [backend, time_limit, sorted(options.items())],
            "version": MODEL_VERSION,
        }
        return hashlib.sha256(json.dumps(content).encode()).hexdigest()

    def problem_solved(self, problem: ScheduleProblem) -> ScheduleProblem:
        """The rounded problem whose schedule `solve` returns (draw or validate that one)."""
        return problem.rounded(SCHEDULE_DIGITS)

    def solve(
        self, problem: ScheduleProblem, backend: str = "cpsat", time_limit: float = 10.0, **options
    ) -> ScheduleResult:
        """`solve.solve` on the rounded problem, unless the same key was solved before."""
        rounded = self.problem_solved(problem)
        key = self.key(rounded, backend, time_limit, **options)
        result = self._memory.get(key)
        if result is None and self._store is not None:
            result = self._store.get(key, partial(stored_result, len(rounded.ops)))
        if result is None:
            result = solve(rounded, backend, time_limit, **options)
            self.solved += 1
            if self._store is not None:
                self._store.put(key, result.to_dict())
        self._memory[key] = result
        return result
