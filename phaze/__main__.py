"""`phaze` and `python -m phaze`: a Ctrl-C or SIGTERM at any point, even while the modules load or
after the run's files are written, ends the command with one line and status 130 (a run_solver run
has written what it had done, marked incomplete, and says where)."""

import atexit
import os
import sys
import threading
import traceback

from phaze import interrupt, rundir


def main() -> None:
    interrupt.install()
    try:
        with interrupt.exits_at_once():  # torch, ortools and highspy abort or swallow a signal while they load
            from phaze.cli import main as command
        command()
        code = 0
    except KeyboardInterrupt as stop:
        code = stopped(stop)
    except (Exception, SystemExit) as error:
        # After a signal, an error is the KeyboardInterrupt a library's clean-up turned into another
        # (argparse's, half-way through parsing); phaze's own exits (130, 0) pass.
        deliberate = isinstance(error, SystemExit) and error.code in (0, None, interrupt.EXIT_CODE)
        if not deliberate and interrupt.received():
            code = stopped(KeyboardInterrupt())
        elif isinstance(error, SystemExit):
            code = exit_status(error)
        else:
            traceback.print_exc()
            code = 1
    try:
        finish(code)
    except KeyboardInterrupt:  # a signal before finish took the signals over
        finish(stopped(KeyboardInterrupt()))


def exit_status(stop: SystemExit) -> int:
    """The status `sys.exit(code)` ends a process with (a message is printed and ends it with 1)."""
    if stop.code is None or isinstance(stop.code, int):
        return stop.code or 0
    print(stop.code, file=sys.stderr)
    return 1


def stopped(stop: KeyboardInterrupt) -> int:
    """One line; status 130."""
    interrupt.ignore()
    where = f": {stop}" if str(stop) else ""
    print(interrupt.LINE.format(where=where), file=sys.stderr)
    return interrupt.EXIT_CODE


def finish(code: int) -> None:
    """End the process with `code`, or with the one line and 130 if a signal arrives meanwhile.

    Python's own exit would run the exit functions (torch's finalizers, logging's flush, Ray's
    shutdown) with the signal raising KeyboardInterrupt inside them (printed as ignored, status
    kept), then reset the handlers and tear the modules down, where the signal kills the process
    (143 for SIGTERM, no line). Here the exit functions run with signals held, the streams are
    flushed, and os._exit ends the process without the teardown; from the last check on, the
    signals are ignored (no handler that raises is put back: a signal taken by another thread runs
    its Python handler in the main thread later). The run directory's marker then says whether the
    run finished (status 0; phaze.rundir)."""
    arrived = interrupt.recorded()
    _flush()
    threading_shutdown = getattr(threading, "_shutdown", None)  # non-daemon threads, as Python's exit
    if threading_shutdown is not None:
        threading_shutdown()
    atexit._run_exitfuncs()
    _flush()
    interrupt.ignore()
    if arrived and code != interrupt.EXIT_CODE:
        code = stopped(KeyboardInterrupt())
    rundir.release(finished=code == 0)
    _flush()
    os._exit(code)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):  # a closed pipe or stream: nothing more to say
            pass


if __name__ == "__main__":
    main()
