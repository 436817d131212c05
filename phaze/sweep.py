"""Sweeps that finish: a job of a `-m` sweep that fails, or finds no placement that fits, is
recorded (its run directory says why) and the sweep goes on; `phaze` lists them at the end and exits 1."""

from __future__ import annotations

import json
import logging
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from phaze import results

log = logging.getLogger(__name__)
#: The exit status of a sweep in which some job failed or was infeasible.
EXIT_CODE = 1


class Infeasible(Exception):
    """A run that finished without a placement that fits; the message names the setting and why."""


def reason(error: BaseException) -> str:
    """One line saying why a job stopped."""
    if isinstance(error, Infeasible):
        return f"infeasible: {error}"
    if isinstance(error, SystemExit):
        return f"exited with status {error.code}"
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


@dataclass(frozen=True)
class Failure:
    directory: Path
    reason: str


@dataclass
class Sweep:
    """The jobs of this process's sweep that did not end with a result."""

    jobs: int = 0
    failures: list[Failure] = field(default_factory=list)

    def record(self, mode: str, model: str, directory: Path, error: BaseException) -> None:
        """Log why the job stopped; a run_solver job that failed gets `"error"` in its best.json (its
        partial results kept) and its traceback in traceback.txt; an infeasible one has its best.json."""
        why = reason(error)
        log.error("sweep job %s: %s", directory, why)
        if mode == "run_solver" and not isinstance(error, (Infeasible, SystemExit)):
            directory.mkdir(parents=True, exist_ok=True)
            results.atomic_write(directory / "traceback.txt", "".join(traceback.format_exception(error)))
            try:
                best = json.loads((directory / results.BEST).read_text())
            except (OSError, ValueError):
                best = {}
            best = best if isinstance(best, dict) else {}
            results.write_best(directory, {"model": model, "per_setting": [], **best, "error": why, "complete": False})
        self.jobs += 1
        self.failures.append(Failure(directory, why))

    def summary(self) -> list[str]:
        """What to tell the user at the end of the sweep, one line each."""
        head = (f"phaze: error: {len(self.failures)} of {self.jobs} sweep jobs ended without a result "
                f"(`phaze report` on the sweep directory lists every job)")
        return [head, *(f"  {failure.directory}: {failure.reason}" for failure in self.failures)]
