"""The original program's JSON interface over `place_original`: the input document msr-fiddle/phaze
at fed7cde parses in `Solver/device_placement/device_placement.cpp` lines 92-159, and the output it
writes (lines 338-350 and 1129-1137).

Differences on purpose: an infeasible fixed baseline gives "fixedStrategyTimePerBatch": null and
a "fixedStrategyInfeasibleReason" key (the DP result is still written); if no width fits, the
degrees are null; malformed input raises ValueError naming the field.
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from pathlib import Path

from .dp import INFTY
from .inputs import FixedStrategy, PlacementEdge, PlacementGraph, PlacementLayer, PlacementSettings
from .original_dp import place_original
from .result import PlacementResult

_FIXED_FIELDS = ("fixedPP", "fixedTMPC", "fixedDP", "numTransformerLayers")
#: JSON key of each typed field, to name the key in error messages.
_JSON_KEYS = {
    "devices": "maxDevices",
    "memory_per_device": "maxMemoryPerDevice",
    "bandwidth": "bandwidth",
    "micro_batches_per_batch": "mbsInBatch",
    "optimizer": "optimizerAlgorithm",
    "pipeline_parallel_width": "fixedPP",
    "tensor_parallel_width": "fixedTMPC",
    "data_parallel_width": "fixedDP",
    "num_transformer_layers": "numTransformerLayers",
    "parameter_bytes": "parameterSize",
    "activation_bytes": "activationSize",
    "forward_latency": "optimalLatencyFw",
    "backward_latency": "optimalLatencyBw",
    "bytes": "communicationCost",
}


def solve_document(document: object) -> dict:
    """Solve a parsed input document; return the output document."""
    graphs, settings = parse_document(document)
    return output_document(place_original(graphs, settings))


def parse_document(document: object) -> tuple[dict[int, PlacementGraph], PlacementSettings]:
    """Typed graphs and settings from the original input schema; ValueError names the bad field."""
    if not isinstance(document, dict):
        raise ValueError("input must be a JSON object")
    nodes = _by_width(_field(document, "nodes", dict, "an object"), "nodes")
    edges = _by_width(_field(document, "edges", dict, "an object"), "edges")
    if set(nodes) != set(edges):
        raise ValueError(f"nodes and edges must have the same width keys, got {sorted(nodes)} and {sorted(edges)}")
    graphs = {}
    for width in nodes:
        layers = tuple(_items(nodes[width], f'nodes["{width}"]', _layer))
        links = tuple(_items(edges[width], f'edges["{width}"]', _edge))
        try:
            graphs[width] = PlacementGraph(layers, links)
        except ValueError as error:
            raise ValueError(f'nodes/edges["{width}"]: {error}') from None
    try:
        settings = PlacementSettings(
            devices=int(_number(document, "maxDevices")),
            memory_per_device=float(_number(document, "maxMemoryPerDevice")),
            bandwidth=float(_number(document, "bandwidth")),
            micro_batches_per_batch=int(_number(document, "mbsInBatch")),
            activation_recomputation=_field(document, "activationRecomputation", bool, "a boolean"),
            optimizer=_field(document, "optimizerAlgorithm", str, "a string"),
            fixed_baseline=FixedStrategy(*(int(_number(document, field)) for field in _FIXED_FIELDS)),
        )
    except ValueError as error:
        raise _json_named(error) from None
    return graphs, settings


def output_document(result: PlacementResult) -> dict:
    """The original output schema (keys sorted when written)."""
    document = {
        "dataParallelDegree": None if result.layout is None else result.layout.data_parallel_width,
        "finalTimePerBatch": result.time_per_batch if result.feasible else INFTY,
        "fixedStrategyTimePerBatch": result.fixed_baseline_time,
        "stages": [{"devicesForStage": stage.devices, "nodes": list(stage.layer_ids)} for stage in result.stages],
        "tensorParallelDegree": None if result.layout is None else result.layout.tensor_parallel_width,
    }
    if result.fixed_baseline_infeasible_reason is not None:
        document["fixedStrategyInfeasibleReason"] = result.fixed_baseline_infeasible_reason
    return document


def write_document(document: dict, path: str | os.PathLike) -> None:
    """Write `document` as the original does (4-space indent, sorted keys), atomically."""
    target = Path(path)
    descriptor, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(document, indent=4, sort_keys=True) + "\n")
        os.chmod(temporary, 0o644)
        os.replace(temporary, target)
    except BaseException:
        os.unlink(temporary)
        raise


def _json_named(error: ValueError) -> ValueError:
    """The error with the JSON key of the typed field it names in front."""
    field = re.search(r"\.(\w+): ", str(error))
    key = _JSON_KEYS.get(field.group(1)) if field else None
    return ValueError(f"{key}: {error}" if key else str(error))


def _field(document: dict, key: str, kind: type, described: str):
    if key not in document:
        raise ValueError(f"missing key {key!r}")
    value = document[key]
    if not isinstance(value, kind):
        raise ValueError(f"{key} must be {described}, got {value!r}")
    return value


def _number(document: dict, key: str) -> float | int:
    """A JSON number (booleans count as 0/1, as in the original); must be finite."""
    if key not in document:
        raise ValueError(f"missing key {key!r}")
    value = document[key]
    if not isinstance(value, (int, float)) or not math.isfinite(_as_float(value)):
        raise ValueError(f"{key} must be a finite number, got {value!r}")
    return value


def _as_float(value: int | float) -> float:
    try:
        return float(value)
    except OverflowError:
        return math.inf


def _by_width(lists: dict, where: str) -> dict[int, object]:
    """Values keyed by the integer width their key spells ("4" -> 4)."""
    by_width: dict[int, object] = {}
    for key, value in lists.items():
        if not re.fullmatch(r"[0-9]+", key) or int(key) in by_width:
            raise ValueError(f'{where}: width key "{key}" must be a decimal integer, given once')
        by_width[int(key)] = value
    return by_width


def _items(values: object, where: str, build) -> list:
    if not isinstance(values, list):
        raise ValueError(f"{where} must be a list")
    items = []
    for index, value in enumerate(values):
        try:
            if not isinstance(value, dict):
                raise ValueError("must be an object")
            items.append(build(value))
        except ValueError as error:
            raise ValueError(f"{where}[{index}]: {_json_named(error)}") from None
    return items


def _layer(node: dict) -> PlacementLayer:
    return PlacementLayer(
        id=_integer(node, "id"),
        parameter_bytes=float(_number(node, "parameterSize")),
        activation_bytes=float(_number(node, "activationSize")),
        forward_latency=float(_number(node, "optimalLatencyFw")),
        backward_latency=float(_number(node, "optimalLatencyBw")),
        tensor_parallel=_field(node, "isTensorParallelized", bool, "a boolean"),
    )


def _edge(edge: dict) -> PlacementEdge:
    return PlacementEdge(
        source=_integer(edge, "sourceId"),
        dest=_integer(edge, "destId"),
        bytes=float(_number(edge, "communicationCost")),
    )


def _integer(document: dict, key: str) -> int:
    value = _number(document, key)
    if isinstance(value, bool) or value != int(value):
        raise ValueError(f"{key} must be an integer, got {value!r}")
    return int(value)
