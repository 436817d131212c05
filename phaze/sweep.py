"""Sweeps that finish: a job of a `-m` sweep that fails, or finds no placement that fits, is
recorded (its run directory says why) and the sweep goes on; `phaze` lists them at the end and exits 1.

On a launcher that runs the jobs in other processes or machines (Ray, joblib, submitit), each job
writes why it failed to `failure.txt` in its directory, and the driver reads them back from the
sweep directory when the sweep ends (`SweepEnd`, a hydra callback)."""

from __future__ import annotations

import json
import logging
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from phaze import results

log = logging.getLogger(__name__)
#: The exit status of a sweep in which some job failed or was infeasible.
EXIT_CODE = 1
#: A failed job's reason, one line, in its run directory (read by the driver of a remote sweep).
FAILURE = "failure.txt"


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
        directory.mkdir(parents=True, exist_ok=True)
        results.atomic_write(directory / FAILURE, why + "\n")
        if mode == "run_solver" and not isinstance(error, (Infeasible, SystemExit)):
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

    def collect(self, directory: Path) -> None:
        """The outcome of a sweep whose jobs ran elsewhere: every job directory under `directory`
        (hydra's `.hydra` in it) counts, those with a failure.txt failed."""
        if self.jobs:  # the jobs ran in this process and are recorded already
            return
        jobs = sorted((hydra.parent for hydra in directory.rglob(".hydra")), key=job_order)
        self.jobs = len(jobs)
        for job in jobs:
            try:
                why = (job / FAILURE).read_text().strip()
            except FileNotFoundError:
                continue
            except OSError as error:
                why = f"{FAILURE} cannot be read: {error.strerror}"
            self.failures.append(Failure(job, why))


#: The jobs of this process's `-m` sweep that ended without a result (listed at the end, exit 1).
SWEEP = Sweep()


def job_order(directory: Path) -> tuple:
    """Jobs in their numbers' order (2 before 10), other names after, by name."""
    return (0, int(directory.name), "") if directory.name.isdigit() else (1, 0, str(directory))


class SweepEnd(Callback):
    """Hydra callback (phaze/conf/config.yaml): when a sweep ends, the driver reads the outcome of
    jobs that ran in other processes (`Sweep.collect`) for the summary and the exit status."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if (ray := sys.modules.get("ray")) and ray.is_initialized():
            ray.shutdown()  # the jobs' log lines it forwards come before the sweep's summary
        SWEEP.collect(Path(str(config.hydra.sweep.dir)))
