"""Time and peak memory of extracting a model (GPT-3 175B, megatrongpt3, unless named) at its widths
up to 8 (no cache).

Budget (DESIGN.md): under 60 s and 4 GiB peak RSS on a 2-core machine.
Run: python benchmarks/extract.py [model]   (e.g. llama3-405b)
"""

import resource
import sys
import time

START = time.perf_counter()

from graph_extract import extract, valid_tensor_parallel_widths  # noqa: E402  (timed: importing torch is part of the cost)


def main(model: str = "megatrongpt3") -> None:
    print(f"{model}\n{'width':>5} {'operators':>9} {'layers':>6} {'groups':>6} {'seconds':>8}")
    for width in valid_tensor_parallel_widths(model, 8):
        began = time.perf_counter()
        graphs = extract(model, micro_batch_size=1, tensor_parallel_width=width)
        print(
            f"{width:>5} {len(graphs.op_graph.nodes):>9} {len(graphs.layer_graph.layers):>6} "
            f"{len(graphs.repeat_groups):>6} {time.perf_counter() - began:>8.2f}"
        )
    total = time.perf_counter() - START
    peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2  # ru_maxrss is KiB on Linux
    print(f"total with imports {total:.1f} s (budget 60 s), peak RSS {peak_gib:.2f} GiB (budget 4 GiB)")


if __name__ == "__main__":
    main(*sys.argv[1:2])
