"""Speed of `phaze.predict` and of the placement search on a known chip (GPT-3 175B, 1,024 A100s).

1. `phaze.predict` from Python, warm: Megatron's published GPT-3 175B layout on 1,024 A100 80 GB
   (t=8, p=16, d=8, micro-batch 1, batch 1,536, selective recomputation), called again with the same
   keywords once the process holds the graphs, the layer costs and the step model: median of 200
   (budget 1 ms); then the same call cycling through 6 layouts of that width (p and d; each prices its
   own placement); a layout asked for the first time (its keywords checked again); and the first call
   of the process (its configuration, the graphs, the roofline).
2. The search on that chip and cluster: every t (1-8), p, d, v, micro-batch (1, 2, 4, 8) and
   recomputation mode, from a cold graph cache, as `phaze run_solver chip=a100_80gb` runs it (budget
   60 s); then again, the graphs cached, over context-parallel widths 1, 2, 4 and the four
   data-parallel shardings too (budget 10 s).
3. The search of 2 with `tensor_parallel_plan=searched` (each width's plan searched by the sharding ILP
   and verified, then its graphs), from a cold cache, over the same with Megatron's plan (budget 2x).
Run from the repository root: python -m benchmarks.predict
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import phaze
from graph_extract import extract, get_spec, valid_tensor_parallel_widths
from phaze.plan_settings import planned_spec, search_prices
from phaze_hardware import cluster, known_chip
from solver.evaluate import evaluate_placements
from solver.layer_costs import roofline_costs
from solver.question import Axes, Question
from solver.training_step import RECOMPUTE_MODES, SHARDINGS

GIB = 2**30
GPT3 = get_spec("megatrongpt3").with_overrides(vocab_size=51200)
BATCH, SEQUENCE, DEVICES = 1536, 2048, 1024
PUBLISHED = dict(model=GPT3, chip="a100_80gb", system="dgx_a100", num_devices=DEVICES, global_batch_size=BATCH,
                 sequence_length=SEQUENCE, micro_batch_size=1, tensor_parallel_width=8, recompute="selective")


def timed(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def one_prediction(cache_dir: Path) -> None:
    keys = dict(PUBLISHED, cache_dir=str(cache_dir))
    first = timed(lambda: phaze.predict(pipeline_parallel_width=16, data_parallel_width=8, **keys))
    warm = [timed(lambda: phaze.predict(pipeline_parallel_width=16, data_parallel_width=8, **keys))
            for _ in range(200)]
    layouts = [(p, DEVICES // (8 * p)) for p in (1, 2, 4, 8, 16, 32, 48, 96) if DEVICES % (8 * p) == 0]
    new = [timed(lambda: phaze.predict(pipeline_parallel_width=stages, data_parallel_width=degree, **keys))
           for stages, degree in layouts]  # each layout's settings checked, its placement priced, once
    cycling = [timed(lambda: phaze.predict(pipeline_parallel_width=stages, data_parallel_width=degree, **keys))
               for _ in range(25) for stages, degree in layouts]
    result = phaze.predict(pipeline_parallel_width=16, data_parallel_width=8, **keys)
    print(f"1. phaze.predict, warm (t=8 p=16 d=8, selective): {statistics.median(warm) * 1e3:.3f} ms median "
          f"(min {min(warm) * 1e3:.3f} ms, budget 1 ms); {len(layouts)} layouts in turn: "
          f"{statistics.median(cycling) * 1e3:.3f} ms median; a layout asked for the first time: "
          f"{statistics.median(new) * 1e3:.2f} ms median (its settings checked); first call of the process "
          f"{first:.2f} s; "
          f"{result.time_per_batch_s:.2f} s per batch, MFU {result.mfu:.1%}")


def search(cache_dir: Path, context_widths: tuple[int, ...] = (1,), shardings: tuple[str, ...] | None = None,
           searched: bool = False) -> float:
    """The search's seconds (printed with its best placement); `searched`: every width split by its
    searched plan (`tensor_parallel_plan=searched`), the plans' search and verification included."""
    chip = known_chip("a100_80gb")
    widths = valid_tensor_parallel_widths(GPT3, 8)
    system = cluster("dgx_a100", DEVICES)
    question = Question(GPT3, SEQUENCE, BATCH, system)
    start, best = time.perf_counter(), None
    for micro_batch_size in (1, 2, 4, 8):
        axes = Axes((micro_batch_size,), (80 * GIB,), RECOMPUTE_MODES, widths, context_parallel_widths=context_widths,
                    data_parallel_shardings=shardings)
        spec = GPT3
        if searched:
            spec = planned_spec("searched", GPT3, micro_batch_size, SEQUENCE, widths,
                                lambda: search_prices(chip, None, system), cache_dir)
        graphs = {width: extract(spec, micro_batch_size, SEQUENCE, width, cache_dir=cache_dir) for width in widths}
        costs = roofline_costs(question.kernels, graphs, chip)
        for evaluation in evaluate_placements(question, axes, graphs, chip, costs):
            if evaluation.feasible and (best is None or evaluation.throughput > best[1].throughput):
                best = (micro_batch_size, evaluation)
    seconds = time.perf_counter() - start
    micro_batch_size, evaluation = best
    placement = evaluation.placement
    over = (f" x context widths {context_widths} x shardings {shardings}, graphs cached" if shardings
            else ", cold graph cache") + (", tensor_parallel_plan=searched" if searched else "")
    print(f"2. placement search, GPT-3 175B on {DEVICES} A100 (4 micro-batch sizes x widths {widths} x every p, d, v "
          f"x 3 recomputation modes{over}): {seconds:.1f} s; best: micro-batch {micro_batch_size}, "
          f"{placement.layout.text()} {placement.recompute} {placement.data_parallel_sharding}: "
          f"{placement.time_per_batch:.2f} s per batch")
    return seconds


def main() -> None:
    with tempfile.TemporaryDirectory() as first, tempfile.TemporaryDirectory() as second, \
            tempfile.TemporaryDirectory() as third:
        one_prediction(Path(first))
        megatron = search(Path(second))
        search(Path(second), (1, 2, 4), SHARDINGS)
        searched = search(Path(third), searched=True)
        print(f"3. the search with tensor_parallel_plan=searched over megatron, both from a cold cache: "
              f"{searched / megatron:.2f}x (budget 2x)")


if __name__ == "__main__":
    main()
