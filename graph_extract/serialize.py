"""JSON (de)serialisation of extracted graphs (the graph cache's files)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from graph_extract.layergraph import Layer, LayerEdge, LayerGraph, RecomputedModule, TiedWeight
from graph_extract.opgraph import GemmDims, OpGraph, OpNode

#: Bump when the content or meaning of the files changes; old cache files are then ignored.
FORMAT_VERSION = 14


def _shapes(value: list) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(shape) for shape in value)


def op_node_to_dict(node: OpNode) -> dict[str, Any]:
    record = dataclasses.asdict(node)
    record["gemm"] = None if node.gemm is None else [node.gemm.batch, node.gemm.m, node.gemm.k, node.gemm.n]
    record["attrs"] = [list(item) for item in node.attrs]
    return record


def op_node_from_dict(record: dict[str, Any]) -> OpNode:
    return OpNode(
        **{
            **record,
            "input_shapes": _shapes(record["input_shapes"]),
            "output_shapes": _shapes(record["output_shapes"]),
            "weight_shapes": _shapes(record["weight_shapes"]),
            "weight_names": tuple(record["weight_names"]),
            "inputs": tuple(record["inputs"]),
            "gemm": None if record["gemm"] is None else GemmDims(*record["gemm"]),
            "attrs": tuple((name, value) for name, value in record["attrs"]),
        }
    )


def op_graph_to_dict(graph: OpGraph) -> dict[str, Any]:
    return {
        "tensor_parallel_width": graph.tensor_parallel_width,
        "nodes": [op_node_to_dict(node) for node in graph.nodes],
        "edges": [list(edge) for edge in graph.edges],
        "sharded_parameters": sorted(graph.sharded_parameters),
    }


def op_graph_from_dict(record: dict[str, Any]) -> OpGraph:
    return OpGraph(
        nodes=tuple(op_node_from_dict(node) for node in record["nodes"]),
        edges=tuple(tuple(edge) for edge in record["edges"]),
        tensor_parallel_width=record["tensor_parallel_width"],
        sharded_parameters=frozenset(record["sharded_parameters"]),
    )


def layer_graph_to_dict(graph: LayerGraph) -> dict[str, Any]:
    return dataclasses.asdict(graph)


#: The fields of a layer (and of a recomputed module) that JSON holds as lists.
_TUPLES = ("forward_collective_bytes", "backward_collective_bytes", "all_to_all_bytes",
           "expert_forward_collective_bytes", "expert_backward_collective_bytes", "parameter_tensors")


def _tuples(record: dict[str, Any]) -> dict[str, Any]:
    return {**record, **{name: tuple(record[name]) for name in _TUPLES if name in record}}


def layer_graph_from_dict(record: dict[str, Any]) -> LayerGraph:
    return LayerGraph(
        layers=tuple(
            Layer(**{**_tuples(layer), "recompute_modules": tuple(
                RecomputedModule(**_tuples(module)) for module in layer.get("recompute_modules", ()))})
            for layer in record["layers"]
        ),
        edges=tuple(LayerEdge(**edge) for edge in record["edges"]),
        tensor_parallel_width=record["tensor_parallel_width"],
        tied=tuple(TiedWeight(**weight) for weight in record["tied"]),
    )


def dumps(record: dict[str, Any]) -> str:
    return json.dumps(record, separators=(",", ":"))
