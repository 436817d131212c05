"""Units: the operators of an op graph shrunk into what operator cuts assign to groups.

Shrinking, in program order:
* An operator that costs nothing (0 seconds: a `shape` operator under the default FLOP cost, which
  counts only matrix products) and reads exactly one operator's output joins that operator's unit.
  When its output is no larger than what it reads this loses nothing: moving it back into its
  producer's group keeps every edge rule, leaves every later group's inbound bytes as they were and
  removes the producer's tensor from its own group's inbound bytes at the price of at most its own;
  what it rules out is a group of operators that cost nothing alone.
* With `chain_seconds` > 0, a unit whose only successor unit reads from it alone joins it (a chain
  of single-producer, single-consumer operators becomes one unit) while the joined unit costs at
  most `chain_seconds`: fewer cuts to choose from (a cut inside a chain is lost, so the optimum can
  only rise), a smaller model. Off by default.

Units are numbered in program order of their first operator. A unit's operators enter it through
that first operator only, so an edge between two units goes from the lower number to the higher
and the numbering is a topological order of the units.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from graph_extract.opgraph import OpGraph


@dataclass(frozen=True, kw_only=True)
class CrossingTensors:
    """The output tensors of the operators of unit `producer` that units `consumers` (ascending, the
    producer not among them) read: `bytes` in all. They enter a group when the producer's group is
    earlier and one of the consumers is in it, and then all of them do."""

    producer: int
    consumers: tuple[int, ...]
    bytes: int


@dataclass(frozen=True, kw_only=True)
class Units:
    """`unit_of` each operator (by id); `seconds` each unit costs; `edges` (source unit, dest unit),
    source < dest, each pair once; `tensors` what may cross between units, one entry per (producer
    unit, set of consumer units)."""

    unit_of: tuple[int, ...]
    seconds: tuple[float, ...]
    edges: tuple[tuple[int, int], ...]
    tensors: tuple[CrossingTensors, ...]

    @property
    def count(self) -> int:
        return len(self.seconds)

    def loads(self, groups: Sequence[int], count: int, work: Sequence[float], inbound: Sequence[float]) -> list[float]:
        """Per group k of the grouping `groups` (one group per unit): the sum of work[u] over its
        units u plus the sum of inbound[t] over the crossing tensors t (by index) entering it: those
        whose producer is in an earlier group and one of whose consumers is in k."""
        totals = [0.0] * count
        for unit, group in enumerate(groups):
            totals[group] += work[unit]
        for index, tensors in enumerate(self.tensors):
            for group in {groups[reader] for reader in tensors.consumers} - {groups[tensors.producer]}:
                totals[group] += inbound[index]
        return totals

    def relatives(self) -> tuple[list[int], list[int]]:
        """(ancestors, descendants) of each unit, each a bit set (bit v: unit v)."""
        predecessors: list[list[int]] = [[] for _ in range(self.count)]
        successors: list[list[int]] = [[] for _ in range(self.count)]
        for source, dest in self.edges:
            predecessors[dest].append(source)
            successors[source].append(dest)
        ancestors, descendants = [0] * self.count, [0] * self.count
        for unit in range(self.count):  # the numbering is a topological order
            for source in predecessors[unit]:
                ancestors[unit] |= ancestors[source] | (1 << source)
        for unit in reversed(range(self.count)):
            for dest in successors[unit]:
                descendants[unit] |= descendants[dest] | (1 << dest)
        return ancestors, descendants

    def has_unique_order(self) -> bool:
        """Every unit feeds the next one: the numbering is the only topological order, so every valid
        grouping is a run of consecutive units per group."""
        pairs = set(self.edges)
        return all((unit, unit + 1) in pairs for unit in range(self.count - 1))


def _producers(graph: OpGraph) -> list[set[int]]:
    producers: list[set[int]] = [set() for _ in graph.nodes]
    for source, dest in graph.edges:
        producers[dest].add(source)
    return producers


def _renumbered(root: list[int]) -> list[int]:
    """Units numbered 0.. in order of their first operator, from each operator's root operator."""
    number: dict[int, int] = {}
    return [number.setdefault(first, len(number)) for first in root]


def _unit_edges(graph: OpGraph, unit_of: Sequence[int]) -> set[tuple[int, int]]:
    return {(unit_of[source], unit_of[dest]) for source, dest in graph.edges if unit_of[source] != unit_of[dest]}


def _collapse_chains(graph: OpGraph, unit_of: list[int], seconds: list[float], chain_seconds: float) -> list[int]:
    """Each operator's unit after joining chains of units (see the module's docstring)."""
    edges = _unit_edges(graph, unit_of)
    successors: list[set[int]] = [set() for _ in seconds]
    predecessors: list[set[int]] = [set() for _ in seconds]
    for source, dest in edges:
        successors[source].add(dest)
        predecessors[dest].add(source)
    joined = list(range(len(seconds)))  # each unit's first unit of its chain
    cost = list(seconds)
    for unit in range(len(seconds)):
        if len(predecessors[unit]) == 1:
            (before,) = predecessors[unit]
            first = joined[before]
            if successors[before] == {unit} and cost[first] + seconds[unit] <= chain_seconds:
                joined[unit] = first
                cost[first] += seconds[unit]
    return _renumbered([joined[unit] for unit in unit_of])


def shrink(graph: OpGraph, operator_seconds: Sequence[float], chain_seconds: float = 0.0) -> Units:
    """The units of `graph` with `operator_seconds[i]` the cost of operator i (see the module's
    docstring for the rules)."""
    producers = _producers(graph)
    root: list[int] = []
    for node in graph.nodes:
        sources = producers[node.id]
        follows = operator_seconds[node.id] == 0 and len(sources) == 1
        root.append(root[next(iter(sources))] if follows else node.id)
    unit_of = _renumbered(root)
    seconds = [0.0] * (max(unit_of) + 1 if unit_of else 0)
    for node in graph.nodes:
        seconds[unit_of[node.id]] += operator_seconds[node.id]
    if chain_seconds > 0:
        unit_of = _collapse_chains(graph, unit_of, seconds, chain_seconds)
        seconds = [0.0] * (max(unit_of) + 1)
        for node in graph.nodes:
            seconds[unit_of[node.id]] += operator_seconds[node.id]
    readers: dict[int, set[int]] = {}
    for source, dest in graph.edges:
        if unit_of[source] != unit_of[dest]:
            readers.setdefault(source, set()).add(unit_of[dest])
    grouped: dict[tuple[int, tuple[int, ...]], int] = {}
    for source, units in sorted(readers.items()):
        key = (unit_of[source], tuple(sorted(units)))
        grouped[key] = grouped.get(key, 0) + graph.nodes[source].output_bytes
    return Units(
        unit_of=tuple(unit_of),
        seconds=tuple(seconds),
        edges=tuple(sorted(_unit_edges(graph, unit_of))),
        tensors=tuple(CrossingTensors(producer=producer, consumers=consumers, bytes=size)
                      for (producer, consumers), size in grouped.items()),
    )
