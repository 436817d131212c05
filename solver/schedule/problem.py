"""The scheduling problem of one layer: fused operators, their precedence and the chip's cores.

Semantics (the original's, msr-fiddle/phaze at fed7cde, `Solver/ilp.py`; what "parallel" means is
fixed here):

* A `TC` operator runs on one tensor core, a `VC` operator on one vector core, a `TCandVC` operator
  (a GEMM with a fused vector epilogue) on one tensor core and one vector core at once (any free TC
  with any free VC: the cores are not paired by index).
* "Parallel" (intra-operator parallel) means the operator is split across all cores of its type and
  takes `parallel_latency`: all `num_tc` TCs for TC, all `num_vc` VCs for VC, and
  min(num_tc, num_vc) TC-VC pairs for TCandVC. While a parallel operator runs, no other core
  operator of either type runs (the original's default); the idle cores of the other type stay idle.
* A `collective` (tensor-parallel all-reduce) uses no TC or VC core: the network moves and reduces
  it, so it overlaps freely with any operator, a parallel one included. It has one latency and is
  never parallel. (The original books it as a VC operator whose cost does not depend on cores; to
  reproduce that, pass it as `Op("VC", t, t)`.)
* An operator of zero latency takes no time and occupies no core.
* `Nop` operators (views, reshapes) are dropped by `ScheduleProblem.without_nops`, which keeps the
  precedence that ran through them.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, replace
from functools import cached_property

from phaze_common.checks import integer, non_negative_number
from phaze_common.numbers import round_significant_scalar

CORE_TYPES = ("TC", "VC", "TCandVC", "collective")
NOP = "Nop"


@dataclass(frozen=True)
class Op:
    """One fused operator: its core type, latency [s] and energy [J] on one core and on all cores."""

    core: str
    latency: float
    parallel_latency: float
    energy: float = 0.0
    parallel_energy: float = 0.0
    name: str = ""

    def __post_init__(self) -> None:
        if self.core not in (*CORE_TYPES, NOP):
            raise ValueError(f"core: unknown {self.core!r}; allowed: {', '.join((*CORE_TYPES, NOP))}")
        for field in ("latency", "parallel_latency", "energy", "parallel_energy"):
            non_negative_number(field, getattr(self, field))
        if self.core == "collective" and self.parallel_latency != self.latency:
            raise ValueError(
                f"parallel_latency: a collective has one latency; pass parallel_latency equal to "
                f"latency ({self.latency!r}), got {self.parallel_latency!r}"
            )
        if self.latency > 0 and self.parallel_latency == 0:
            raise ValueError("parallel_latency: must be > 0 for an operator whose latency is > 0")

    @property
    def uses_tc(self) -> bool:
        return self.core in ("TC", "TCandVC")

    @property
    def uses_vc(self) -> bool:
        return self.core in ("VC", "TCandVC")

    @property
    def uses_cores(self) -> bool:
        """Whether the operator occupies cores at all (a zero-latency operator does not)."""
        return (self.uses_tc or self.uses_vc) and self.latency > 0

    @property
    def modes(self) -> tuple[bool, ...]:
        """The modes worth trying (False = one core, True = parallel).

        Parallel is offered only when it is faster: a parallel run that is not faster can be
        replaced by a one-core run at the same start, which ends no later and needs fewer cores.
        """
        return (False, True) if self.uses_cores and self.parallel_latency < self.latency else (False,)

    def duration(self, parallel: bool) -> float:
        return self.parallel_latency if parallel else self.latency

    def energy_of(self, parallel: bool) -> float:
        return self.parallel_energy if parallel else self.energy


@dataclass(frozen=True)
class ScheduleProblem:
    """Operators of one layer, precedence edges (i, j): j starts after i ends, and the core counts."""

    ops: tuple[Op, ...]
    edges: tuple[tuple[int, int], ...]
    num_tc: int
    num_vc: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "ops", tuple(self.ops))
        object.__setattr__(self, "edges", tuple(sorted({(int(i), int(j)) for i, j in self.edges})))
        for field in ("num_tc", "num_vc"):
            integer(field, getattr(self, field), 0)
        for index, op in enumerate(self.ops):
            if not isinstance(op, Op):
                raise ValueError(f"ops: entry {index} is {type(op).__name__}, expected Op")
            if op.core == NOP:
                raise ValueError(f"ops: operator {index} is a Nop; build with ScheduleProblem.without_nops")
            if op.uses_tc and self.num_tc == 0:
                raise ValueError(f"num_tc: operator {index} ({op.core}) needs a tensor core but num_tc=0")
            if op.uses_vc and self.num_vc == 0:
                raise ValueError(f"num_vc: operator {index} ({op.core}) needs a vector core but num_vc=0")
        for i, j in self.edges:
            if not (0 <= i < len(self.ops) and 0 <= j < len(self.ops)) or i == j:
                raise ValueError(f"edges: ({i}, {j}) must join two different operators in 0..{len(self.ops) - 1}")
        if len(self.topological_order) < len(self.ops):
            cyclic = sorted(set(range(len(self.ops))) - set(self.topological_order))
            raise ValueError(f"edges: the graph has a cycle among operators {cyclic}")

    @classmethod
    def without_nops(cls, ops, edges, num_tc: int, num_vc: int) -> ScheduleProblem:
        """Drop `Nop` operators, linking each kept operator to the kept ones it reached through Nops."""
        ops = tuple(ops)
        successors: dict[int, list[int]] = {i: [] for i in range(len(ops))}
        for i, j in edges:
            successors[i].append(j)
        kept = [i for i, op in enumerate(ops) if op.core != NOP]
        position = {old: new for new, old in enumerate(kept)}
        new_edges = set()
        for source in kept:
            stack, seen = list(successors[source]), set()
            while stack:
                node = stack.pop()
                if node in seen:
                    continue
                seen.add(node)
                if node in position:
                    new_edges.add((position[source], position[node]))
                else:
                    stack.extend(successors[node])
        return cls(tuple(ops[i] for i in kept), tuple(new_edges), num_tc, num_vc)

    @classmethod
    def from_workload(cls, layer, num_tc: int, num_vc: int) -> ScheduleProblem:
        """The problem of an estimator `FusedLayer` (ops with core_type, latencies and energies, and
        edges) on a chip with these core counts; Nops are dropped as in `without_nops`."""
        ops = [
            Op(
                op.core_type,
                op.latency,
                op.latency if op.core_type == "collective" else op.parallel_latency,
                op.energy,
                op.energy if op.core_type == "collective" else op.parallel_energy,
                name=f"{layer.direction[0]}{'+'.join(map(str, op.members))}",
            )
            for op in layer.ops
        ]
        return cls.without_nops(ops, layer.edges, num_tc, num_vc)

    def rounded(self, digits: int) -> ScheduleProblem:
        """The same problem with latencies and energies rounded to `digits` significant digits
        (`round_significant_scalar`: the search's bounds round the candidates' latencies alike)."""
        def r(x: float) -> float:
            return round_significant_scalar(x, digits)

        ops = tuple(replace(op, latency=r(op.latency), parallel_latency=r(op.parallel_latency), energy=r(op.energy),
                            parallel_energy=r(op.parallel_energy))
                    for op in self.ops)
        return ScheduleProblem(ops, self.edges, self.num_tc, self.num_vc)

    @cached_property
    def predecessors(self) -> tuple[tuple[int, ...], ...]:
        preds: list[list[int]] = [[] for _ in self.ops]
        for i, j in self.edges:
            preds[j].append(i)
        return tuple(tuple(p) for p in preds)

    @cached_property
    def successors(self) -> tuple[tuple[int, ...], ...]:
        succs: list[list[int]] = [[] for _ in self.ops]
        for i, j in self.edges:
            succs[i].append(j)
        return tuple(tuple(s) for s in succs)

    @cached_property
    def topological_order(self) -> tuple[int, ...]:
        """Operators in a precedence-respecting order, smallest index first among the ready ones."""
        indegree = [len(p) for p in self.predecessors]
        ready = [i for i, d in enumerate(indegree) if d == 0]
        heapq.heapify(ready)
        order = []
        while ready:
            i = heapq.heappop(ready)
            order.append(i)
            for j in self.successors[i]:
                indegree[j] -= 1
                if indegree[j] == 0:
                    heapq.heappush(ready, j)
        return tuple(order)

    @cached_property
    def descendants(self) -> tuple[frozenset[int], ...]:
        """For each operator, every operator reachable from it (its transitive successors)."""
        reach: list[frozenset[int]] = [frozenset()] * len(self.ops)
        for i in reversed(self.topological_order):
            reach[i] = frozenset(self.successors[i]).union(*(reach[j] for j in self.successors[i]))
        return tuple(reach)

    def comparable(self, i: int, j: int) -> bool:
        """Whether a path joins i and j in either direction (then their order is fixed)."""
        return j in self.descendants[i] or i in self.descendants[j]

    @cached_property
    def demands(self) -> tuple[tuple[tuple[int, int], tuple[int, int]], ...]:
        """demands[i][parallel] = (TCs, VCs) that operator i keeps from others; a parallel operator
        keeps all cores."""
        table = []
        for op in self.ops:
            if not op.uses_cores:
                table.append(((0, 0), (0, 0)))
            else:
                table.append(((int(op.uses_tc), int(op.uses_vc)), (self.num_tc, self.num_vc)))
        return tuple(table)

    def busy(self, i: int, parallel: bool) -> tuple[int, int]:
        """(TCs, VCs) that operator i keeps working, for utilisation."""
        op = self.ops[i]
        if not op.uses_cores:
            return (0, 0)
        if not parallel:
            return (int(op.uses_tc), int(op.uses_vc))
        if op.core == "TCandVC":
            pairs = min(self.num_tc, self.num_vc)
            return (pairs, pairs)
        return (self.num_tc, 0) if op.core == "TC" else (0, self.num_vc)

    def width(self, members: list[int]) -> int:
        """The most `members` that can run at once as far as precedence goes: the largest antichain,
        by Dilworth's theorem |members| - (maximum matching of i -> j over reachable pairs)."""
        matched_to: dict[int, int] = {}

        def augment(i: int, seen: set[int]) -> bool:
            for j in members:
                if j in self.descendants[i] and j not in seen:
                    seen.add(j)
                    if j not in matched_to or augment(matched_to[j], seen):
                        matched_to[j] = i
                        return True
            return False

        return len(members) - sum(augment(i, set()) for i in members)
