"""Validated layer graphs renumbered to topological positions, one `WidthGraph` per width."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .inputs import DEVICES_LIMIT, PlacementGraph

#: (other layer's position, bytes on the edge), in the order of the width's edge list.
Adjacency = tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class WidthGraph:
    """One width's layer graph with layers at topological positions 0..n-1 (per-position tuples)."""

    width: int
    ids: tuple[int, ...]
    forward: tuple[float, ...]
    backward: tuple[float, ...]
    parameter_bytes: tuple[float, ...]
    activation_bytes: tuple[float, ...]
    tensor_parallel: tuple[bool, ...]
    in_edges: tuple[Adjacency, ...]
    out_edges: tuple[Adjacency, ...]
    collective: tuple[float, ...] = ()  # forward + backward latency spent in collectives (breakdown only)

    @property
    def n(self) -> int:
        return len(self.ids)

    def is_chain(self) -> bool:
        """True when every position is joined to the next by an edge (unique topological order)."""
        return all(any(u == v - 1 for u, _ in self.in_edges[v]) for v in range(1, self.n))


def checked_widths(graphs: Mapping[int, PlacementGraph]) -> list[int]:
    """Check that all widths describe the same graph; return the widths in ascending order."""
    if not graphs:
        raise ValueError("graphs must hold at least one tensor-parallel width")
    for width in graphs:
        if isinstance(width, bool) or not isinstance(width, int) or not 1 <= width <= DEVICES_LIMIT:
            raise ValueError(f"graphs: width {width!r} must be an integer in [1, {DEVICES_LIMIT}]")
        if not isinstance(graphs[width], PlacementGraph):
            raise ValueError(f"graphs[{width}] must be a PlacementGraph")
    widths = sorted(graphs)
    reference = graphs[widths[0]]
    ids = {layer.id for layer in reference.layers}
    pairs = {(e.source, e.dest) for e in reference.edges}
    for width in widths:
        graph = graphs[width]
        if {layer.id for layer in graph.layers} != ids:
            raise ValueError(f"graphs[{width}]: layer ids differ from those of width {widths[0]}")
        if {(e.source, e.dest) for e in graph.edges} != pairs:
            raise ValueError(f"graphs[{width}]: edges differ from those of width {widths[0]}")
        if width == 1 and any(layer.tensor_parallel for layer in graph.layers):
            raise ValueError("graphs[1]: no layer may be tensor_parallel at width 1")
    return widths


def topological_order(graph: PlacementGraph) -> tuple[int, ...]:
    """Layer ids in the original's topological order (stack-based, sources in list order).

    Raises ValueError if the edges contain a cycle.
    """
    indegree = {layer.id: 0 for layer in graph.layers}
    successors: dict[int, list[int]] = {layer.id: [] for layer in graph.layers}
    for edge in graph.edges:
        indegree[edge.dest] += 1
        successors[edge.source].append(edge.dest)
    stack = [layer.id for layer in graph.layers if indegree[layer.id] == 0]
    order = []
    while stack:
        node = stack.pop()
        order.append(node)
        for succ in successors[node]:
            indegree[succ] -= 1
            if indegree[succ] == 0:
                stack.append(succ)
    if len(order) != len(indegree):
        raise ValueError("PlacementGraph.edges contain a cycle; the layer graph must be acyclic")
    return tuple(order)


def width_graph(graph: PlacementGraph, width: int, order: tuple[int, ...]) -> WidthGraph:
    """Renumber `graph` (at `width`) so that the layer `order[i]` sits at position i."""
    position = {layer_id: i for i, layer_id in enumerate(order)}
    layers = sorted(graph.layers, key=lambda layer: position[layer.id])
    in_edges: list[list[tuple[int, float]]] = [[] for _ in order]
    out_edges: list[list[tuple[int, float]]] = [[] for _ in order]
    for edge in graph.edges:
        source, dest = position[edge.source], position[edge.dest]
        in_edges[dest].append((source, float(edge.bytes)))
        out_edges[source].append((dest, float(edge.bytes)))
    return WidthGraph(
        width=width,
        ids=order,
        forward=tuple(float(layer.forward_latency) for layer in layers),
        backward=tuple(float(layer.backward_latency) for layer in layers),
        parameter_bytes=tuple(float(layer.parameter_bytes) for layer in layers),
        activation_bytes=tuple(float(layer.activation_bytes) for layer in layers),
        tensor_parallel=tuple(layer.tensor_parallel for layer in layers),
        in_edges=tuple(tuple(adj) for adj in in_edges),
        out_edges=tuple(tuple(adj) for adj in out_edges),
        collective=tuple(float(layer.collective_latency) for layer in layers),
    )
