"""Time and peak memory of extracting GPT-3 175B (megatrongpt3) at widths 1, 2, 4, 8 (no cache).

Budget (DESIGN.md): under 60 s and 4 GiB peak RSS on a 2-core machine.
Run: python benchmarks/extract.py
"""

import resource
import time

START = time.perf_counter()

from graph_extract import extract  # noqa: E402  (timed: importing torch is part of the cost)


def main() -> None:
    print(f"{'width':>5} {'operators':>9} {'layers':>6} {'groups':>6} {'seconds':>8}")
    for width in (1, 2, 4, 8):
        began = time.perf_counter()
        graphs = extract("megatrongpt3", micro_batch_size=1, tensor_parallel_width=width)
        print(
            f"{width:>5} {len(graphs.op_graph.nodes):>9} {len(graphs.layer_graph.layers):>6} "
            f"{len(graphs.repeat_groups):>6} {time.perf_counter() - began:>8.2f}"
        )
    total = time.perf_counter() - START
    peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2  # ru_maxrss is KiB on Linux
    print(f"total with imports {total:.1f} s (budget 60 s), peak RSS {peak_gib:.2f} GiB (budget 4 GiB)")


if __name__ == "__main__":
    main()
