"""CPU time of the placement DP on a 97-layer GPT-like chain (embedding + 96 blocks).

Inputs follow the formulas of shared/reference/placement/README.md §4 (GPT-3-6.7B-like blocks,
h=4096, 32 heads, sequence 2048, micro-batch 8, vocabulary 50257, 100 TFLOP/s, 4 GiB/s), in the
original program's JSON schema (latencies in ms), at widths 1, 2, 4, 8 on 1024 devices with 512
micro-batches per batch. Cases: 32 GiB per device or memory that never binds, recomputation off
or on. Each case runs `solve_document` (parse + DP over all widths + baseline) a few times and
prints the median CPU seconds.
Run from the repository root: python -m benchmarks.placement [--repeats N] [--sync-cost max_stage]
"""

from __future__ import annotations

import argparse
import statistics
import time


from solver.placement.jsonio import solve_document

GIB = 1024**3
HIDDEN, HEADS, SEQUENCE, MICRO_BATCH, VOCABULARY = 4096, 32, 2048, 8, 50257
FLOPS_PER_SECOND, LINK_BYTES_PER_SECOND = 100e12, 4 * GIB


def allreduce_ms(width: int, tokens_hidden: int) -> float:
    """One Megatron all-reduce of the activations over `width` devices, in ms."""
    return 2 * (width - 1) / width * tokens_hidden * 2 / LINK_BYTES_PER_SECOND * 1000 if width > 1 else 0.0


def layer_nodes(blocks: int, width: int) -> list[dict]:
    """Embedding (id -1) and `blocks` transformer blocks as one width's node list."""
    sbh = SEQUENCE * MICRO_BATCH * HIDDEN
    block_fw = 24 * MICRO_BATCH * SEQUENCE * HIDDEN**2 * (1 + SEQUENCE / (6 * HIDDEN)) / FLOPS_PER_SECOND * 1000 / width
    embed_fw = 0.01 * 2 * sbh * VOCABULARY / FLOPS_PER_SECOND * 1000 / width
    reduce = allreduce_ms(width, sbh)
    embedding = {
        "id": -1,
        "parameterSize": VOCABULARY * HIDDEN // width * 2,
        "activationSize": 2 * sbh * 2,
        "optimalLatencyFw": round(embed_fw + reduce, 6),
        "optimalLatencyBw": round(2 * embed_fw + reduce, 6),
        "isTensorParallelized": width > 1,
    }
    activation = sbh * (10 + 24 / width + 5 * HEADS * SEQUENCE / (HIDDEN * width))
    return [embedding] + [
        {
            "id": block,
            "parameterSize": 12 * HIDDEN**2 // width * 2,
            "activationSize": int(activation),
            "optimalLatencyFw": round(block_fw + 2 * reduce, 6),
            "optimalLatencyBw": round(2 * block_fw + 2 * reduce, 6),
            "isTensorParallelized": width > 1,
        }
        for block in range(blocks)
    ]


def chain_document(blocks: int, widths: tuple[int, ...], memory: float, recompute: bool) -> dict:
    """The original program's input for a chain embedding -> block 0 -> ... -> block blocks-1."""
    edges = [
        {"sourceId": source, "destId": source + 1, "communicationCost": SEQUENCE * MICRO_BATCH * HIDDEN * 2}
        for source in range(-1, blocks - 1)
    ]
    return {
        "maxMemoryPerDevice": memory,
        "maxDevices": 1024,
        "bandwidth": LINK_BYTES_PER_SECOND,
        "mbsInBatch": 4096 / MICRO_BATCH,
        "nodes": {str(width): layer_nodes(blocks, width) for width in widths},
        "edges": {str(width): edges for width in widths},
        "activationRecomputation": recompute,
        "optimizerAlgorithm": "SGD",
        "fixedPP": 32,
        "fixedTMPC": 4,
        "fixedDP": 8,
        "numTransformerLayers": blocks,
    }


def cpu_seconds(document: dict, repeats: int, sync_cost: str) -> tuple[float, dict]:
    """Median CPU seconds of `solve_document` and its output."""
    times = []
    for _ in range(repeats):
        start = time.process_time()
        output = solve_document(document, sync_cost)
        times.append(time.process_time() - start)
    return statistics.median(times), output


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sync-cost", choices=SYNC_COSTS, default="first_stage")
    args = parser.parse_args()
    print(f"{'memory':>12} {'recompute':>9} {'CPU s':>7}  result (t, d, p, time per batch [ms])")
    for memory_name, memory in (("32 GiB", 32 * GIB), ("never binds", 1e30)):
        for recompute in (False, True):
            document = chain_document(96, (1, 2, 4, 8), memory, recompute)
            seconds, out = cpu_seconds(document, args.repeats, args.sync_cost)
            if out["stages"]:
                summary = f"t={out['tensorParallelDegree']} d={out['dataParallelDegree']} p={len(out['stages'])} "
                summary += f"{out['finalTimePerBatch']:.2f}"
            else:
                summary = "no width fits in memory"
            print(f"{memory_name:>12} {str(recompute):>9} {seconds:7.3f}  {summary}")


if __name__ == "__main__":
    main()
