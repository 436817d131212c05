"""Solves that a Ctrl-C or SIGTERM stops within a moment, and that then raise.

A solver that runs in this process (CP-SAT, HiGHS) keeps Python's signal handlers from running until
it returns, and CP-SAT's own SIGINT handling (`catch_sigint_signal`) ends a solve as if its time were
up, so the caller would take (and cache) a cut-short schedule as final. Here the solve runs in a
helper thread; the main thread waits, takes the signal as Python's KeyboardInterrupt, asks the
solver to stop, waits for it and re-raises. The wait is on an Event, not `Thread.join`, which an
interrupt can end early (CPython gh-90882): the interpreter would then exit under a running solver
and abort.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from ortools.sat.python import cp_model

#: How often [s] the waiting thread wakes to let Python run its signal handlers.
WAKE_INTERVAL = 0.05
Result = TypeVar("Result")


def run(work: Callable[[], Result], stop: Callable[[], None]) -> Result:
    """work() in a helper thread; interrupted, stop() (again until work has returned) and re-raise."""
    if threading.current_thread() is not threading.main_thread():
        return work()  # signals reach only the main thread
    done = threading.Event()
    outcome: list = []

    def target() -> None:
        try:
            outcome.append(work())
        except BaseException as error:  # re-raised in the caller's thread
            outcome.append(error)
        finally:
            done.set()

    threading.Thread(target=target, name="solver", daemon=True).start()
    try:
        while not done.wait(WAKE_INTERVAL):
            pass
    except KeyboardInterrupt:
        while not done.is_set():  # whatever else arrives meanwhile
            try:
                stop()  # again until it takes: the solve may not have started yet
                done.wait(WAKE_INTERVAL)
            except KeyboardInterrupt:
                continue
        raise
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


def solve(solver: cp_model.CpSolver, model: cp_model.CpModel) -> int:
    """`solver.solve(model)`'s status; KeyboardInterrupt (the search stopped) when interrupted."""
    solver.parameters.catch_sigint_signal = False
    return run(lambda: solver.solve(model), solver.stop_search)
