"""CP-SAT solves that a Ctrl-C or SIGTERM stops within a moment, and that then raise.

CP-SAT's own SIGINT handling (`catch_sigint_signal`) ends a solve as if its time were up, so the
caller would take (and cache) a cut-short schedule as final, and between solves the signal falls
to the default action. Here the solve runs in a helper thread with that handling off; the main
thread waits, takes the signal as Python's KeyboardInterrupt, stops the search and re-raises.
The wait is on an Event, not `Thread.join`, which an interrupt can end early (CPython gh-90882):
the interpreter would then exit under a running solver and abort.
"""

from __future__ import annotations

import threading

from ortools.sat.python import cp_model

#: How often [s] the waiting thread wakes to let Python run its signal handlers.
WAKE_INTERVAL = 0.05


def solve(solver: cp_model.CpSolver, model: cp_model.CpModel) -> int:
    """`solver.solve(model)`'s status; KeyboardInterrupt (the search stopped) when interrupted."""
    solver.parameters.catch_sigint_signal = False
    if threading.current_thread() is not threading.main_thread():
        return solver.solve(model)  # signals reach only the main thread
    done = threading.Event()
    outcome: list = []

    def run() -> None:
        try:
            outcome.append(solver.solve(model))
        except BaseException as error:  # re-raised in the caller's thread
            outcome.append(error)
        finally:
            done.set()

    threading.Thread(target=run, name="cp-sat", daemon=True).start()
    try:
        while not done.wait(WAKE_INTERVAL):
            pass
    except KeyboardInterrupt:
        _stop(solver, done)
        raise
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


def _stop(solver: cp_model.CpSolver, done: threading.Event) -> None:
    """Stop the search and wait until the solver thread has returned, whatever else arrives."""
    while not done.is_set():
        try:
            solver.stop_search()  # again until it takes: the solve may not have started yet
            done.wait(WAKE_INTERVAL)
        except KeyboardInterrupt:
            continue
