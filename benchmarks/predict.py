"""Speed of `phaze predict` and of the placement search on a known chip (GPT-3 175B, 1,024 A100s).

1. One prediction: Megatron's published GPT-3 175B layout on 1,024 A100 80 GB (t=8, p=16, d=8,
   micro-batch 1, batch 1,536, selective recomputation): the layer costs on the chip and the step,
   with the graphs extracted; median of 50 (budget 50 ms, goal 3 ms).
2. The search on that chip and cluster: every t (1-8), p, d, v, micro-batch (1, 2, 4, 8) and
   recomputation mode, from a cold graph cache, as `phaze run_solver accelerator.preset=a100_80gb`
   runs it (budget 60 s; the reference tool's exhaustive search takes up to 45 minutes).
Run from the repository root: python -m benchmarks.predict
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from estimator.known import known_chip
from graph_extract import extract, get_spec, valid_tensor_parallel_widths
from phaze.settings import system_cluster
from solver.evaluate import evaluate_placements
from solver.job import Job
from solver.predict import predict, roofline_costs
from solver.training_step import RECOMPUTE_MODES, Training

GIB = 2**30
GPT3 = get_spec("megatrongpt3").with_overrides(vocab_size=51200)
BATCH, SEQUENCE, DEVICES = 1536, 2048, 1024


def job(micro_batch_size: int, widths: tuple[int, ...], recompute: tuple[str, ...]) -> Job:
    return Job(GPT3, SEQUENCE, micro_batch_size, BATCH, widths, system_cluster("dgx_a100", DEVICES), (80 * GIB,),
               Training(), recompute)


def one_prediction(cache_dir: Path) -> None:
    chip = known_chip("a100_80gb")
    graphs = extract(GPT3, 1, SEQUENCE, 8, cache_dir=cache_dir)
    published = job(1, (8,), ("selective",))
    times = []
    for _ in range(50):
        start = time.perf_counter()
        result = predict(published, graphs, roofline_costs(published, {8: graphs}, chip), chip, 16, 8)
        times.append(time.perf_counter() - start)
    print(f"1. one prediction (t=8 p=16 d=8, selective): {statistics.median(times) * 1e3:.1f} ms median "
          f"(min {min(times) * 1e3:.1f} ms); {result.step.time_per_batch:.2f} s per batch, MFU {result.mfu:.1%}")


def search(cache_dir: Path) -> None:
    chip = known_chip("a100_80gb")
    widths = valid_tensor_parallel_widths(GPT3, 8)
    start, best = time.perf_counter(), None
    for micro_batch_size in (1, 2, 4, 8):
        searched = job(micro_batch_size, widths, tuple(RECOMPUTE_MODES))
        graphs = {width: extract(GPT3, micro_batch_size, SEQUENCE, width, cache_dir=cache_dir) for width in widths}
        costs = roofline_costs(searched, graphs, chip)
        for evaluation in evaluate_placements(searched, graphs, chip, costs, 80 * GIB):
            if evaluation.feasible and (best is None or evaluation.throughput > best[1].throughput):
                best = (micro_batch_size, evaluation)
    seconds = time.perf_counter() - start
    micro_batch_size, evaluation = best
    placement = evaluation.placement
    print(f"2. placement search, GPT-3 175B on {DEVICES} A100 (4 micro-batch sizes x widths {widths} x every p, d, v "
          f"x 3 recomputation modes), cold graph cache: {seconds:.1f} s; best: micro-batch {micro_batch_size}, "
          f"t={placement.tensor_parallel_width} p={len(placement.stages)} d={placement.data_parallel_degree} "
          f"v={placement.virtual_stages} {placement.recompute}: {placement.time_per_batch:.2f} s per batch")


def main() -> None:
    with tempfile.TemporaryDirectory() as cache:
        one_prediction(Path(cache))
        search(Path(cache))


if __name__ == "__main__":
    main()
