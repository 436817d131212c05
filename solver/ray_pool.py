"""Ray actors that serve a search's calls as `solver.workers.WorkerPool`'s processes do, on a cluster.

`RayPool(share, drain, processes, address)`: `share(context)`, run once per context in the driver,
gives the actors' state (sent once through Ray's object store) and a function that stores in the
driver's caches what the actors computed; `drain(state)`, run in an actor after each chunk, takes
those writes from its state. So the actors need no cache folder and never write one: only the
driver does. An actor's log records come back with its results and the driver logs them (a warning
only once), as it does for local workers.

A chunk whose actor dies (a killed process, a lost node) is given to a new actor: results are kept
by chunk index, and a dead actor's results and writes never arrive, so nothing is lost or counted
twice. `address` None starts a private Ray for the run (`processes` CPUs, its own temporary
folder), shut down by `close`; "auto" or host:port joins a cluster, which `close` leaves running.
In a process connected to Ray already (a job of hydra's Ray launcher), the actors join its cluster.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

from phaze_common.progress import Progress, mark_worker
from solver.workers import log_worker_record

log = logging.getLogger(__name__)

#: Times a chunk is given to a new actor after its actor died, before the run gives up.
RETRIES = 3
#: Memory [bytes] of a private Ray's object store (it holds the shared states only).
OBJECT_STORE_BYTES = 256 * 2**20


class ClusterUnavailable(ConnectionError):
    """Ray could not be started or joined, or has no CPU for the workers; one line saying what to do."""


def _unavailable(address: str | None, error: BaseException) -> ClusterUnavailable:
    """The one-line error of a failed ray.init."""
    causes = [error]
    while causes[-1].__cause__ is not None:
        causes.append(causes[-1].__cause__)
    reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    if address is None:
        return ClusterUnavailable(f"executor: a private Ray could not start ({reason}); give executor=local")
    if any("AuthToken" in str(cause) or type(cause).__name__ == "AuthenticationError" for cause in causes):
        return ClusterUnavailable(f"ray_address: {address} wants its authentication token; run with "
                                  "RAY_AUTH_MODE=token and RAY_AUTH_TOKEN_PATH=<the cluster's token file> "
                                  "(or RAY_AUTH_TOKEN=<token>)")
    return ClusterUnavailable(f"ray_address: cannot join {address} ({reason}); start one with `ray start --head` "
                              "or give executor=local")


class _Collect(logging.Handler):
    """Keeps an actor's log records, made picklable, until its chunk's results go back."""

    def __init__(self, worker: str) -> None:
        super().__init__()
        self.worker, self.records = worker, []

    def emit(self, record: logging.LogRecord) -> None:
        record.msg, record.args, record.exc_info, record.exc_text = self.format(record), None, None, None
        record.processName = self.worker
        self.records.append(record)

    def take(self) -> list[logging.LogRecord]:
        taken, self.records = self.records, []
        return taken


class _Server:
    """One actor: builds a context's state from the shared object once, then serves chunks."""

    def __init__(self, name: str, drain: Callable[[Any], list], level: int) -> None:
        self.collect, self.drain = _Collect(name), drain
        logging.getLogger().handlers[:] = [self.collect]
        logging.getLogger().setLevel(level)
        logging.captureWarnings(True)
        mark_worker()
        self.context, self.state = None, None  # the latest context only

    def serve(self, context: Any, shared: list, function: Callable, chunk: list, extra: tuple) -> tuple:
        """(function(state, chunk, *extra), the state's cache writes, the log records meanwhile)."""
        import ray

        if self.state is None or context != self.context:
            self.context, self.state = context, ray.get(shared[0])
        try:
            value = function(self.state, chunk, *extra)
        finally:
            writes = self.drain(self.state)  # an error's writes are dropped with it: the driver stops
        return value, writes, self.collect.take()


class RayPool:
    """`processes` Ray actors (-1: the cluster's CPUs) with WorkerPool's `map` and `close`."""

    def __init__(self, share: Callable[[Any], tuple[Any, Callable[[list], None]]], drain: Callable[[Any], list],
                 processes: int, address: str | None) -> None:
        import ray

        self.share, self.drain, self.address = share, drain, address
        self._connected = not ray.is_initialized()  # in a Ray task (a Ray launcher's job): its cluster
        self._temporary = tempfile.mkdtemp(prefix="phaze-ray-") if self._connected and address is None else None
        handler = signal.getsignal(signal.SIGTERM)  # ray.init sets its own; the run's stays
        try:
            if self._temporary is not None:
                ray.init(num_cpus=os.cpu_count() if processes == -1 else processes, _temp_dir=self._temporary,
                         include_dashboard=False, log_to_driver=False, object_store_memory=OBJECT_STORE_BYTES,
                         logging_level=logging.ERROR)
            elif self._connected:
                ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
        except (ConnectionError, RuntimeError) as error:
            self._remove_temporary()
            raise _unavailable(address, error) from None
        finally:
            signal.signal(signal.SIGTERM, handler)
        # in a Ray task, the CPUs left by the cluster's other tasks (the jobs of the sweep)
        cpus = int((ray.cluster_resources() if self._connected else ray.available_resources()).get("CPU", 0))
        if cpus < 1:
            self._actors = []
            self.close()
            raise ClusterUnavailable("executor: the Ray cluster has no free CPU for this run's workers; give "
                                     "executor=local, or run fewer jobs at a time")
        if processes == -1:
            processes = cpus
        elif processes > cpus:
            log.warning("n_jobs: %d, but the Ray cluster has %d CPUs for them: %d Ray workers", processes, cpus, cpus)
            processes = cpus
        self.processes = processes
        self._server = ray.remote(num_cpus=1, max_restarts=0, max_task_retries=0)(_Server)
        self._level = logging.getLogger().getEffectiveLevel()
        self._started = 0
        self._actors = [self._new_actor() for _ in range(processes)]
        self._context: Any = None
        self._shared: list = []  # [the ObjectRef of the latest context's state]
        self._store: Callable[[list], None] = lambda writes: None
        where = address or ("a private local cluster" if self._temporary is not None else "this task's cluster")
        log.info("Ray: %d workers on %s", processes, where)

    def _new_actor(self) -> Any:
        self._started += 1
        return self._server.remote(f"ray worker {self._started}", self.drain, self._level)

    def map(self, context: Any, function: Callable, chunks: Sequence[Sequence], *extra) -> list:
        """[function(state, chunk, *extra) for chunk in chunks], computed by the actors, where the
        state is `share(context)`'s; what they stored in their caches is stored in the driver's."""
        import ray
        from ray.exceptions import RayActorError

        if context != self._context or not self._shared:
            state, self._store = self.share(context)
            self._context, self._shared = context, [ray.put(state)]
        found: dict[int, Any] = {}
        pending: dict[Any, tuple[int, int, Any]] = {}  # ObjectRef -> (chunk index, actor position, actor)
        failures = [0] * len(chunks)

        def submit(index: int, position: int) -> None:
            actor = self._actors[position]
            pending[actor.serve.remote(context, self._shared, function, list(chunks[index]), extra)] = (
                index, position, actor)

        for index in range(len(chunks)):
            submit(index, index % len(self._actors))
        items = sum(len(chunk) for chunk in chunks)
        with Progress(f"{function.__name__} on {len(self._actors)} Ray workers", items, "items", log) as progress:
            try:
                while pending:
                    (ready,), _ = ray.wait(list(pending), num_returns=1)
                    index, position, actor = pending.pop(ready)
                    try:
                        value, writes, records = ray.get(ready)
                    except RayActorError as error:
                        failures[index] += 1
                        if failures[index] > RETRIES:
                            raise RuntimeError(f"Ray workers died {failures[index]} times on the same chunk "
                                               f"({type(error).__name__}); see the cluster's logs") from None
                        if self._actors[position] is actor:  # its other chunks find it replaced already
                            log.warning("ray worker %d died (%s); its chunks go to a new worker", position + 1,
                                        type(error).__name__)
                            self._replace(position)
                        submit(index, position)
                        continue
                    for record in records:
                        log_worker_record(record)
                    self._store(writes)
                    found[index] = value
                    progress.advance(len(chunks[index]))
            finally:
                for call in pending:  # an error or an interrupt: what is still queued is not run
                    ray.cancel(call)
        return [found[index] for index in range(len(chunks))]

    def _replace(self, position: int) -> None:
        """A new actor in place of a dead one."""
        import ray

        ray.kill(self._actors[position], no_restart=True)
        self._actors[position] = self._new_actor()

    def _remove_temporary(self) -> None:
        if self._temporary is not None:
            shutil.rmtree(self._temporary, ignore_errors=True)

    def close(self) -> None:
        """Ends the actors and the connection this pool made (a private Ray with its temporary folder)."""
        import ray

        if not ray.is_initialized():
            return
        for actor in self._actors:
            ray.kill(actor, no_restart=True)
        self._actors = []
        if self._connected:
            ray.shutdown()
        self._remove_temporary()
