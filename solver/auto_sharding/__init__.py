"""Alpa-style intra-operator sharding search for one layer: each operator's iteration dims split
over the axes of a device mesh, chosen by an exact ILP to minimise the layer's time per training
step (compute at local shapes, weight-gradient sync, resharding) under a parameter-memory bound.

Modules, lowest first: mesh.py (axes and their collectives' costs), cluster_axis.py (axes priced by
phaze's cluster model), graph.py (tensors and einsum operators), models.py (MLP, BERT and MoE layer
graphs), resharding.py (placements, conversion costs, the edge rule, a tensor's gradients from
several readers), strategies.py (each operator's strategies and own costs), shrink.py
(followers merged, repeated layers), costs.py (a plan's cost, the ILP's tables), ilp.py (the ILP),
megatron.py (Megatron-LM's plan of a BERT layer).
"""

from .cluster_axis import ClusterAxis, cluster_mesh
from .costs import CostModel, PlanCost
from .graph import GraphBuilder, Op, Operand, ShardingGraph, Tensor
from .ilp import ShardingPlan, StackPlan, solve, solve_layers
from .megatron import megatron_plan
from .mesh import AlphaBeta, AxisCollectives, DeviceMesh, MeshAxis
from .models import bert_layer, mlp, moe_layer
from .resharding import PARTIAL, REPLICATE, Partial, Replicate, Shard, conversion_cost
from .strategies import CostSettings, Strategy

__all__ = [
    "PARTIAL", "REPLICATE", "AlphaBeta", "AxisCollectives", "ClusterAxis", "CostModel", "CostSettings", "DeviceMesh",
    "GraphBuilder", "MeshAxis", "Op", "Operand", "Partial", "PlanCost", "Replicate", "Shard", "ShardingGraph",
    "ShardingPlan", "StackPlan", "Strategy", "Tensor", "bert_layer", "cluster_mesh", "conversion_cost",
    "megatron_plan", "mlp", "moe_layer", "solve", "solve_layers",
]
