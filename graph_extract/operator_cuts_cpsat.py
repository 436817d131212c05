"""The exact grouping of units by CP-SAT (the model is stated in `graph_extract.operator_cuts`).

CP-SAT needs integers: seconds are counted in ticks, the largest power of ten at most
1 / TICKS_PER_LOAD of the greatest possible load (every unit's cost and every crossing tensor set's
seconds_per_byte × bytes), each of those terms rounded to whole ticks. The rounded problem's
optimum is the one proven; the real bottleneck's lower bound is the rounded one's less half a tick
per term.

Besides the model's constraints, implied ones that make the proofs fast: with B the bottleneck, the first k + 1 groups
cost at most (k + 1)·B and the last count - 1 - k at most (count - 1 - k)·B; so, with B at most the
starting grouping's bottleneck U, a unit whose ancestors and itself cost more than (k + 1)·U is
after group k, and one whose descendants and itself cost more than (count - 1 - k)·U is in group k
or earlier. Counting units gives the same: a unit with a ancestors and d descendants among n is in
a group in [count - n + a, n - 1 - d].
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from ortools.sat.python import cp_model

from phaze_common.cpsat import portfolio_solver

from graph_extract.operator_units import Units


#: Ticks in the greatest possible load, at least.
TICKS_PER_LOAD = 10**9


@dataclass(frozen=True, kw_only=True)
class CpSatGrouping:
    """`groups` (one per unit), a lower bound on the bottleneck, and whether the bottleneck and then
    the crossing bytes are proven least (in ticks)."""

    groups: list[int]
    lower_bound_seconds: float
    optimal: bool


def _bit_sum(mask: int, values: Sequence[int]) -> int:
    total = 0
    while mask:
        low = mask & -mask
        total += values[low.bit_length() - 1]
        mask ^= low
    return total


class _Model:
    """Booleans z[u][k] = (group of u <= k) (ints where fixed), crossing booleans y, bottleneck B."""

    def __init__(self, units: Units, count: int, ticks: list[int], inbound_ticks: list[int], upper: int):
        self.count = count
        self.model = model = cp_model.CpModel()
        n = units.count
        ancestors, descendants = units.relatives()
        self.z: list[list] = []
        self.free: dict[tuple[int, int], cp_model.IntVar] = {}
        for unit in range(n):
            before = _bit_sum(ancestors[unit], ticks) + ticks[unit]
            after = _bit_sum(descendants[unit], ticks) + ticks[unit]
            lowest = max(0, count - n + ancestors[unit].bit_count(), -(-before // max(upper, 1)) - 1)
            highest = min(count - 1, n - 1 - descendants[unit].bit_count(), count - -(-after // max(upper, 1)))
            if lowest > highest:
                raise RuntimeError(f"unit {unit} has no group within the starting grouping's bottleneck")
            for k in range(lowest, highest):
                self.free[unit, k] = model.new_bool_var(f"z{unit}_{k}")
            self.z.append([0 if k < lowest else 1 if k >= highest else self.free[unit, k] for k in range(count)])
            for k in range(lowest + 1, highest):
                model.add_implication(self.free[unit, k - 1], self.free[unit, k])
        z = self.z
        for source, dest in units.edges:
            for k in range(count - 1):
                if not (isinstance(z[dest][k], int) and isinstance(z[source][k], int)):
                    model.add(z[dest][k] <= z[source][k])
        x = [[z[unit][k] - (z[unit][k - 1] if k else 0) for k in range(count)] for unit in range(n)]
        self.lower = max(max(ticks), -(-sum(ticks) // count))
        self.bottleneck = model.new_int_var(self.lower, upper, "bottleneck")
        self.crossing: list[tuple[cp_model.IntVar, int]] = []
        for k in range(count):
            model.add(sum(x[unit][k] for unit in range(n)) >= 1)
            inbound = []
            for index, tensors in enumerate(units.tensors if k else ()):
                possible = [reader for reader in tensors.consumers if not isinstance(x[reader][k], int)
                            or x[reader][k] == 1]
                if not possible or (isinstance(x[tensors.producer][k], int) and x[tensors.producer][k] == 1):
                    continue
                entered = model.new_bool_var(f"y{index}_{k}")
                for reader in possible:
                    model.add(entered >= x[reader][k] - x[tensors.producer][k])
                inbound.append((entered, index))
            self.crossing.extend((entered, units.tensors[index].bytes) for entered, index in inbound)
            model.add(sum(ticks[unit] * x[unit][k] for unit in range(n))
                      + sum(inbound_ticks[index] * entered for entered, index in inbound) <= self.bottleneck)
            if k < count - 1:  # implied: the groups up to k, and those after it
                model.add(sum(ticks[unit] * z[unit][k] for unit in range(n)) <= (k + 1) * self.bottleneck)
                model.add(sum(ticks[unit] * (1 - z[unit][k]) for unit in range(n)) <= (count - 1 - k) * self.bottleneck)

    def hint(self, groups: Sequence[int]) -> None:
        self.model.clear_hints()
        for (unit, k), variable in self.free.items():
            self.model.add_hint(variable, groups[unit] <= k)

    def groups(self, solver: cp_model.CpSolver) -> list[int]:
        return [min(k for k, below in enumerate(row) if (below if isinstance(below, int) else solver.value(below)))
                for row in self.z]


def cpsat_grouping(units: Units, count: int, seconds_per_byte: float, start: list[int], time_limit: float,
                   workers: int) -> CpSatGrouping:
    """The least bottleneck, then the fewest crossing bytes, searched from the grouping `start` on
    `workers` threads for at most `time_limit` seconds."""
    deadline = time.monotonic() + time_limit
    greatest = sum(units.seconds) + seconds_per_byte * sum(tensors.bytes for tensors in units.tensors)
    tick = 10.0 ** math.floor(math.log10(greatest / TICKS_PER_LOAD)) if greatest > 0 else 1.0

    def to_seconds(bound: int) -> float:
        return max(0.0, (bound - (units.count + len(units.tensors)) / 2) * tick)

    ticks = [round(seconds / tick) for seconds in units.seconds]
    inbound_ticks = [round(seconds_per_byte * tensors.bytes / tick) for tensors in units.tensors]
    upper = math.ceil(max(units.loads(start, count, ticks, inbound_ticks)))
    built = _Model(units, count, ticks, inbound_ticks, upper)
    built.hint(start)
    built.model.minimize(built.bottleneck)
    solver = portfolio_solver(time_limit, workers)
    status = solver.solve(built.model)
    if status == cp_model.UNKNOWN:  # no grouping found in the time given: the starting one
        return CpSatGrouping(groups=start, lower_bound_seconds=to_seconds(built.lower), optimal=False)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise RuntimeError(f"CP-SAT returned {solver.status_name(status)} for a model with a feasible hint")
    first = built.groups(solver)
    bound, proven = math.ceil(solver.best_objective_bound - 1e-9), status == cp_model.OPTIMAL
    built.model.add(built.bottleneck <= round(solver.objective_value))
    built.hint(first)
    built.model.minimize(sum(size * entered for entered, size in built.crossing))
    solver = portfolio_solver(deadline - time.monotonic(), workers)
    status = solver.solve(built.model)
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return CpSatGrouping(groups=built.groups(solver), lower_bound_seconds=to_seconds(bound),
                             optimal=proven and status == cp_model.OPTIMAL)
    return CpSatGrouping(groups=first, lower_bound_seconds=to_seconds(bound), optimal=False)
