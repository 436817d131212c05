"""The best grouping of units into runs of consecutive units (in their numbering, a topological
order): exact when every unit feeds the next one, and the starting point of the CP-SAT search
otherwise (`graph_extract.operator_cuts`).

Two dynamic programmes over (groups used, units covered), each O(count · n²): the least bottleneck
B; then the fewest crossing bytes among the groupings whose every group's load is at most B. (One
programme minimising (bottleneck, bytes) lexicographically would not be exact: a prefix with the
smaller bottleneck but more bytes can lose once a later group sets the bottleneck.)
"""

from __future__ import annotations

import math

from graph_extract.operator_units import Units


def _run_loads(units: Units, seconds_per_byte: float) -> tuple[list[list[float]], list[list[int]]]:
    """load[a][b - a] and bytes[a][b - a] entering a group of the consecutive units a..b: the tensors
    of units before a that a unit in a..b reads."""
    readers_of: list[list[int]] = [[] for _ in range(units.count)]
    for index, tensors in enumerate(units.tensors):
        for reader in tensors.consumers:
            readers_of[reader].append(index)
    loads, sizes = [], []
    for first in range(units.count):
        counted: set[int] = set()
        work, inbound, row_loads, row_bytes = 0.0, 0, [], []
        for last in range(first, units.count):
            work += units.seconds[last]
            for index in readers_of[last]:
                if units.tensors[index].producer < first and index not in counted:
                    counted.add(index)
                    inbound += units.tensors[index].bytes
            row_loads.append(work + seconds_per_byte * inbound)
            row_bytes.append(inbound)
        loads.append(row_loads)
        sizes.append(row_bytes)
    return loads, sizes


def consecutive_grouping(units: Units, count: int, seconds_per_byte: float) -> list[int]:
    """The group of each unit (runs of consecutive units, `count` of them, none empty) with the least
    bottleneck, then the fewest crossing bytes."""
    n = units.count
    loads, sizes = _run_loads(units, seconds_per_byte)
    # least[k][m]: the least bottleneck of the first m units in k + 1 groups
    least = [[math.inf] * (n + 1) for _ in range(count)]
    for m in range(1, n + 1):
        least[0][m] = loads[0][m - 1]
    for k in range(1, count):
        for m in range(k + 1, n + 1):
            least[k][m] = min(max(least[k - 1][start], loads[start][m - 1 - start]) for start in range(k, m))
    bottleneck = least[count - 1][n]
    # fewest[k][m]: the fewest crossing bytes of the first m units in k + 1 groups of load <= bottleneck
    fewest = [[math.inf] * (n + 1) for _ in range(count)]
    first_of_last = [[0] * (n + 1) for _ in range(count)]
    for m in range(1, n + 1):
        if loads[0][m - 1] <= bottleneck:
            fewest[0][m] = sizes[0][m - 1]
    for k in range(1, count):
        for m in range(k + 1, n + 1):
            for start in range(k, m):
                if loads[start][m - 1 - start] <= bottleneck:
                    candidate = fewest[k - 1][start] + sizes[start][m - 1 - start]
                    if candidate < fewest[k][m]:
                        fewest[k][m], first_of_last[k][m] = candidate, start
    groups = [0] * n
    end = n
    for k in range(count - 1, 0, -1):
        start = first_of_last[k][end]
        groups[start:end] = [k] * (end - start)
        end = start
    return groups
