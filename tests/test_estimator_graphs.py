"""Hand-built op graphs for the estimator tests (a Megatron-style GPT model, shard of width t),
and checks that they are what they claim to be."""

from __future__ import annotations

import math

import pytest

from graph_extract.opgraph import GemmDims, OpGraph, OpNode


class GraphBuilder:
    """Appends OpNodes in program order; `inputs` are the ids of the producing nodes."""

    def __init__(self) -> None:
        self.nodes: list[OpNode] = []
        self.edges: list[tuple[int, int]] = []

    def add(self, kind: str, op: str, layer: int, inputs: tuple[int, ...], out: tuple[int, ...],
            input_shapes: tuple[tuple[int, ...], ...] | None = None, weights: tuple[tuple[int, ...], ...] = (),
            gemm: GemmDims | None = None, **attrs: object) -> int:
        node_id = len(self.nodes)
        shapes = input_shapes if input_shapes is not None else tuple(self.nodes[i].output_shape for i in inputs)
        self.nodes.append(OpNode(node_id, kind, op, layer, f"{op}_{node_id}", f"layer{layer}", shapes, (out,),
                                 weights, gemm=gemm, attrs=tuple(sorted(attrs.items()))))
        self.edges.extend((i, node_id) for i in inputs)
        return node_id

    def linear(self, layer: int, x: int, n_out: int, bias: bool = True) -> int:
        shape = self.nodes[x].output_shape
        rows, k = math.prod(shape[:-1]), shape[-1]
        weights = ((n_out, k), (n_out,)) if bias else ((n_out, k),)
        return self.add("gemm", "linear", layer, (x,), shape[:-1] + (n_out,), weights=weights,
                        gemm=GemmDims(1, rows, k, n_out))

    def graph(self, width: int) -> OpGraph:
        return OpGraph(tuple(self.nodes), tuple(self.edges), width)


def gpt_block(g: GraphBuilder, layer: int, x: int, s: int, b: int, h: int, heads: int, t: int) -> int:
    """One pre-LN GPT block (Megatron tensor parallelism of width t); returns its output node."""
    d, hp = h // heads, heads // t
    ln1 = g.add("norm", "layernorm", layer, (x,), (s, b, h), weights=((h,), (h,)))
    copy1 = g.add("allreduce", "allreduce", layer, (ln1,), (s, b, h), direction="backward", group_size=t, reduce_op="sum")
    qkv = g.linear(layer, copy1, 3 * h // t)
    heads_view = g.add("shape", "view", layer, (qkv,), (s, b, hp, 3 * d))
    q = g.add("shape", "getitem", layer, (heads_view,), (s, b, hp, d))
    k = g.add("shape", "getitem", layer, (heads_view,), (s, b, hp, d))
    v = g.add("shape", "getitem", layer, (heads_view,), (s, b, hp, d))
    kt = g.add("shape", "permute", layer, (k,), (b, hp, d, s))
    scores = g.add("bmm", "matmul", layer, (q, kt), (b, hp, s, s), gemm=GemmDims(b * hp, s, d, s))
    scaled = g.add("elementwise", "div", layer, (scores,), (b, hp, s, s))
    masked = g.add("elementwise", "masked_fill", layer, (scaled,), (b, hp, s, s),
                   input_shapes=((b, hp, s, s), (1, 1, s, s)))
    probs = g.add("softmax", "softmax", layer, (masked,), (b, hp, s, s), dim=-1)
    dropped = g.add("elementwise", "dropout", layer, (probs,), (b, hp, s, s), p=0.1)
    context = g.add("bmm", "matmul", layer, (dropped, v), (b, hp, s, d), gemm=GemmDims(b * hp, s, s, d))
    merged = g.add("shape", "view", layer, (context,), (s, b, h // t))
    proj = g.linear(layer, merged, h, bias=False)
    reduced = g.add("allreduce", "allreduce", layer, (proj,), (s, b, h), direction="forward", group_size=t, reduce_op="sum")
    drop1 = g.add("elementwise", "dropout", layer, (reduced,), (s, b, h), p=0.1)
    res1 = g.add("elementwise", "add", layer, (drop1, x), (s, b, h))
    ln2 = g.add("norm", "layernorm", layer, (res1,), (s, b, h), weights=((h,), (h,)))
    copy2 = g.add("allreduce", "allreduce", layer, (ln2,), (s, b, h), direction="backward", group_size=t, reduce_op="sum")
    fc1 = g.linear(layer, copy2, 4 * h // t)
    act = g.add("elementwise", "gelu", layer, (fc1,), (s, b, 4 * h // t))
    fc2 = g.linear(layer, act, h, bias=False)
    reduced2 = g.add("allreduce", "allreduce", layer, (fc2,), (s, b, h), direction="forward", group_size=t, reduce_op="sum")
    drop2 = g.add("elementwise", "dropout", layer, (reduced2,), (s, b, h), p=0.1)
    return g.add("elementwise", "add", layer, (drop2, res1), (s, b, h))


def gpt_graph(layers: int = 2, s: int = 256, b: int = 2, h: int = 512, heads: int = 8, t: int = 1,
              vocab: int = 1024) -> OpGraph:
    """Embedding (layer 0), `layers` blocks (1..layers) and the LM head (layers + 1)."""
    g = GraphBuilder()
    tokens = g.add("embedding", "embedding", 0, (), (s, b, h), input_shapes=((b, s),), weights=((vocab // t, h),))
    x = g.add("elementwise", "dropout", 0, (tokens,), (s, b, h), p=0.1)
    for layer in range(1, layers + 1):
        x = gpt_block(g, layer, x, s, b, h, heads, t)
    head = layers + 1
    norm = g.add("norm", "layernorm", head, (x,), (s, b, h), weights=((h,), (h,)))
    copy = g.add("allreduce", "allreduce", head, (norm,), (s, b, h), direction="backward", group_size=t, reduce_op="sum")
    g.linear(head, copy, vocab // t, bias=False)
    return g.graph(t)


#: Fused operators of a block, as offsets of their members from the block's first node.
BLOCK_FUSION = [(0,), (1,), (2,), (8, 9, 10), (11,), (12,), (13,), (15,), (16,), (17,), (18,), (19,), (20,),
                (21, 22), (23,), (24,), (25,), (26,)]


@pytest.mark.parametrize("t", [1, 2, 4])
def test_block_flops_match_the_transformer_formula(t):
    s, b, h, heads = 256, 2, 512, 8
    graph = gpt_graph(layers=1, s=s, b=b, h=h, heads=heads, t=t)
    block = [node for node in graph.nodes if node.layer == 1]
    # 24·b·s·h² + 4·b·s²·h FLOPs per block, split evenly across t shards
    assert sum(node.flops for node in block) * t == 24 * b * s * h * h + 4 * b * s * s * h


def test_block_layout_matches_the_fusion_table():
    graph = gpt_graph(layers=1)
    first = next(node.id for node in graph.nodes if node.layer == 1)
    ops = [graph.nodes[first + offset].op for offset, *_ in BLOCK_FUSION]
    assert ops == ["layernorm", "allreduce", "linear", "matmul", "softmax", "dropout", "matmul", "linear",
                   "allreduce", "dropout", "add", "layernorm", "allreduce", "linear", "linear", "allreduce",
                   "dropout", "add"]
