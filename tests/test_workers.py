"""The local worker pool's stateless calls (`WorkerPool.call`) and what a run hands them: the graphs
of several micro-batch sizes and the GEMM estimates, equal to what one process computes."""

from __future__ import annotations

import os

import numpy as np

from estimator import candidate_space
from estimator.table import EstimateTable
from phaze.extracted import extract_all
from solver.workers import WorkerPool


def _state(context: str) -> tuple[str, int, float]:
    """A worker's state for `context`: the context, the worker's process and a token of this build."""
    return context, os.getpid(), float(np.random.default_rng().random())


def _state_of(state: tuple, chunk: list) -> list:
    return [state for _ in chunk]


def _square(value: int) -> int:
    return value * value


def test_stateless_calls_keep_the_state_and_match_one_process(tiny_settings, tmp_path):
    pool = WorkerPool(_state, 2)
    try:
        before = {state for states in pool.map("a", _state_of, [[0], [1], [2], [3]]) for state in states}
        arrived = []
        assert pool.call(_square, [(n,) for n in range(10)], lambda index, value: arrived.append((index, value))) \
            == [n * n for n in range(10)]
        assert sorted(arrived) == [(n, n * n) for n in range(10)]
        after = {state for states in pool.map("a", _state_of, [[0], [1], [2], [3]]) for state in states}
        assert after <= before  # the same builds: a stateless call rebuilt no worker's state

        # a run's graphs traced side by side into the cache, then read: those one process traces
        pooled = extract_all(tiny_settings(tmp_path / "pooled", "micro_batch_size=[1,2]"), pool.call)
        alone = extract_all(tiny_settings(tmp_path / "alone", "micro_batch_size=[1,2]"))
        assert {b: {t: (g.op_graph, g.layer_graph, g.repeat_groups) for t, g in by_width.items()}
                for b, by_width in pooled.items()} == {
            b: {t: (g.op_graph, g.layer_graph, g.repeat_groups) for t, g in by_width.items()}
            for b, by_width in alone.items()}

        # the GEMM estimates computed by the workers, stored by this process: those it computes
        settings = tiny_settings(tmp_path / "alone")
        shapes = [(64, 128, 256), (8, 1024, 512), (512, 512, 512)]
        cores = candidate_space(settings.accelerator, settings.area_budget).tc_cores
        tables = [EstimateTable(settings.accelerator, cores, tmp_path / name)
                  for name in ("t1", "t2")]
        assert tables[0].fill(shapes, call=pool.call) == tables[1].fill(shapes) == 3
        for shape in shapes:
            assert all(np.array_equal(getattr(tables[0].gemm(shape), name), getattr(tables[1].gemm(shape), name))
                       for name in ("cycles", "macs", "dram_words"))
        assert EstimateTable(settings.accelerator, tables[0].tc_cores, tmp_path / "t1").fill(shapes) == 0  # stored
    finally:
        pool.close()
