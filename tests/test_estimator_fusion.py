"""Operator fusion on hand-built graphs: which operators merge, core types, kept precedence."""

from __future__ import annotations

from estimator import fuse_layers
from graph_extract.opgraph import GemmDims
from tests.test_estimator_graphs import BLOCK_FUSION, GraphBuilder, gpt_graph


def test_transformer_block_fuses_epilogues_only():
    graph = gpt_graph(layers=2)
    first = next(node.id for node in graph.nodes if node.layer == 2)
    (fused,) = fuse_layers(graph, (2,))
    assert [op.members for op in fused.ops] == [tuple(first + m for m in group) for group in BLOCK_FUSION]
    types = [op.core_type for op in fused.ops]
    assert types == ["VC", "collective", "TC", "TCandVC", "VC", "VC", "TC", "TC", "collective", "VC", "VC", "VC",
                     "collective", "TCandVC", "TC", "collective", "VC", "VC"]


def test_block_edges_keep_precedence_through_free_operators():
    graph = gpt_graph(layers=1)
    (fused,) = fuse_layers(graph, (1,))
    edges = set(fused.edges)
    # qkv (2) feeds the scores group (3) and, through the views of v, the context product (6)
    assert {(2, 3), (2, 6), (5, 6), (6, 7)} <= edges
    # the first residual add (10) feeds the second layernorm (11) and the final add (17)
    assert {(10, 11), (10, 17)} <= edges
    assert all(a < b for a, b in edges)
    assert len(edges) == 19


def test_embedding_is_free_and_dropped():
    graph = gpt_graph(layers=1)
    (fused,) = fuse_layers(graph, (0,))
    assert [(op.members, op.core_type) for op in fused.ops] == [((1,), "VC")]
    assert fused.edges == ()


def test_elementwise_chain_fuses_into_one_vector_operator():
    g = GraphBuilder()
    x = g.add("norm", "layernorm", 0, (), (64, 256), input_shapes=((64, 256),))
    a = g.add("elementwise", "add", 0, (x,), (64, 256))
    view = g.add("shape", "view", 0, (a,), (64, 16, 16))
    m = g.add("elementwise", "mul", 0, (view,), (64, 16, 16))
    s = g.add("reduction", "sum", 0, (m,), (64, 16), dim=-1)
    e = g.add("elementwise", "exp", 0, (s,), (64, 16))
    g.add("softmax", "softmax", 0, (e,), (64, 16), dim=-1)
    (fused,) = fuse_layers(g.graph(1), (0,))
    # the chain headed by the add absorbs mul (through the view), sum and exp; a softmax is never fused,
    # and the layernorm heads no chain
    assert [(op.members, op.core_type) for op in fused.ops] == [((0,), "VC"), ((1, 3, 4, 5), "VC"), ((6,), "VC")]
    assert fused.edges == ((0, 1), (1, 2))


def test_gemm_with_two_consumers_or_shared_successor_is_not_fused():
    g = GraphBuilder()
    x = g.add("norm", "layernorm", 0, (), (64, 128), input_shapes=((64, 128),))
    y = g.linear(0, x, 128)
    g.add("elementwise", "gelu", 0, (y,), (64, 128))
    g.add("elementwise", "tanh", 0, (y,), (64, 128))
    z = g.linear(0, x, 128)
    g.add("elementwise", "add", 0, (z, x), (64, 128))  # fed by the GEMM and by the layernorm
    (fused,) = fuse_layers(g.graph(1), (0,))
    assert [op.core_type for op in fused.ops] == ["VC", "TC", "VC", "VC", "TC", "VC"]


def test_epilogue_does_not_cross_layers():
    g = GraphBuilder()
    x = g.add("norm", "layernorm", 0, (), (64, 128), input_shapes=((64, 128),))
    y = g.add("gemm", "linear", 0, (x,), (64, 128), weights=((128, 128),), gemm=GemmDims(1, 64, 128, 128))
    g.add("elementwise", "gelu", 1, (y,), (64, 128))
    layer0, layer1 = fuse_layers(g.graph(1), (0, 1))
    assert [op.core_type for op in layer0.ops] == ["VC", "TC"]
    assert [op.members for op in layer1.ops] == [(2,)]


def test_a_graph_output_stops_fusion():
    g = GraphBuilder()
    y = g.add("gemm", "linear", 0, (), (64, 128), input_shapes=((64, 128),), weights=((128, 128),),
              gemm=GemmDims(1, 64, 128, 128))
    g.add("shape", "view", 0, (y,), (8, 8, 128))  # returned by the model
    g.add("elementwise", "relu", 0, (y,), (64, 128))
    (fused,) = fuse_layers(g.graph(1), (0,))
    assert [op.core_type for op in fused.ops] == ["TC", "VC"]
