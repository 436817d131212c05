"""`phaze` and `python -m phaze`: a Ctrl-C or SIGTERM at any point, even while the modules load,
ends the command with one line and status 130 (a run_solver run has written what it had done,
marked incomplete, and says where)."""

import sys

from phaze import interrupt


def main() -> None:
    interrupt.install()
    try:
        with interrupt.held():  # torch, ortools and highspy abort or swallow a signal while they load
            from phaze.cli import main as command
        command()
    except KeyboardInterrupt as stop:
        stopped(stop)
    except (Exception, SystemExit) as error:
        # After a signal, an error is the KeyboardInterrupt a library's clean-up turned into another
        # (argparse's, half-way through parsing); phaze's own exits (130, 0) pass.
        deliberate = isinstance(error, SystemExit) and error.code in (0, None, interrupt.EXIT_CODE)
        if deliberate or not interrupt.received():
            raise
        stopped(KeyboardInterrupt())


def stopped(stop: KeyboardInterrupt) -> None:
    """One line and status 130."""
    interrupt.ignore()
    # A KeyboardInterrupt raised in code run by exec() (a dataclass being defined) leaves CPython's
    # "unhandled interrupt" mark set, which would end the process by SIGINT instead of the
    # status below; a successful exec() clears the mark.
    exec("pass")
    where = f": {stop}" if str(stop) else ""
    print(f"phaze: interrupted{where}; rerun the same command to resume from the caches", file=sys.stderr)
    sys.exit(interrupt.EXIT_CODE)


if __name__ == "__main__":
    main()
