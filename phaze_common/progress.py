"""The progress of long work, in any layer: one `Progress` per phase (graph extraction, GEMM
estimates, layer schedules, candidates, placement).

When stderr is a terminal a phase is a transient rich bar (and a log line where it starts and
ends); otherwise, in a batch job, it is log lines only: one at the start, one at least every
`interval` seconds while it runs (done/total, rate, ETA) and one at the end. Lines go through
`logging` (phaze's command sends them to stderr and to phaze.log in the run directory). A phase run
inside another one, or in a worker process (the layer schedules of one candidate), is a step of the
outer one: it logs only once it has run for an interval, so short steps add no lines.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType

import rich.progress
from rich.console import Console

from phaze_common.log import warn_once

log = logging.getLogger(__name__)

#: Seconds between two progress lines of a phase (overridden by INTERVAL_VARIABLE).
INTERVAL = 30.0
INTERVAL_VARIABLE = "PHAZE_PROGRESS_INTERVAL"

#: The phases running in this process, outermost first.
_running: list[Progress] = []
#: The live display of this process's phases on a terminal, while one runs.
_display: rich.progress.Progress | None = None
#: Whether this process is a worker of a driver (`mark_worker`).
_worker = False


def progress_interval() -> float:
    """The interval [s] of progress lines: INTERVAL_VARIABLE if it holds a number >= 0, else INTERVAL."""
    text = os.environ.get(INTERVAL_VARIABLE)
    if text is None:
        return INTERVAL
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value < math.inf:
        warn_once(("interval", text), "%s: %r is not a number of seconds >= 0; using %g", INTERVAL_VARIABLE,
                  text, INTERVAL)
        return INTERVAL
    return value


def mark_worker() -> None:
    """Called by a worker process at its start: its phases are steps of the driver's, not shown on
    a terminal (the driver shows its own)."""
    global _worker
    _worker = True


def duration(seconds: float) -> str:
    """A duration as 42s, 10m06s or 3h05m."""
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


class Progress:
    """The progress of one phase, counted with `advance`; used as a context manager.

    `total` None: not known in advance (the lines say so and give no ETA). `interval` [s]: between
    two lines, default `progress_interval()`. `clock` gives the time [s]; `heartbeat` logs a line
    when an interval passes without an advance (a thread; False for a fake clock). `display`: a
    rich bar instead of lines, default when stderr is a terminal (not in a worker). `step`: a step
    of an enclosing phase, logged only once it has run for an interval; default when another phase
    runs in this process, or in a worker process.
    """

    def __init__(self, name: str, total: int | None, unit: str, logger: logging.Logger = log,
                 interval: float | None = None, clock: Callable[[], float] = time.monotonic,
                 heartbeat: bool = True, display: bool | None = None, step: bool | None = None) -> None:
        self.name, self.total, self.unit, self.logger = name, total, unit, logger
        self.interval = progress_interval() if interval is None else interval
        self.clock, self.heartbeat = clock, heartbeat
        self.display = sys.stderr.isatty() and not _worker if display is None else display
        self.step = bool(_running) or _worker if step is None else step
        self.done = 0
        self.logged = False  # whether a line of this phase was logged
        self._lock = threading.Lock()
        self._started = self._last = 0.0
        self._task: rich.progress.TaskID | None = None
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def _rate(self, now: float) -> tuple[float | None, str]:
        """Done per second since the start (None before the first), and its text ', 3.1 <unit>/s'."""
        elapsed = now - self._started
        if not (self.done and elapsed > 0):
            return None, ""
        rate = self.done / elapsed
        return rate, f", {rate:,.0f} {self.unit}/s" if rate >= 100 else f", {rate:.3g} {self.unit}/s"

    def status(self, now: float) -> str:
        """'<name>: 120/2,000 <unit> (6.0%), 3.1 <unit>/s, ETA 10m06s' at time `now`."""
        rate, speed = self._rate(now)
        if self.total is None:
            return f"{self.name}: {self.done:,} {self.unit}{speed} (total unknown)"
        share = f" ({self.done / self.total:.1%})" if self.total else ""
        eta = f", ETA {duration(max(self.total - self.done, 0) / rate)}" if rate else ""
        return f"{self.name}: {self.done:,}/{self.total:,} {self.unit}{share}{speed}{eta}"

    def __enter__(self) -> Progress:
        global _display
        self._started = self._last = self.clock()
        if not self.step:
            of = "total unknown" if self.total is None else f"{self.total:,} {self.unit}"
            self.logger.info("%s: started (%s)", self.name, of)
            self.logged = True
        if self.display:
            if _display is None:
                _display = rich.progress.Progress(rich.progress.SpinnerColumn(),
                                                  rich.progress.TextColumn("{task.description}"),
                                                  rich.progress.TimeElapsedColumn(), transient=True,
                                                  console=Console(stderr=True))
                _display.start()
            self._task = _display.add_task(self.status(self._started), total=self.total)
        elif self.heartbeat and self.interval > 0:
            self._beat = threading.Thread(target=self._beat_until_stopped, daemon=True)
            self._beat.start()
        _running.append(self)
        return self

    def advance(self, count: int = 1) -> None:
        """`count` more done; a line when an interval has passed since the last one."""
        with self._lock:
            self.done += count
            now = self.clock()
            if self._task is not None and _display is not None:
                _display.update(self._task, description=self.status(now), completed=self.done)
            elif now - self._last >= self.interval:
                self._log(now)

    def _log(self, now: float) -> None:
        self.logger.info(self.status(now))
        self._last, self.logged = now, True

    def _beat_until_stopped(self) -> None:
        while not self._stop.wait(self.interval):
            with self._lock:
                now = self.clock()
                if now - self._last >= self.interval:
                    self._log(now)

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        global _display
        _running.remove(self)
        if self._beat is not None:
            self._stop.set()
            self._beat.join()
        if self._task is not None and _display is not None:
            _display.remove_task(self._task)
            if not any(phase._task is not None for phase in _running):
                _display.stop()
                _display = None
        if self.logged:
            now = self.clock()
            counted = f"{self.done:,}" if self.total is None else f"{self.done:,}/{self.total:,}"
            how = "done" if kind is None else f"stopped ({kind.__name__})"
            self.logger.info("%s: %s, %s %s in %s%s", self.name, how, counted, self.unit,
                             duration(now - self._started), self._rate(now)[1])
