"""Stopping a run: SIGTERM is taken like Ctrl-C (KeyboardInterrupt), the files are written whatever
arrives meanwhile, and `phaze` then exits 130 with one line (phaze/cli.py)."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager

#: The exit status of an interrupted run (128 + SIGINT, as a shell reports a Ctrl-C).
EXIT_CODE = 130
SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: The one line an interrupted command ends with.
LINE = "phaze: interrupted{where}; rerun the same command to resume from the caches"


class Interrupted(KeyboardInterrupt):
    """A run stopped by the user after writing what was done; the message says where."""


#: Signals taken so far: a library that turns the KeyboardInterrupt into another error (argparse's
#: clean-up failing half-way) still ends the command as interrupted (`received`).
_RECEIVED: list[int] = []


def _raise(signum: int, frame: object) -> None:
    _RECEIVED.append(signum)
    raise KeyboardInterrupt


def received() -> bool:
    """Whether SIGINT or SIGTERM has arrived since `install`."""
    return bool(_RECEIVED)


def install() -> None:
    """SIGTERM raises KeyboardInterrupt in the main thread, as Ctrl-C does (a batch system's stop
    then writes the files too); both are recorded (`received`). A SIGINT the parent ignores
    (`nohup`, `&`) stays ignored."""
    signal.signal(signal.SIGTERM, _raise)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _raise)


def ignore() -> None:
    """From now on SIGINT and SIGTERM do nothing (the run is stopping: repeated Ctrl-Cs must not cut
    its exit short)."""
    for number in SIGNALS:
        signal.signal(number, signal.SIG_IGN)


def recorded() -> list[int]:
    """From now on SIGINT and SIGTERM only append their number to the list returned, never raise (the
    process is ending: phaze/__main__.py; `ignore` ends the recording)."""
    arrived: list[int] = []
    for number in SIGNALS:
        if signal.getsignal(number) is not signal.SIG_IGN:
            signal.signal(number, lambda signum, frame: arrived.append(signum))
    return arrived


@contextmanager
def _handled_by(handler: Callable[[int, object], None]) -> Iterator[None]:
    """Run the block with `handler` taking SIGINT and SIGTERM (a signal the parent ignores stays
    ignored), the previous handlers put back after it."""
    previous = {number: signal.getsignal(number) for number in SIGNALS}
    for number, found in previous.items():
        if found is not signal.SIG_IGN:
            signal.signal(number, handler)
    try:
        yield
    finally:
        for number, found in previous.items():
            signal.signal(number, found)


@contextmanager
def held(raise_after: bool = True) -> Iterator[list[int]]:
    """Run the block (writing the files) with SIGINT and SIGTERM held; one that arrived is raised
    as KeyboardInterrupt after the block when `raise_after` (else dropped: already stopping). The
    block gets the list of the signals that arrive."""
    arrived: list[int] = []
    with _handled_by(lambda signum, frame: arrived.append(signum)):
        yield arrived
    if arrived and raise_after:
        raise KeyboardInterrupt


@contextmanager
def exits_at_once() -> Iterator[None]:
    """Run the block (loading phaze's modules, before anything is written) with SIGINT and SIGTERM
    ending the process at once with the one line and status 130. torch, ortools and highspy abort,
    fail or swallow a KeyboardInterrupt raised while they load, and holding the signal until they
    have loaded makes a Ctrl-C wait for the whole import (seconds on a loaded machine); an exit
    without exit functions runs none of their half-set-up finalizers. A SIGINT the parent ignores
    stays ignored."""
    def leave(signum: int, frame: object) -> None:
        os.write(2, (LINE.format(where="") + "\n").encode())
        os._exit(EXIT_CODE)

    with _handled_by(leave):
        yield
