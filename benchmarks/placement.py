"""CPU time of the placement search on GPT-like chains of 96 blocks, widths 1, 2, 4, 8, 1,024 devices.

1. The original's model (`system=original`, its JSON interface): a 97-layer chain of an embedding
   and 96 GPT-3-6.7B-like blocks (h=4096, 32 heads, sequence 2048, micro-batch 8, vocabulary 50257,
   100 TFLOP/s, 4 GiB/s, the original program's benchmark case), 512 micro-batches; 32 GiB per
   device or memory that never binds, recomputation off or on.
2. The training-step model (the default): GPT-3 175B (h=12288, 96 heads, sequence 2048,
   micro-batch 1, vocabulary 51200, 1,536 samples per batch) as embedding + 96 blocks + head,
   compute at 40 % of 312 TFLOP/s, Korthikanti's activations, Megatron's collectives, on
   `dgx_a100` and `tpuv4_pod`, 80 GiB or memory that never binds; all three recomputation modes,
   every width, degree, depth, partition and interleaved layout (what one accelerator's
   evaluation runs per HBM size).
Each case runs a few times and prints the median CPU seconds.
Run from the repository root: python -m benchmarks.placement [--repeats N]
"""

from __future__ import annotations

import argparse
import statistics
import time

from graph_extract import KernelOptions
from phaze_hardware import Cluster, Group, cluster
from solver.layout import Layout
from solver.placement.best import best_placement
from solver.placement.jsonio import solve_document
from solver.training_step import RECOMPUTE_MODES, Device, StepGraph, StepLayer, TrainingOptions, TrainingStep

GIB = 1024**3
HIDDEN, HEADS, SEQUENCE, MICRO_BATCH, VOCABULARY = 4096, 32, 2048, 8, 50257
FLOPS_PER_SECOND, LINK_BYTES_PER_SECOND = 100e12, 4 * GIB


def allreduce_ms(width: int, tokens_hidden: int) -> float:
    """One Megatron all-reduce of the activations over `width` devices on the flat link, in ms."""
    link = Cluster.build("original", width, 1, [dict(bandwidth=LINK_BYTES_PER_SECOND)])
    return link.all_reduce(Group(width, 1)).scalar(tokens_hidden * 2) * 1000


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


def gpt3(width: int) -> StepGraph:
    """GPT-3 175B at tensor width `width`: embedding, 96 blocks, head (see the module docstring)."""
    h, s, a, v, flops = 12288, 2048, 96, 51200, 0.4 * 312e12
    sbh = s * h
    block = 24 * s * h * h * (1 + s / (6 * h)) / flops / width
    head = 2 * s * h * v / flops / width
    tensor = (2 * sbh,) if width > 1 else ()
    embedding = StepLayer(id=0, forward=1e-4, backward=2e-4, attention_core_forward=0.0, parameters=v * h / width,
                          activation_bytes=sbh, replicated_activation_bytes=sbh, forward_collective_bytes=tensor)
    saved = sbh * (10 + 24 / width) + 5 * a * s * s / width  # Korthikanti et al., bytes per block
    blocks = [StepLayer(id=i, forward=block, backward=2 * block, attention_core_forward=0.06 * block,
                        parameters=12 * h * h / width, activation_bytes=saved, replicated_activation_bytes=10 * sbh,
                        attention_core_activation_bytes=5 * a * s * s / width, input_bytes=2 * sbh,
                        replicated_input_bytes=2 * sbh, is_block=True, forward_collective_bytes=tensor * 2,
                        backward_collective_bytes=tensor * 2)
              for i in range(1, 97)]
    final = StepLayer(id=97, forward=head, backward=2 * head, attention_core_forward=0.0, parameters=v * h / width,
                      activation_bytes=4 * sbh + 2 * s * v / width, replicated_activation_bytes=4 * sbh,
                      attention_core_activation_bytes=0.0, input_bytes=2 * sbh, replicated_input_bytes=2 * sbh,
                      is_block=False, forward_collective_bytes=(), backward_collective_bytes=tensor)
    layers = (embedding, *blocks, final)
    return StepGraph(width, layers, tuple((i, i + 1, 2.0 * sbh) for i in range(len(layers) - 1)))


def cpu_seconds(function, repeats: int):
    """Median CPU seconds of `function()` and its result."""
    times = []
    for _ in range(repeats):
        start = time.process_time()
        result = function()
        times.append(time.process_time() - start)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print("1. the original's model (JSON interface), 97-layer chain")
    print(f"{'memory':>12} {'recompute':>9} {'CPU s':>7}  result (t, d, p, time per batch [ms])")
    for memory_name, memory in (("32 GiB", 32 * GIB), ("never binds", 1e30)):
        for recompute in (False, True):
            document = chain_document(96, (1, 2, 4, 8), memory, recompute)
            seconds, out = cpu_seconds(lambda: solve_document(document), args.repeats)
            if out["stages"]:
                summary = f"t={out['tensorParallelDegree']} d={out['dataParallelDegree']} p={len(out['stages'])} "
                summary += f"{out['finalTimePerBatch']:.2f}"
            else:
                summary = "no width fits in memory"
            print(f"{memory_name:>12} {str(recompute):>9} {seconds:7.3f}  {summary}")
    print("\n2. the training-step model, GPT-3 175B (98 layers), every recomputation mode")
    print(f"{'system':>10} {'memory':>12} {'CPU s':>7}  per mode: recompute t d p v time per batch [s] (CPU s)")
    graphs = {width: gpt3(width) for width in (1, 2, 4, 8)}
    for system in ("dgx_a100", "tpuv4_pod"):
        for memory_name, memory in (("80 GiB", 80 * GIB), ("never binds", 1e30)):
            device, total, lines = Device(memory, 2.039e12), 0.0, []
            for mode in RECOMPUTE_MODES:
                steps = [TrainingStep(graph, cluster(system, 1024), TrainingOptions(), KernelOptions(), device, 1536,
                                      mode, Layout(width))
                         for width, graph in sorted(graphs.items())]
                seconds, result = cpu_seconds(lambda: best_placement(steps), args.repeats)
                total += seconds
                lines.append(f"{mode} {result.layout.text()} {result.time_per_batch:.3f} ({seconds:.2f})")
            print(f"{system:>10} {memory_name:>12} {total:7.3f}  " + "; ".join(lines))


if __name__ == "__main__":
    main()
