"""A fused attention kernel (FlashAttention: Dao et al. 2022, "FlashAttention: Fast and Memory-Efficient
Exact Attention with IO-Awareness"; Dao 2023, FlashAttention-2) as the cost paths see it, derived from
an attention core of the op graph (`graph_extract.regions.attention_cores`).

The kernel reads Q, K and V, writes the output O and one log-sum-exp per softmax row (fp32); the
s × s scores never leave the chip. Forward it runs the core's two products (QKᵀ, then ·V) tile by
tile; backward it recomputes the scores from Q, K and the log-sum-exp and runs the four gradient
products: 2.5 times the forward's products. With a causal mask the tiles wholly above the diagonal
are skipped (`causal_fraction`). Grouped-query attention: K and V are read once per key/value head
(the kernel broadcasts them to their query heads), so each input is the smallest tensor on the chain
of views and copies that feeds the core (the key/value heads before `repeat_kv`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

from graph_extract.opgraph import OpGraph
from graph_extract.regions import attention_cores

#: Query and key rows per tile of the fused kernel (FlashAttention-2's forward blocks on A100 and H100).
TILE = 128
#: Bytes of a log-sum-exp (fp32).
STATISTIC_BYTES = 4


def causal_fraction(queries: int, keys: int, tile: int = TILE) -> float:
    """The fraction of (query tile, key tile) pairs a causal kernel computes: those on or below the
    diagonal, nb(nb + 1)/2 of nb² for nb tiles of a square score matrix."""
    query_tiles, key_tiles = math.ceil(queries / tile), math.ceil(keys / tile)
    computed = sum(min(key_tiles, math.ceil((row + 1) * tile * keys / queries / tile)) for row in range(query_tiles))
    return computed / (query_tiles * key_tiles)


@dataclass(frozen=True)
class AttentionKernel:
    """One attention core run as a fused kernel.

    `members`: the core's operators; `products`: its two products (scores, context), whose forward
    multiply-accumulates the kernel runs; `inputs`: (the operator that feeds the core, bytes) of Q, K
    and V as the kernel reads them, of which `query_bytes` are Q's; `output_bytes`: O; `rows`: softmax rows (batch × heads × queries); `causal`: whether
    a causal mask drops the tiles above the diagonal.
    """

    layer: int
    members: frozenset[int]
    products: tuple[int, int]
    inputs: tuple[tuple[int, int], ...]
    query_bytes: int
    output_bytes: int
    rows: int
    queries: int
    keys: int
    causal: bool

    @cached_property
    def fraction(self) -> float:
        """The share of the score tiles computed (1 without a causal mask)."""
        return causal_fraction(self.queries, self.keys) if self.causal else 1.0

    @property
    def statistics_bytes(self) -> int:
        """The log-sum-exp of every softmax row, kept for the backward pass."""
        return self.rows * STATISTIC_BYTES

    @property
    def input_bytes(self) -> int:
        return sum(size for _, size in self.inputs)

    @property
    def key_value_bytes(self) -> int:
        """K and V as the kernel reads them (once per pass over the keys)."""
        return self.input_bytes - self.query_bytes

    @property
    def forward_bytes(self) -> int:
        """HBM bytes of the forward kernel: Q, K, V read, O and the log-sum-exp written."""
        return self.input_bytes + self.output_bytes + self.statistics_bytes

    @property
    def saved_bytes(self) -> int:
        """What the backward pass needs besides O (which the next product keeps): Q, K, V and the
        log-sum-exp."""
        return self.input_bytes + self.statistics_bytes


def _kernel_input_bytes(graph: OpGraph, consumer: int, position: int) -> int:
    """Bytes of the tensor a core operator reads at `position`, as the fused kernel reads it: the
    smallest tensor on the chain of views and copies that makes it (before a broadcast such as
    repeat_kv; after the slice of a fused QKV product); a concatenation is read as made (MLA's key:
    each head's plain part and the shared rotated part)."""
    node = graph.nodes[consumer]
    source = node.inputs[position]
    smallest = math.prod(node.input_shapes[position]) * graph.nodes[source].dtype_bytes
    while (graph.nodes[source].kind == "shape" and graph.nodes[source].op != "cat"  # a join: read as joined
           and graph.nodes[source].inputs and graph.nodes[source].inputs[0] is not None):
        shape_node = graph.nodes[source]
        source = shape_node.inputs[0]
        smallest = min(smallest, math.prod(shape_node.input_shapes[0]) * graph.nodes[source].dtype_bytes)
    return smallest


def attention_kernels(graph: OpGraph) -> tuple[AttentionKernel, ...]:
    """The fused kernel of every attention core of `graph`, in program order."""
    kernels = []
    for members in attention_cores(graph):
        products = tuple(sorted(node for node in members if graph.nodes[node].kind == "bmm"))
        first, second = products[0], products[-1]
        inputs: dict[int, int] = {}
        for member in sorted(members):
            node = graph.nodes[member]
            for position, source in enumerate(node.inputs or ()):
                if source is not None and source not in members:
                    inputs[source] = _kernel_input_bytes(graph, member, position)
        scores = graph.nodes[first].gemm
        softmax = [graph.nodes[node] for node in members if graph.nodes[node].kind == "softmax"]
        rows = (math.prod(softmax[0].output_shape) // softmax[0].output_shape[-1] if softmax
                else scores.batch * scores.m)
        causal = any(graph.nodes[node].op == "masked_fill" for node in members)
        kernels.append(AttentionKernel(graph.nodes[first].layer, members, (first, second), tuple(sorted(inputs.items())),
                                       _kernel_input_bytes(graph, first, 0), graph.nodes[second].output_bytes, rows,
                                       scores.m, scores.n, causal))
    return tuple(sorted(kernels, key=lambda kernel: kernel.products))
