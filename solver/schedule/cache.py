"""A cache of solved layers keyed by the problem's content, in memory and optionally on disk."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from contextlib import closing
from pathlib import Path

from solver.schedule.problem import ScheduleProblem
from solver.schedule.result import ScheduleResult
from solver.schedule.solve import solve


class ScheduleCache:
    """Solve each distinct layer once per run and, with an SQLite `path`, once across runs.

    Latencies and energies are rounded to `digits` significant digits and the rounded problem is the
    one solved, so every problem with the same key gets the result of the same problem. The key
    also holds the core counts, the backend, the time limit and the options. SQLite transactions
    make the file safe for several processes of a multirun.
    """

    def __init__(self, path: str | Path | None = None, digits: int = 6):
        if not (isinstance(digits, int) and 1 <= digits <= 17):
            raise ValueError(f"digits: must be an integer in 1..17, got {digits!r}")
        self.path = None if path is None else Path(path)
        self.digits = digits
        self.solved = 0  # solver runs made by this cache object (misses)
        self._memory: dict[str, ScheduleResult] = {}
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with closing(self._connect()) as db, db:
                db.execute("CREATE TABLE IF NOT EXISTS schedules (key TEXT PRIMARY KEY, result TEXT NOT NULL)")

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=60.0)

    def key(self, problem: ScheduleProblem, backend: str, time_limit: float, **options) -> str:
        """The content key of a (rounded) problem solved with these settings."""
        content = {
            "ops": [[op.core, op.latency, op.parallel_latency, op.energy, op.parallel_energy] for op in problem.ops],
            "edges": problem.edges,
            "cores": [problem.num_tc, problem.num_vc],
            "solve": [backend, time_limit, sorted(options.items())],
        }
        return hashlib.sha256(json.dumps(content).encode()).hexdigest()

    def solve(
        self, problem: ScheduleProblem, backend: str = "cpsat", time_limit: float = 10.0, **options
    ) -> ScheduleResult:
        """`solve.solve` on the rounded problem, unless the same key was solved before."""
        rounded = problem.rounded(self.digits)
        key = self.key(rounded, backend, time_limit, **options)
        result = self._memory.get(key) or self._load(key)
        if result is None:
            result = solve(rounded, backend, time_limit, **options)
            self.solved += 1
            self._store(key, result)
        self._memory[key] = result
        return result

    def _load(self, key: str) -> ScheduleResult | None:
        if self.path is None:
            return None
        with closing(self._connect()) as db:
            row = db.execute("SELECT result FROM schedules WHERE key = ?", (key,)).fetchone()
        return None if row is None else ScheduleResult.from_dict(json.loads(row[0]))

    def _store(self, key: str, result: ScheduleResult) -> None:
        if self.path is None:
            return
        with closing(self._connect()) as db, db:
            db.execute("INSERT OR REPLACE INTO schedules VALUES (?, ?)", (key, json.dumps(result.to_dict())))
