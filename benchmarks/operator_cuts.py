"""Wall time of operator cuts (`graph_extract.operator_cuts`) on branching graphs of about 300
operators, into 4 and 8 groups, on one CP-SAT worker.

1. A U-shaped network: an encoder of 4 levels (2 attention-and-MLP blocks each, the tokens divided by
   4 and the width doubled from one level to the next), 4 blocks at the bottom and a decoder that
   mirrors the encoder, each of its levels joining the encoder's output of that level (a skip
   connection). A block forks into its query, key and value products and joins at its two residual
   additions. Costs: a roofline of each operator (its FLOPs at 100 TFLOP/s or its bytes read and
   written at 2 TB/s, the greater), so only the views cost nothing; or its FLOPs alone (the default:
   only the products cost, and an operator costing nothing that reads one operator joins its unit).
   A 25 GB/s link between groups.
2. A stress case: 300 operators each reading 1 to 3 of the 10 before it (random), every operator
   costing 0.5 to 2 s and every tensor 0.01 to 0.3 s on the link: no grouping without much crossing,
   the bottleneck's proof is hard and the time limit (10 s) ends the search; the gap is printed.
Run from the repository root: python -m benchmarks.operator_cuts
"""

from __future__ import annotations

import random
import time

from graph_extract.opgraph import GemmDims, OpGraph, OpNode
from graph_extract.operator_cuts import cut_operators

FLOPS_PER_SECOND, MEMORY_BYTES_PER_SECOND, LINK_BYTES_PER_SECOND = 100e12, 2e12, 25e9
TOKENS, WIDTH, LEVELS, BOTTOM_BLOCKS = 4096, 256, 4, 4


class _Builder:
    """Appends operators in program order; a tensor is (tokens, width) of 2-byte elements."""

    def __init__(self) -> None:
        self.nodes: list[OpNode] = []
        self.edges: list[tuple[int, int]] = []

    def add(self, kind: str, op: str, inputs: tuple[int, ...], shape: tuple[int, ...],
            weight: tuple[int, int] | None = None, gemm: GemmDims | None = None) -> int:
        node_id = len(self.nodes)
        in_shapes = tuple(self.nodes[i].output_shape for i in inputs)
        weights = (weight,) if weight else ()
        self.nodes.append(OpNode(node_id, kind, op, 0, f"{op}{node_id}", f"unet.op{node_id}", in_shapes, (shape,),
                                 weights, tuple(f"w{node_id}" for _ in weights), inputs, gemm=gemm))
        self.edges.extend((i, node_id) for i in sorted(set(inputs)))
        return node_id

    def linear(self, x: int, width: int) -> int:
        tokens, k = self.nodes[x].output_shape
        return self.add("gemm", "linear", (x,), (tokens, width), (width, k), GemmDims(1, tokens, k, width))

    def block(self, x: int) -> int:
        tokens, width = self.nodes[x].output_shape
        normed = self.add("norm", "layernorm", (x,), (tokens, width))
        q, k, v = (self.linear(normed, width) for _ in range(3))
        scores = self.add("bmm", "matmul", (q, k), (tokens, tokens), gemm=GemmDims(1, tokens, width, tokens))
        weights = self.add("softmax", "softmax", (scores,), (tokens, tokens))
        mixed = self.add("bmm", "matmul", (weights, v), (tokens, width), gemm=GemmDims(1, tokens, tokens, width))
        attended = self.add("elementwise", "add", (self.linear(mixed, width), x), (tokens, width))
        normed = self.add("norm", "layernorm", (attended,), (tokens, width))
        hidden = self.add("elementwise", "gelu", (self.linear(normed, 4 * width),), (tokens, 4 * width))
        return self.add("elementwise", "add", (self.linear(hidden, width), attended), (tokens, width))

    def resize(self, x: int, tokens: int, width: int) -> int:
        flat = self.add("shape", "view", (x,), (tokens, self.nodes[x].output_elements // tokens))
        return self.linear(flat, width)


def u_shaped() -> OpGraph:
    built = _Builder()
    x = built.add("embedding", "embedding", (), (TOKENS, WIDTH), (1000, WIDTH))
    skips = []
    for level in range(LEVELS):
        for _ in range(2):
            x = built.block(x)
        skips.append(x)
        x = built.resize(x, TOKENS // 4 ** (level + 1), WIDTH * 2 ** (level + 1))
    for _ in range(BOTTOM_BLOCKS):
        x = built.block(x)
    for level in reversed(range(LEVELS)):
        x = built.resize(x, TOKENS // 4**level, WIDTH * 2**level)
        x = built.add("elementwise", "add", (x, skips[level]), built.nodes[x].output_shape)
        for _ in range(2):
            x = built.block(x)
    return OpGraph(tuple(built.nodes), tuple(built.edges), 1)


def roofline_seconds(graph: OpGraph) -> list[float]:
    """Each operator's FLOPs at FLOPS_PER_SECOND or its bytes at MEMORY_BYTES_PER_SECOND, the greater;
    views cost nothing."""
    return [0.0 if node.kind == "shape" else max(node.flops / FLOPS_PER_SECOND, (
        node.input_elements + node.weight_elements + node.output_elements) * 2 / MEMORY_BYTES_PER_SECOND)
        for node in graph.nodes]


def random_window(n: int = 300, window: int = 10, seed: int = 0) -> tuple[OpGraph, list[float]]:
    rng = random.Random(seed)
    nodes, edges = [], []
    for i in range(n):
        sources = tuple(sorted(rng.sample(range(max(0, i - window), i), min(i, rng.randint(1, 3)))))
        size = rng.randint(100, 3000)
        nodes.append(OpNode(i, "elementwise", "add", 0, f"op{i}", f"net.op{i}", tuple((size,) for _ in sources),
                            ((size,),), inputs=sources, dtype_bytes=1))
        edges.extend((source, i) for source in sources)
    return OpGraph(tuple(nodes), tuple(edges), 1), [rng.uniform(0.5, 2.0) for _ in range(n)]


def report(name: str, graph: OpGraph, seconds_per_byte: float, seconds: list[float] | None, **keys) -> None:
    for count in (4, 8):
        start = time.perf_counter()
        cuts = cut_operators(graph, count, seconds_per_byte=seconds_per_byte, operator_seconds=seconds,
                             time_limit=10.0, **keys)
        wall = time.perf_counter() - start
        print(f"{name:>26} {len(graph.nodes):>9} {cuts.units:>5} {count:>6} {wall:7.2f} {cuts.method:>11} "
              f"{str(cuts.optimal):>7} {cuts.gap:8.2e} {cuts.bottleneck_seconds:12.4g} {cuts.crossing_bytes:>12,}")


def main() -> None:
    print(f"{'graph':>26} {'operators':>9} {'units':>5} {'groups':>6} {'wall s':>7} {'method':>11} "
          f"{'optimal':>7} {'gap':>8} {'bottleneck s':>12} {'crossing B':>12}")
    graph = u_shaped()
    report("U-shaped, roofline costs", graph, 1 / LINK_BYTES_PER_SECOND, roofline_seconds(graph))
    report("U-shaped, FLOP costs", graph, 1 / LINK_BYTES_PER_SECOND, None, flops_per_second=FLOPS_PER_SECOND)
    graph, seconds = random_window()
    report("random, window 10 (stress)", graph, 1e-4, seconds)


if __name__ == "__main__":
    main()
