"""Worker processes that each build their own state once and then serve calls: the state a search
needs (graphs, estimate table, caches) lives in each worker's loop, not in module globals.

Workers start with `spawn` in their own process group, so a Ctrl-C in the terminal reaches only
the driver, which stops them (`close`).
"""

from __future__ import annotations

import multiprocessing
import os
import queue
from collections.abc import Callable, Sequence
from typing import Any


def _serve(build: Callable[[Any], Any], argument: Any, tasks, results) -> None:
    os.setpgrp()
    state = build(argument)
    while (task := tasks.get()) is not None:
        key, function, arguments = task
        try:
            results.put((key, None, function(state, *arguments)))
        except Exception as error:  # the driver re-raises it
            results.put((key, error, None))


class WorkerPool:
    """`processes` workers, each holding `build(argument)`; `map` runs function(state, chunk, *extra)."""

    def __init__(self, build: Callable[[Any], Any], argument: Any, processes: int) -> None:
        context = multiprocessing.get_context("spawn")
        self._tasks, self._results = context.Queue(), context.Queue()
        self._workers = [context.Process(target=_serve, args=(build, argument, self._tasks, self._results), daemon=True)
                         for _ in range(processes)]
        for worker in self._workers:
            worker.start()

    def map(self, function: Callable, chunks: Sequence[Sequence], *extra) -> list:
        """[function(state, chunk, *extra) for chunk in chunks], computed by the workers."""
        for key, chunk in enumerate(chunks):
            self._tasks.put((key, function, (list(chunk), *extra)))
        found: dict[int, Any] = {}
        while len(found) < len(chunks):
            try:
                key, error, value = self._results.get(timeout=5.0)
            except queue.Empty:
                if not all(worker.is_alive() for worker in self._workers):
                    raise RuntimeError("a worker process died") from None
                continue
            if error is not None:
                raise error
            found[key] = value
        return [found[key] for key in range(len(chunks))]

    def close(self) -> None:
        for worker in self._workers:
            if worker.is_alive():
                worker.terminate()
        for worker in self._workers:
            worker.join(timeout=5.0)
