"""The estimate table: latency [s] and energy [J] of operator work on core configurations.

GEMM costs, the only expensive part, are computed once per GEMM shape for every tensor-core
configuration of the table at once and shared by all operators, layers, directions and widths
with that shape; they persist in the on-disk cache. Vector-core costs are closed forms evaluated
on demand. The table also keeps the layers it has prepared (`prepared_layer`), so a process that
holds a table fuses and derives each layer once.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np

from phaze_common.progress import Progress
from estimator.cache import GemmCache, cache_key
from estimator.space import CandidateSpace
from estimator.tc_model import GemmCost, MemorySystem, gemm_cost
from estimator.work import Gemm, VectorTerm
from phaze_hardware import POWER_OF_TWO_FIELDS, AcceleratorConfig, CoreConfig, EnergyCosts

Shape = tuple[int, int, int]


#: The fields of an accelerator that are not its dimensions: what estimates depend on besides the cores.
TECHNOLOGY_FIELDS = tuple(item.name for item in fields(AcceleratorConfig) if item.name not in POWER_OF_TWO_FIELDS)


def technology(accelerator: AcceleratorConfig) -> tuple:
    """The accelerator's technology, as a hashable key."""
    return tuple(getattr(accelerator, name) for name in TECHNOLOGY_FIELDS)


def vector_cycles(terms: Sequence[VectorTerm], lanes: int) -> int:
    """Cycles of vector work on `lanes` lanes."""
    return sum(term.repeat * term.cycles * -(-term.elements // lanes) for term in terms)


def gemm_energy(cost: GemmCost, energy: EnergyCosts) -> np.ndarray:
    """Energy of a GEMM: its MACs (with a register access each) and the words crossing each boundary."""
    return (cost.macs * (energy.mac + energy.register) + cost.core_buffer_words * energy.core_buffer
            + cost.glb_words * energy.global_buffer + cost.dram_words * energy.dram)


#: Runs function(*arguments) for each of argument_lists elsewhere (e.g. `solver.workers.WorkerPool.call`),
#: calling done(index, value) as each value arrives.
Call = Callable[[Callable, Sequence[Sequence], Callable[[int, Any], None]], list]


def gemm_costs(template: AcceleratorConfig, tc_cores: Sequence[CoreConfig], shape: Shape) -> GemmCost:
    """The cost of one GEMM shape on every tensor-core configuration of the table of `template` and
    `tc_cores` (computed, not stored: what `EstimateTable.fill` hands out)."""
    pes = np.array([core.units_per_core for core in tc_cores], dtype=np.int64)
    num = np.array([core.num for core in tc_cores], dtype=np.int64)
    glb = np.array([core.glb_bytes for core in tc_cores], dtype=np.int64)
    return gemm_cost(*shape, pes, num, glb, MemorySystem.of(template))


class EstimateTable:
    """Estimates for accelerators of one technology, over a list of tensor-core configurations.

    Costs for a core configuration outside the list are computed on the fly (not persisted).
    """

    def __init__(self, template: AcceleratorConfig, tc_cores: Iterable[CoreConfig],
                 cache_dir: Path | str | None = None) -> None:
        self.template = template
        self.technology = technology(template)
        self.memory = MemorySystem.of(template)
        self.tc_cores = tuple(dict.fromkeys(tc_cores))
        self.tc_index = {core: i for i, core in enumerate(self.tc_cores)}
        self._num = np.array([core.num for core in self.tc_cores], dtype=np.int64)
        self._glb = np.array([core.glb_bytes for core in self.tc_cores], dtype=np.int64)
        key = cache_key(self.memory, self.tc_cores)
        self.cache = None if cache_dir is None else GemmCache(cache_dir, key, len(self.tc_cores))
        self._gemms: dict[Shape, GemmCost] = {}
        self.computed = 0  # GEMM shapes computed (not found in memory or in the cache)
        self._energy: dict[Shape, np.ndarray] = {}
        self._extra: dict[tuple[Shape, CoreConfig], tuple[float, float]] = {}
        # (graph id, key) -> (the graph, weakly, so that a recycled id is noticed; the prepared layer)
        self._prepared: dict[tuple[int, Hashable], tuple[weakref.ref, Any]] = {}
        self._space_columns: dict[int, tuple[weakref.ref, tuple[np.ndarray, np.ndarray]]] = {}

    def prepared_layer(self, graph: object, key: Hashable) -> Any | None:
        """A layer prepared earlier for this `graph` under `key` (see `workload.prepare_layer`), or None."""
        found = self._prepared.get((id(graph), key))
        return found[1] if found is not None and found[0]() is graph else None

    def keep_prepared_layer(self, graph: object, key: Hashable, prepared: Any) -> Any:
        """Remember `prepared` for (graph, key) while the graph lives; returns it."""
        self._prepared[id(graph), key] = (weakref.ref(graph), prepared)
        return prepared

    def space_columns(self, space: CandidateSpace) -> tuple[np.ndarray, np.ndarray]:
        """Per candidate of a `CandidateSpace`: the table's column of its tensor cores, and of one of
        them (computed once per space)."""
        found = self._space_columns.get(id(space))
        if found is None or found[0]() is not space:
            cores = space.tc_cores
            every = np.array([self.tc_index[core] for core in cores])[space.tc_index]
            single = np.array([self.tc_index[core.single()] for core in cores])[space.tc_index]
            found = self._space_columns[id(space)] = (weakref.ref(space), (every, single))
        return found[1]

    def check(self, accelerator: AcceleratorConfig) -> None:
        if technology(accelerator) != self.technology:
            raise ValueError("accelerator: its clock, bandwidths or energies differ from the estimate table's; "
                             "build a table for this technology")

    @property
    def tc_counts(self) -> np.ndarray:
        """Tensor cores of each configuration of the table."""
        return self._num

    @property
    def glb_sizes(self) -> np.ndarray:
        """Global-buffer bytes of each configuration of the table."""
        return self._glb

    @property
    def gemm_shapes(self) -> tuple[Shape, ...]:
        """The GEMM shapes (n, c, k) held in memory."""
        return tuple(self._gemms)

    def gemm(self, shape: Shape) -> GemmCost:
        """Cost of the GEMM shape (n, c, k) on every tensor-core configuration of the table."""
        if shape not in self._gemms:
            self.fill([shape])
        return self._gemms[shape]

    def fill(self, shapes: Iterable[Shape], progress: bool = False, call: Call | None = None) -> int:
        """Load every shape from the cache or compute (and store) it; returns how many were computed.
        `call` computes them elsewhere (`Call`: worker processes), else they are computed here."""
        wanted = [shape for shape in dict.fromkeys(shapes) if shape not in self._gemms]
        for shape in wanted:
            cost = self.cache.load(*shape, self.memory.dram_words_per_cycle) if self.cache else None
            if cost is not None:
                self._gemms[shape] = cost
        missing = [shape for shape in wanted if shape not in self._gemms]
        counter = Progress(f"GEMM estimates ({len(wanted) - len(missing):,} cached)", len(missing), "shapes") \
            if progress else None
        with counter or contextlib.nullcontext():
            def keep(index: int, cost: GemmCost) -> None:
                if self.cache:
                    self.cache.store(*missing[index], cost)
                self._gemms[missing[index]] = cost
                if counter is not None:
                    counter.advance()

            arguments = [(self.template, self.tc_cores, shape) for shape in missing]
            if call is None or len(missing) < 2:
                for index, item in enumerate(arguments):
                    keep(index, gemm_costs(*item))
            else:
                call(gemm_costs, arguments, keep)
        self.computed += len(missing)
        return len(missing)

    def gemm_arrays(self, shape: Shape) -> tuple[np.ndarray, np.ndarray]:
        """(cycles, energy [J]) of one GEMM shape on every tensor-core configuration of the table."""
        if shape not in self._energy:
            self._energy[shape] = gemm_energy(self.gemm(shape), self.template.energy)
        return self.gemm(shape).cycles, self._energy[shape]

    def gemm_cost(self, shape: Shape, core: CoreConfig | None = None) -> GemmCost:
        """The cost of one GEMM shape on every tensor-core configuration of the table, or (one row)
        on `core`."""
        index = None if core is None else self.tc_index.get(core)
        if core is None or index is not None:
            cost = self.gemm(shape)
            if index is None:
                return cost
            return cost.rows(index)
        return gemm_cost(*shape, [core.units_per_core], [core.num], [core.glb_bytes], self.memory)

    def _gemm_on(self, shape: Shape, core: CoreConfig) -> tuple[float, float]:
        """(cycles, energy) of one GEMM shape on one tensor-core configuration."""
        index = self.tc_index.get(core)
        if index is not None:
            cycles, energy = self.gemm_arrays(shape)
            return float(cycles[index]), float(energy[index])
        if (shape, core) not in self._extra:
            cost = gemm_cost(*shape, [core.units_per_core], [core.num], [core.glb_bytes], self.memory)
            self._extra[shape, core] = (float(cost.cycles[0]), float(gemm_energy(cost, self.template.energy)[0]))
        return self._extra[shape, core]

    def tensor_core(self, gemms: Sequence[Gemm], core: CoreConfig) -> tuple[float, float]:
        """(cycles, energy) of GEMMs run one after the other on the tensor cores `core`."""
        cycles = energy = 0.0
        for gemm in gemms:
            one_cycles, one_energy = self._gemm_on((gemm.n, gemm.c, gemm.k), core)
            cycles += gemm.batch * one_cycles
            energy += gemm.batch * one_energy
        return cycles, energy

    def vector_core(self, terms: Sequence[VectorTerm], lanes: int) -> tuple[float, float]:
        """(cycles, energy) of vector work on `lanes` lanes: each operation, plus reading and
        writing each element in the core buffer."""
        energy = self.template.energy
        moved = sum(2 * term.repeat * term.elements for term in terms)
        return float(vector_cycles(terms, lanes)), sum(t.operations for t in terms) * energy.mac + moved * energy.core_buffer
