"""Worker processes that each build the state of a search context once and then serve calls: the
state (graphs, estimate table, caches) lives in each worker's loop, not in module globals.

Workers start with `spawn`, on the first call, in their own process group, so a Ctrl-C in the
terminal reaches only the driver, which stops them (`close`); a worker whose driver has gone exits. One pool serves a whole run: a call for another context rebuilds the worker's state; a call
that needs none (`call`: the graphs' traces, the GEMM estimates) leaves it as it is. A worker's log
records (its warnings, its progress lines) come back on the results queue, in order with its
results, and the driver logs them with its own handlers (console and phaze.log); a warning whose text
the driver or another worker gave already is dropped.
"""

from __future__ import annotations

import logging
import logging.handlers
import multiprocessing
import os
import queue
import time
from collections.abc import Callable, Sequence
from typing import Any

from phaze_common.log import new_warning
from phaze_common.progress import mark_worker

#: How often [s] an idle worker checks that its driver is still there.
DRIVER_CHECK = 5.0
#: How long [s] `close` waits for the workers to finish their task in hand before terminating them.
CLOSE_WAIT = 1.0


def log_worker_record(record: logging.LogRecord) -> None:
    """Log here a record a worker (a process or a Ray actor) sent back, named after it; a warning whose
    text was given already is dropped."""
    if record.levelno < logging.WARNING or new_warning(record.getMessage()):
        record.msg = f"{record.processName}: {record.msg}"
        logging.getLogger(record.name).handle(record)


class _ToDriver(logging.handlers.QueueHandler):
    """Puts a worker's log records on the results queue, under the key None."""

    def enqueue(self, record: logging.LogRecord) -> None:
        self.queue.put((None, None, record))


def _serve(build: Callable[[Any], Any], driver: int, tasks, results, level: int) -> None:
    os.setpgrp()
    logging.getLogger().handlers[:] = [_ToDriver(results)]
    logging.getLogger().setLevel(level)
    logging.captureWarnings(True)
    mark_worker()
    argument, state = None, None  # the state of the latest context only
    while True:
        try:
            task = tasks.get(timeout=DRIVER_CHECK)
        except queue.Empty:
            if os.getppid() != driver:
                return
            continue
        if task is None:
            return
        key, context, function, arguments = task
        try:
            if context is None:  # a call that needs no state (`WorkerPool.call`): the state is kept
                results.put((key, None, function(*arguments)))
                continue
            if state is None or context != argument:
                argument, state = context, build(context)
            results.put((key, None, function(state, *arguments)))
        except Exception as error:  # the driver re-raises it
            results.put((key, error, None))


class WorkerPool:
    """`processes` workers; `map(context, function, chunks, *extra)` runs function(state, chunk, *extra)
    where each worker's state is `build(context)`."""

    def __init__(self, build: Callable[[Any], Any], processes: int) -> None:
        self.build, self.processes = build, processes
        self._workers: list = []
        self._calls = 0  # results of an abandoned call (an error, an interrupt) are told apart and dropped

    def _start(self) -> None:
        context = multiprocessing.get_context("spawn")
        self._tasks, self._results = context.Queue(), context.Queue()
        level = logging.getLogger().getEffectiveLevel()
        self._workers = [context.Process(target=_serve, name=f"worker {number}", daemon=True,
                                         args=(self.build, os.getpid(), self._tasks, self._results, level))
                         for number in range(1, self.processes + 1)]
        for worker in self._workers:
            worker.start()

    def map(self, argument: Any, function: Callable, chunks: Sequence[Sequence], *extra) -> list:
        """[function(build(argument), chunk, *extra) for chunk in chunks], computed by the workers."""
        return self._run([(argument, function, (list(chunk), *extra)) for chunk in chunks])

    def call(self, function: Callable, argument_lists: Sequence[Sequence],
             done: Callable[[int, Any], None] = lambda index, value: None) -> list:
        """[function(*arguments) for arguments in argument_lists], computed by the workers without
        their state (which they keep); `done(index, value)` as each arrives."""
        return self._run([(None, function, tuple(arguments)) for arguments in argument_lists], done)

    def _run(self, tasks: list[tuple[Any, Callable, tuple]],
             done: Callable[[int, Any], None] = lambda index, value: None) -> list:
        """The values of (context, function, arguments) tasks, in their order."""
        if not self._workers:
            self._start()
        self._calls += 1
        for index, (argument, function, arguments) in enumerate(tasks):
            self._tasks.put(((self._calls, index), argument, function, arguments))
        found: dict[int, Any] = {}
        while len(found) < len(tasks):
            try:
                key, error, value = self._results.get(timeout=1.0)
            except queue.Empty:
                if not all(worker.is_alive() for worker in self._workers):
                    raise RuntimeError("a worker process died") from None
                continue
            if key is None:  # a worker's log record: logged here, a warning only once
                log_worker_record(value)
                continue
            call, index = key
            if call != self._calls:
                continue
            if error is not None:
                raise error
            found[index] = value
            done(index, value)
        return [found[index] for index in range(len(tasks))]

    def close(self) -> None:
        """Stop the workers: an idle one exits by itself (its finalisers run: what it registered with
        the semaphore tracker is released), a busy one after CLOSE_WAIT is terminated."""
        started = [worker for worker in self._workers if worker.pid is not None]  # not if a start failed
        for _ in started:
            self._tasks.put(None)
        deadline = time.monotonic() + CLOSE_WAIT
        for worker in started:
            worker.join(timeout=max(deadline - time.monotonic(), 0.0))
        for worker in started:
            if worker.is_alive():
                worker.terminate()
        for worker in started:
            worker.join(timeout=5.0)
        self._workers = []
