"""Time of estimating every unique operator of GPT-3 175B (megatrongpt3) at tensor-parallel widths
1, 2, 4, 8, forward and backward, on every tensor-core (4,186) and vector-core (697) configuration.

Budget (DESIGN.md): under 120 s on a 2-core machine. Graph extraction is not timed (cached).
Run: python benchmarks/estimate.py
"""

import tempfile
import time

import numpy as np

from estimator import candidate_space, layer_workload, prepopulate
from estimator.fusion import fuse_layers
from estimator.table import vector_cycles
from estimator.work import DIRECTIONS
from estimator.workload import fused_work
from graph_extract import extract

WIDTHS = (1, 2, 4, 8)


def main() -> None:
    models = [extract("megatrongpt3", micro_batch_size=1, tensor_parallel_width=w) for w in WIDTHS]
    space = candidate_space()
    lanes = np.array([core.num * core.width for core in space.vc_cores])
    rows = []
    with tempfile.TemporaryDirectory() as cache:
        began = time.perf_counter()
        table = prepopulate(models, cache_dir=cache, progress=False)
        rows.append(("TC: every GEMM shape x 4,186 configs (cold cache)", time.perf_counter() - began,
                     f"{table.computed} shapes"))

        began = time.perf_counter()
        works = {}
        for model in models:
            representatives = tuple(group[0] for group in model.repeat_groups)
            for fused in fuse_layers(model.op_graph, representatives):
                for op in fused.ops:
                    for direction in DIRECTIONS:
                        work = fused_work(model.op_graph, op, direction)
                        works[(work.vector, direction)] = work
        vector = [vector_cycles(work.vector, lanes) for work in works.values() if work.vector]
        rows.append(("VC: every fused op x 697 configs", time.perf_counter() - began, f"{len(vector)} op-directions"))

        began = time.perf_counter()
        again = prepopulate(models, cache_dir=cache, progress=False)
        rows.append(("TC again (warm: a new table reads the Parquet cache)", time.perf_counter() - began,
                     f"{again.computed} computed"))

        model = models[-1]
        block = model.repeat_groups[1][0]
        began = time.perf_counter()
        for accelerator in space:
            layer_workload(model.op_graph, block, "backward", accelerator, again)
        rows.append(("layer_workload: one block (w 8, bwd) x 29,360 candidates", time.perf_counter() - began, ""))

    total = sum(seconds for title, seconds, _ in rows[:2])
    for title, seconds, note in rows:
        print(f"{title:<58} {seconds:8.2f} s  {note}")
    print(f"{'total for the budget (TC + VC, cold)':<58} {total:8.2f} s  (budget 120 s)")


if __name__ == "__main__":
    main()
