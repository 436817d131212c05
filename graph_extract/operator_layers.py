"""Layers of a model without a list of repeated blocks: its operators cut into consecutive groups.

A user's module whose forward is a straight line or a branching graph of operators (a U-shaped MLP
with skip connections, two towers joined) has no transformer blocks to make layers of. Its op graph
is traced with every operator in one provisional layer; `graph_extract.operator_cuts` then puts the
operators in `count` groups (no edge goes back to an earlier group) with the least bottleneck of
work + entering bytes x seconds per byte, and each group is one layer of the layer graph, named
`operators.<k>` of kind "operators". Such layers are not transformer blocks: no recomputation
re-runs them (`Layer.is_block` is False), and Megatron's even split of blocks does not apply (the
placement search places them: `phaze run_solver`).

The costs are relative: only their ratio to the bytes' price decides the grouping. The constants
below are not part of the graph cache's key (`graph_extract.extraction.cache_path`): changing one
needs `graph_extract.serialize.FORMAT_VERSION` raised.
"""

from __future__ import annotations

import dataclasses

from graph_extract.layergraph import LayerGraph, build_layer_graph
from graph_extract.opgraph import TRAINING_DTYPE_BYTES, OpGraph
from graph_extract.operator_cuts import OperatorCuts, cut_operators, with_groups_as_layers
from graph_extract.operator_units import shrink

#: Operator groups (layers) asked for when the module has no block list (its num_layers; a
#: `model.overrides.num_layers` changes it), fewer when the operators shrink into fewer units. 16
#: layers allow pipelines of up to 16 stages and give a 4-stage pipeline four layers a stage to
#: balance with, while the downsets of a branching 16-layer graph stay within what the placement
#: search enumerates (`solver.placement.candidates.MAX_CANDIDATE_STAGES`).
OPERATOR_LAYERS = 16
#: Operator cost rate [FLOP/s]: an H100 SXM's dense BF16 tensor-core peak, 989 TFLOP/s (NVIDIA H100
#: datasheet), rounded; an operator costs its forward FLOPs at this rate.
OPERATOR_FLOPS_PER_SECOND = 1e15
#: Price of a byte entering a group [s/byte]: one direction of NVLink 4, 450 GB/s (NVIDIA H100
#: datasheet: 900 GB/s both directions), the link between neighbouring pipeline stages in a node.
OPERATOR_SECONDS_PER_BYTE = 1 / 450e9
#: CP-SAT's time limit [s] for a branching graph (`cut_operators`); on one worker it is deterministic.
OPERATOR_CUTS_SECONDS = 10.0
#: The kind of an operator group's layer (`graph_extract.layergraph.LAYER_KINDS`).
OPERATOR_KIND = "operators"


def operator_units(graph: OpGraph) -> int:
    """Units the operators of `graph` shrink into at the FLOP costs: the most groups there can be."""
    return shrink(graph, [node.flops / OPERATOR_FLOPS_PER_SECOND for node in graph.nodes]).count


def operator_cuts(graph: OpGraph, count: int) -> OperatorCuts:
    """`graph`'s operators in min(`count`, units) groups at the FLOP costs and NVLink's byte price."""
    return cut_operators(graph, min(count, operator_units(graph)), seconds_per_byte=OPERATOR_SECONDS_PER_BYTE,
                         flops_per_second=OPERATOR_FLOPS_PER_SECOND, time_limit=OPERATOR_CUTS_SECONDS)


def operator_layers(graph: OpGraph, count: int) -> tuple[OpGraph, LayerGraph]:
    """The op graph with each operator's layer its group (`operator_cuts`) and the layer graph of
    those groups, in group order (a topological order: no edge goes back), named `operators.<k>` of
    kind "operators"."""
    grouped = with_groups_as_layers(graph, operator_cuts(graph, count))
    layer_graph = build_layer_graph(grouped, TRAINING_DTYPE_BYTES)
    return grouped, dataclasses.replace(layer_graph, layers=tuple(
        dataclasses.replace(layer, name=f"operators.{layer.id}", kind=OPERATOR_KIND)
        for layer in sorted(layer_graph.layers, key=lambda layer: layer.id)))
