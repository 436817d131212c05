"""Repeat groups: layers whose operator graphs are structurally identical.

Two layers are identical when their operators, in program order, have the same signatures (which
include all shapes) and the same wiring: each input comes from the same position inside the layer,
or from outside it. Such layers cost the same on any accelerator and are scheduled once.
"""

from __future__ import annotations

import hashlib

from graph_extract.opgraph import OpGraph


def layer_fingerprint(graph: OpGraph, layer: int) -> str:
    """A hash of the layer's operator signatures and internal wiring."""
    nodes = graph.layer_nodes(layer)
    local = {node.id: position for position, node in enumerate(nodes)}
    items = [(node.signature, tuple(local.get(source) for source in node.inputs)) for node in nodes]
    return hashlib.sha1(repr(items).encode()).hexdigest()


def repeat_groups(graph: OpGraph) -> tuple[tuple[int, ...], ...]:
    """Layers grouped by fingerprint, groups and members in program order; the first is representative."""
    groups: dict[str, list[int]] = {}
    for layer in graph.layers:
        groups.setdefault(layer_fingerprint(graph, layer), []).append(layer)
    return tuple(tuple(members) for members in groups.values())
