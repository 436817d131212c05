"""What a run shows on the console: its summary lines (stdout, kept in phaze.log), and the logging
handlers of hydra's job logging (conf/hydra/job_logging/phaze.yaml) that send progress lines and
warnings to stderr and phaze.log. The progress of long work itself is `phaze_common.progress`."""

from __future__ import annotations

import io
import logging
import sys

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from phaze_common.progress import progress_interval

#: The lines a run prints to stdout (its summary): kept in phaze.log, not repeated on stderr.
SUMMARY = logging.getLogger("phaze.summary")


def setup_logging() -> None:
    """At the start of a run: warnings (`warnings.warn` too) go through logging, and a bad
    INTERVAL_VARIABLE is reported once."""
    logging.captureWarnings(True)
    progress_interval()


def show(text: str) -> None:
    """Print summary lines to stdout as they are (no wrapping) and keep them in phaze.log."""
    for line in text.splitlines():
        print(line, flush=True)
        SUMMARY.info(line)


def show_table(table: Table) -> None:
    """`show` a rich table as plain text, as wide as its widest row or its title needs (a title is one
    line)."""
    measuring = Console(width=10**6)
    text = io.StringIO()
    width = max(Measurement.get(measuring, measuring.options, table).maximum, len(str(table.title or "")))
    console = Console(file=text, width=width, color_system=None)
    console.print(table)
    show("\n".join(line.rstrip() for line in text.getvalue().splitlines()))


class StderrHandler(logging.StreamHandler):
    """The console handler: writes to what sys.stderr is when a record comes, so that on a terminal
    rich's live display (which stands in for sys.stderr) puts the line above the bars."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


class NotSummary(logging.Filter):
    """Drops the summary lines, which are printed to stdout (`show`), from the console handler."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.name != SUMMARY.name
