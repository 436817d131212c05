"""Operator cuts (`graph_extract.operator_cuts`): the least bottleneck, then the fewest crossing bytes,
checked against brute force over every valid grouping of small graphs and the linear-partition
dynamic programme on chains, and the layer graph of the groups found."""

from __future__ import annotations

import random

import pytest

from graph_extract.layergraph import build_layer_graph
from graph_extract.opgraph import GemmDims, OpGraph, OpNode
from graph_extract.operator_cuts import cut_operators, with_groups_as_layers
from phaze_common.checks import InputError


def _graph(sizes: list[int], edges: list[tuple[int, int]], kinds: dict[int, str] | None = None) -> OpGraph:
    """Operator i outputs sizes[i] bytes (one byte an element); each reads its producers' tensors and,
    operator 0, a weight (so no tensor is built from the model's inputs alone)."""
    kinds = kinds or {}
    nodes = []
    for i, size in enumerate(sizes):
        inputs = tuple(source for source, dest in edges if dest == i)
        nodes.append(OpNode(i, kinds.get(i, "elementwise"), "view" if kinds.get(i) == "shape" else "mul", 0,
                            f"op{i}", f"net.op{i}", tuple((sizes[s],) for s in inputs), ((size,),),
                            weight_shapes=((4,),), weight_names=(f"w{i}",), inputs=inputs, dtype_bytes=1))
    return OpGraph(tuple(nodes), tuple(edges), 1)


def _brute_force(n, edges, seconds, sizes, seconds_per_byte, count, together=()):
    """(bottleneck, crossing bytes, groups) of every valid grouping, best first: each operator in a
    group no earlier than its producers', every group used, the pairs `together` in one group. A
    group's load is its seconds plus seconds_per_byte x the bytes of each tensor made in an earlier
    group that one of its operators reads (once per tensor)."""
    producers = [[a for a, b in edges if b == v] for v in range(n)]
    readers = [sorted({b for a, b in edges if a == u}) for u in range(n)]
    found = []

    def extend(groups):
        v = len(groups)
        if v == n:
            if set(groups) != set(range(count)) or any(groups[a] != groups[b] for a, b in together):
                return
            loads, crossing = [0.0] * count, 0
            for u in range(n):
                loads[groups[u]] += seconds[u]
                for k in {groups[w] for w in readers[u]} - {groups[u]}:
                    loads[k] += seconds_per_byte * sizes[u]
                    crossing += sizes[u]
            found.append((max(loads), crossing, tuple(groups)))
            return
        for k in range(max((groups[u] for u in producers[v]), default=0), count):
            extend(groups + [k])

    extend([])
    return sorted(found)


def _assert_optimal(cuts, candidates):
    bottleneck, crossing = candidates[0][:2]
    assert cuts.bottleneck_seconds == pytest.approx(bottleneck, rel=1e-9)
    assert cuts.crossing_bytes == crossing
    best = {groups for value, size, groups in candidates if value == pytest.approx(bottleneck, rel=1e-9)
            and size == crossing}
    assert cuts.groups in best
    assert cuts.optimal and cuts.lower_bound_seconds <= cuts.bottleneck_seconds + 1e-9
    assert cuts.gap == pytest.approx(0.0, abs=1e-6)


# 0 -> 1 forks to 2 and 3; 3 -> 4 -> 5; 2 and 5 join at 6; 6 -> 7
FORK_JOIN_EDGES = [(0, 1), (1, 2), (1, 3), (2, 6), (3, 4), (4, 5), (5, 6), (6, 7)]
FORK_JOIN_SECONDS = [4.0, 2.0, 3.0, 3.0, 2.0, 4.0, 2.0, 4.0]
FORK_JOIN_BYTES = [1, 2, 1, 1, 1, 1, 1, 1]


def test_a_fork_and_a_join_in_four_groups():
    """By hand, the groups {0, 1}, {2, 3}, {4, 5}, {6, 7} at one second per byte load
    4 + 2 = 6; 3 + 3 + 2 (op 1's tensor, read by 2 and 3, enters once) = 8; 2 + 4 + 1 (op 3's) = 7;
    2 + 4 + 1 (op 2's) + 1 (op 5's) = 8: bottleneck 8 s, crossing bytes 2 + 1 + 1 + 1 = 5. (Counted
    per reader, op 1's tensor would make the second group 10.) Brute force: no valid grouping does
    better, and this is the only one at 8 s."""
    graph = _graph(FORK_JOIN_BYTES, FORK_JOIN_EDGES)
    cuts = cut_operators(graph, 4, seconds_per_byte=1.0, operator_seconds=FORK_JOIN_SECONDS)
    candidates = _brute_force(8, FORK_JOIN_EDGES, FORK_JOIN_SECONDS, FORK_JOIN_BYTES, 1.0, 4)
    assert candidates[0] == (8.0, 5, (0, 0, 1, 1, 2, 2, 3, 3)) and candidates[1][0] > 8.0
    assert cuts.groups == (0, 0, 1, 1, 2, 2, 3, 3)
    assert cuts.group_seconds == (6.0, 8.0, 7.0, 8.0)
    assert (cuts.bottleneck_seconds, cuts.crossing_bytes, cuts.method) == (8.0, 5, "cp-sat")
    _assert_optimal(cuts, candidates)


def _random_dag(rng: random.Random, n: int) -> list[tuple[int, int]]:
    edges = []
    for dest in range(1, n):
        sources = rng.sample(range(dest), rng.randint(0 if dest > 2 else 1, min(dest, 3)))
        edges.extend((source, dest) for source in sorted(sources))
    return edges


@pytest.mark.parametrize("seed", range(12))
def test_random_small_dags_match_brute_force(seed):
    rng = random.Random(seed)
    n = rng.randint(5, 9)
    count = rng.randint(2, min(4, n))
    edges = _random_dag(rng, n)
    seconds = [float(rng.randint(1, 9)) for _ in range(n)]
    sizes = [rng.randint(1, 6) for _ in range(n)]
    seconds_per_byte = rng.choice([0.5, 1.0, 2.0])
    cuts = cut_operators(_graph(sizes, edges), count, seconds_per_byte=seconds_per_byte, operator_seconds=seconds)
    _assert_optimal(cuts, _brute_force(n, edges, seconds, sizes, seconds_per_byte, count))


def _linear_partition(seconds, sizes, seconds_per_byte, count):
    """The classic linear-partition programme: best[k][m] = the least bottleneck of the first m
    operators of a chain in k groups = min over the last group's first operator j of
    max(best[k-1][j], seconds[j..m-1] + seconds_per_byte x sizes[j-1])."""
    n = len(seconds)
    best = [[float("inf")] * (n + 1) for _ in range(count + 1)]
    best[0][0] = 0.0
    for k in range(1, count + 1):
        for m in range(k, n + 1):
            for j in range(k - 1, m):
                last = sum(seconds[j:m]) + (seconds_per_byte * sizes[j - 1] if j else 0.0)
                best[k][m] = min(best[k][m], max(best[k - 1][j], last))
    return best[count][n]


@pytest.mark.parametrize("seed", range(4))
def test_a_chain_is_the_linear_partition(seed):
    """A chain of 14 operators: the bottleneck is the linear partition's; among the cut positions
    reaching it (every choice of count - 1 of the 13 gaps), the crossing bytes are the fewest."""
    rng = random.Random(100 + seed)
    n, count = 14, rng.choice([3, 4, 5])
    seconds = [float(rng.randint(1, 20)) for _ in range(n)]
    sizes = [rng.randint(1, 8) for _ in range(n)]
    edges = [(i, i + 1) for i in range(n - 1)]
    cuts = cut_operators(_graph(sizes, edges), count, seconds_per_byte=0.5, operator_seconds=seconds)
    bottleneck = _linear_partition(seconds, sizes, 0.5, count)
    assert cuts.method == "consecutive" and cuts.optimal
    assert cuts.bottleneck_seconds == pytest.approx(bottleneck, rel=1e-12)
    candidates = _brute_force(n, edges, seconds, sizes, 0.5, count)
    assert candidates[0][0] == pytest.approx(bottleneck, rel=1e-12)
    _assert_optimal(cuts, candidates)


def test_operators_that_cost_nothing_follow_their_producer():
    """Costs from FLOPs (2 x macs / 1e3 FLOP/s): ops 0, 2, 4 and 5 are products of 500, 1000, 1500
    and 500 multiply-accumulates (1, 2, 3, 1 s); 1 and 3 are views (no FLOPs) of 0's and 2's
    outputs and join their units; 4 reads 1 and 3 (two producers) and 5 reads 4. Four units, so
    count 4 is each unit its own group and count 5 is refused; the result is the best of the
    brute force over groupings with each view in its producer's group."""
    sizes = [3, 3, 2, 2, 1, 1]
    edges = [(0, 1), (1, 2), (2, 3), (1, 4), (3, 4), (4, 5)]
    macs = {0: 500, 2: 1000, 4: 1500, 5: 500}
    graph = _graph(sizes, edges, {1: "shape", 3: "shape"})
    nodes = tuple(OpNode(node.id, "gemm", "linear", 0, node.name, node.module_path, node.input_shapes,
                         node.output_shapes, node.weight_shapes, node.weight_names, node.inputs, 1,
                         GemmDims(1, 1, 1, macs[node.id])) if node.id in macs else node for node in graph.nodes)
    graph = OpGraph(nodes, graph.edges, 1)
    seconds = [2 * macs.get(i, 0) / 1e3 for i in range(6)]
    for count in (2, 3, 4):
        cuts = cut_operators(graph, count, seconds_per_byte=0.25, flops_per_second=1e3)
        assert cuts.units == 4 and cuts.groups[1] == cuts.groups[0] and cuts.groups[3] == cuts.groups[2]
        _assert_optimal(cuts, _brute_force(6, edges, seconds, sizes, 0.25, count, together=((0, 1), (2, 3))))
    with pytest.raises(InputError, match=r"^count: must be an integer in \[1, 4\]"):
        cut_operators(graph, 5, seconds_per_byte=0.25, flops_per_second=1e3)


def test_chains_joined_up_to_chain_seconds():
    """The fork-and-join graph with chain_seconds 5: 3 -> 4 is a chain (4 reads only 3, 3 feeds only
    4) costing 3 + 2 = 5 <= 5 and joins; adding 5 (4 more seconds) would pass 5; 0 -> 1 (6 s) and
    6 -> 7 (6 s) cost more; 6 reads two units. Seven units; the result is the best grouping with 3
    and 4 together (brute force), no better than the unjoined optimum of 8 s."""
    graph = _graph(FORK_JOIN_BYTES, FORK_JOIN_EDGES)
    cuts = cut_operators(graph, 4, seconds_per_byte=1.0, operator_seconds=FORK_JOIN_SECONDS, chain_seconds=5.0)
    assert cuts.units == 7 and cuts.groups[3] == cuts.groups[4]
    candidates = _brute_force(8, FORK_JOIN_EDGES, FORK_JOIN_SECONDS, FORK_JOIN_BYTES, 1.0, 4, together=((3, 4),))
    _assert_optimal(cuts, candidates)
    assert cuts.bottleneck_seconds > 8.0


@pytest.mark.parametrize("count", [0, -1, 9, True, 2.0])
def test_a_count_outside_one_to_the_units_is_refused(count):
    graph = _graph(FORK_JOIN_BYTES, FORK_JOIN_EDGES)
    with pytest.raises(InputError) as raised:
        cut_operators(graph, count, seconds_per_byte=1.0, operator_seconds=FORK_JOIN_SECONDS)
    message = str(raised.value)
    assert "\n" not in message and message.startswith("count: must be an integer in [1, 8]")


def test_the_groups_make_a_layer_graph():
    """The fork-and-join graph's groups {0, 1}, {2, 3}, {4, 5}, {6, 7} as layers: layer edges carry
    op 1's 2 bytes 0 -> 1, op 3's 1 byte 1 -> 2, op 2's 1 byte 1 -> 3 and op 5's 1 byte 2 -> 3 (the
    crossing bytes, 5, in all); each layer holds two operators' 4-element weights (2 x 4 x 2 bytes
    an element = 16 bytes) and its input bytes are what enters it: 0, 2, 1, 1 + 1."""
    graph = _graph(FORK_JOIN_BYTES, FORK_JOIN_EDGES)
    cuts = cut_operators(graph, 4, seconds_per_byte=1.0, operator_seconds=FORK_JOIN_SECONDS)
    layers = build_layer_graph(with_groups_as_layers(graph, cuts))
    assert [layer.id for layer in layers.layers] == [0, 1, 2, 3]
    assert sorted((edge.source, edge.dest, edge.bytes) for edge in layers.edges) == [
        (0, 1, 2), (1, 2, 1), (1, 3, 1), (2, 3, 1)]
    assert sum(edge.bytes for edge in layers.edges) == cuts.crossing_bytes
    assert [layer.parameter_bytes for layer in layers.layers] == [16, 16, 16, 16]
    assert [layer.input_bytes for layer in layers.layers] == [0, 2, 1, 2]
