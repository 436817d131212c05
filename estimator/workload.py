"""What the scheduler consumes: a layer's fused operators in one direction with their core type,
their latency on one core and on all cores of their type, their energies, and the edges.

`prepopulate` fills the estimate table for extracted models; `layer_workload` then prices a layer
for any accelerator by array indexing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from estimator.cache import default_cache_dir
from estimator.fusion import FusedGraph, FusedOp, fuse_attention, fuse_layers
from estimator.space import CandidateSpace, candidate_space
from estimator.table import Call, EstimateTable, gemm_energy
from estimator.work import BACKWARD, DIRECTIONS, FORWARD, VectorTerm, Work, op_work
from graph_extract.attention import TILE as ATTENTION_TILE
from graph_extract.attention import AttentionKernel, attention_kernels
from graph_extract.kernels import KernelOptions
from graph_extract.opgraph import OpGraph
from phaze_common.numbers import round_significant
from phaze_hardware import DEFAULT_BUDGET, POWER_OF_TWO_FIELDS, AcceleratorConfig, CoreConfig, named_accelerator

#: The kernels of the estimator's own API (`estimate`, `layer_workload` without options): the
#: original's — no sequence parallelism (every operator on all its tokens), attention unfused, 16-bit.
PLAIN_KERNELS = KernelOptions(sequence_parallel=False, flash_attention=False)


@dataclass(frozen=True)
class FusedEstimate:
    """One fused operator of a layer on one accelerator [s, J].

    `latency`/`energy`: on one core of its type (a TCandVC op: one TC and one VC);
    `parallel_latency`/`parallel_energy`: split across all cores of its type.
    `members` are the op-graph node ids it executes, the head first.
    """

    members: tuple[int, ...]
    core_type: str
    latency: float
    parallel_latency: float
    energy: float
    parallel_energy: float


@dataclass(frozen=True)
class FusedLayer:
    """A layer's fused operators in execution order of `direction` and the edges between them
    (indices into `ops`; backward reverses the forward order and edges)."""

    layer: int
    direction: str
    ops: tuple[FusedEstimate, ...]
    edges: tuple[tuple[int, int], ...]


def fused_work(graph: OpGraph, op: FusedOp, direction: str, split: Sequence[bool] = ()) -> Work:
    """The work of a fused operator: the head's GEMMs and every member's vector work.

    Members marked in `split` (by node id) have their vector work divided over the tensor-parallel
    ranks: sequence parallelism runs the replicated operators (norms, dropout, residual adds) on
    1/t of the tokens.
    """
    width = graph.tensor_parallel_width
    vector: list[VectorTerm] = []
    for member in op.members:
        terms = op_work(graph.nodes[member], direction).vector
        if split and split[member] and width > 1:
            terms = tuple(replace(term, elements=-(-term.elements // width)) for term in terms)
        vector.extend(terms)
    return Work(gemms=op_work(graph.nodes[op.members[0]], direction).gemms, vector=tuple(vector))


def attention_work(graph: OpGraph, kernel: AttentionKernel, direction: str) -> Work:
    """The work of a fused attention kernel on every tile (before the causal mask drops some): its two
    products and its members' vector work; backward also the scores and the softmax recomputed."""
    members = sorted(kernel.members)
    gemms = [gemm for product in kernel.products for gemm in op_work(graph.nodes[product], direction).gemms]
    vector = [term for member in members for term in op_work(graph.nodes[member], direction).vector]
    if direction == BACKWARD:
        gemms += op_work(graph.nodes[kernel.products[0]], FORWARD).gemms
        vector += [term for member in members if graph.nodes[member].kind == "softmax"
                   for term in op_work(graph.nodes[member], FORWARD).vector]
    return Work(gemms=tuple(gemms), vector=tuple(vector))


def attention_block(kernel_head_dim: int, num_tc: np.ndarray, glb_words: np.ndarray) -> np.ndarray:
    """Query and key rows per tile of a fused attention kernel on each chip: the largest power of two up
    to FlashAttention's 128 whose working set fits the global buffer — on every tensor core a query
    tile, its output accumulator and its score tile, and the key and value tiles they share (0: none
    fits down to 16 rows; the kernel then keeps its scores in HBM)."""
    block = np.zeros(np.shape(num_tc), dtype=np.int64)
    for rows in (16, 32, 64, ATTENTION_TILE):
        working = num_tc * (2 * rows * kernel_head_dim + rows * rows) + 2 * rows * kernel_head_dim
        block = np.where(working <= glb_words, rows, block)
    return block


def attention_prices(graph: OpGraph, kernel: AttentionKernel, work: Work, direction: str, table: EstimateTable,
                     core: CoreConfig | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(tensor-core cycles, energy [J]) of a fused attention kernel on every tensor-core configuration
    of the table (or on `core`). Its products run on the chip at their on-chip rate on the tiles the
    causal mask leaves, bounded by HBM: Q, O and the softmax statistics once, K and V once per pass
    of the chip's query tiles over the keys (all tensor cores share the key and value tiles the
    global buffer holds); backward twice those words. Without a tile that fits, the scores go
    through HBM as the separate products' would."""
    template = table.template
    costs = [(gemm.batch, table.gemm_cost((gemm.n, gemm.c, gemm.k), core)) for gemm in work.gemms]
    on_chip = sum(batch * cost.chip_cycles for batch, cost in costs)
    spilled = sum(batch * cost.cycles for batch, cost in costs)
    energy = template.energy
    spilled_energy = sum(batch * gemm_energy(cost, energy) for batch, cost in costs)
    chip_energy = spilled_energy - sum(batch * cost.dram_words for batch, cost in costs) * energy.dram
    num, glb = (table.tc_counts, table.glb_sizes) if core is None else (np.array([core.num]), np.array([core.glb_bytes]))
    scores = graph.nodes[kernel.products[0]].gemm
    word = template.bytes_per_element
    block = attention_block(scores.k, num, glb / word)
    passes = np.ceil(kernel.queries / (num * np.maximum(block, 1)))
    once = kernel.query_bytes + kernel.output_bytes + kernel.statistics_bytes
    words = (once + kernel.key_value_bytes * passes) / word * (2 if direction == BACKWARD else 1)
    fraction = kernel.fraction
    fits = block > 0
    cycles = np.where(fits, np.maximum(fraction * on_chip, words / template.dram_words_per_cycle), fraction * spilled)
    return cycles, np.where(fits, fraction * chip_energy + words * energy.dram, fraction * spilled_energy)


class PreparedLayer:
    """A fused layer in one direction, with its costs laid out per operator and per tensor-core
    configuration of the table: pricing it for an accelerator is column indexing.

    An operator's latency is max(tensor-core cycles, vector-core cycles) / clock (a fused epilogue
    streams the GEMM's output tiles, so the two overlap). Collectives take no time here: the
    training-step model charges them on the cluster's links. The vector work of the operators the
    kernel options split (`KernelOptions.split_operators`: sequence parallelism) is divided by the
    width. With a fused attention kernel (`KernelOptions.flash_attention`) each attention core is one
    operator (`attention_prices`; its vector work on the tiles the causal mask leaves).
    """

    def __init__(self, graph: OpGraph, fused: FusedGraph, direction: str, table: EstimateTable,
                 kernels: KernelOptions = PLAIN_KERNELS) -> None:
        if direction not in DIRECTIONS:
            raise ValueError(f"direction: must be 'forward' or 'backward', got {direction!r}")
        attention = ([kernel for kernel in attention_kernels(graph) if kernel.layer == fused.layer]
                     if kernels.flash_attention else [])
        fused, rows = fuse_attention(fused, [kernel.members for kernel in attention])
        last = len(fused.ops) - 1
        backward = direction == BACKWARD
        self.layer, self.direction, self.table = fused.layer, direction, table
        self.ops = fused.ops[::-1] if backward else fused.ops
        self.edges = tuple(sorted((last - b, last - a) for a, b in fused.edges)) if backward else fused.edges
        self.attention = {last - rows[i] if backward else rows[i]: kernel for i, kernel in enumerate(attention)}
        split = kernels.split_operators(graph)
        self.graph = graph
        self.works = tuple(attention_work(graph, self.attention[row], direction) if row in self.attention
                           else fused_work(graph, op, direction, split) for row, op in enumerate(self.ops))
        self._vector_share = np.array([self.attention[row].fraction if row in self.attention else 1.0
                                       for row in range(len(self.ops))])
        table.fill((g.n, g.c, g.k) for work in self.works for g in work.gemms)
        shape = (len(self.ops), len(table.tc_cores))
        self._tc_cycles, self._tc_energy = np.zeros(shape), np.zeros(shape)
        for row, work in enumerate(self.works):
            if row in self.attention:
                self._tc_cycles[row], self._tc_energy[row] = attention_prices(graph, self.attention[row], work,
                                                                              direction, table)
                continue
            for gemm in work.gemms:
                cycles, energy = table.gemm_arrays((gemm.n, gemm.c, gemm.k))
                self._tc_cycles[row] += gemm.batch * cycles
                self._tc_energy[row] += gemm.batch * energy
        self._vector: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def _tensor_cores(self, core: CoreConfig) -> tuple[np.ndarray, np.ndarray]:
        index = self.table.tc_index.get(core)
        if index is not None:
            return self._tc_cycles[:, index], self._tc_energy[:, index]
        costs = [attention_prices(self.graph, self.attention[row], work, self.direction, self.table, core)
                 if row in self.attention else self.table.tensor_core(work.gemms, core)
                 for row, work in enumerate(self.works)]
        return np.array([float(np.asarray(c).ravel()[0]) for c, _ in costs]), \
            np.array([float(np.asarray(e).ravel()[0]) for _, e in costs])

    def _vector_cores(self, lanes: int) -> tuple[np.ndarray, np.ndarray]:
        if lanes not in self._vector:
            costs = [self.table.vector_core(work.vector, lanes) for work in self.works]
            self._vector[lanes] = (np.array([c for c, _ in costs]) * self._vector_share,
                                   np.array([e for _, e in costs]) * self._vector_share)
        return self._vector[lanes]

    def _price(self, core: CoreConfig, lanes: int) -> tuple[np.ndarray, np.ndarray]:
        tc_cycles, tc_energy = self._tensor_cores(core)
        vc_cycles, vc_energy = self._vector_cores(lanes)
        template = self.table.template
        seconds = np.maximum(tc_cycles / template.tensor_core_efficiency, vc_cycles) / template.clock_hz
        return seconds, tc_energy + vc_energy

    def prices(self, accelerator: AcceleratorConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per operator: (latency, parallel_latency, energy, parallel_energy), as arrays for sweeps."""
        self.table.check(accelerator)
        one, one_energy = self._price(accelerator.tc_core.single(), accelerator.vc_width)
        every, every_energy = self._price(accelerator.tc_core, accelerator.num_vc * accelerator.vc_width)
        return one, every, one_energy, every_energy

    def candidate_prices(self, space: CandidateSpace, digits: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(latency, parallel_latency) [s] of every operator on every candidate of `space` at once,
        as arrays [operators x candidates]: the vectorised form of `prices` for a whole sweep. The
        tensor cores' and the vector cores' seconds are computed once per distinct configuration and,
        with `digits`, rounded to that many significant digits (`round_significant`, as a schedule
        problem's `rounded`) there; a price is the larger of the two (dividing by the clock and
        rounding are monotone, so this is the rounded larger one, bit for bit)."""
        self.table.check(space.template)
        every, single = self.table.space_columns(space)
        clock, efficiency = self.table.template.clock_hz, self.table.template.tensor_core_efficiency

        def seconds(cycles: np.ndarray) -> np.ndarray:
            return cycles / clock if digits is None else round_significant(cycles / clock, digits)

        def prices(tensor_cores: np.ndarray, lanes: np.ndarray) -> np.ndarray:
            cores, core_index = np.unique(tensor_cores, return_inverse=True)
            counts, count_index = np.unique(lanes, return_inverse=True)
            vector = np.stack([self._vector_cores(int(count))[0] for count in counts], axis=1)
            return np.maximum(seconds(self._tc_cycles[:, cores] / efficiency)[:, core_index],
                              seconds(vector)[:, count_index])

        return prices(single, space.width), prices(every, space.num_vc * space.width)

    def on(self, accelerator: AcceleratorConfig) -> FusedLayer:
        """The layer priced for one accelerator."""
        columns = (array.tolist() for array in self.prices(accelerator))
        ops = tuple(FusedEstimate(op.members, op.core_type, *values) for op, *values in zip(self.ops, *columns))
        return FusedLayer(self.layer, self.direction, ops, self.edges)


def budget_template(accelerator: AcceleratorConfig) -> AcceleratorConfig:
    """The area-budget accelerator (TPUv4-like) built in `accelerator`'s technology."""
    budget = named_accelerator(DEFAULT_BUDGET)
    return replace(accelerator, **{name: getattr(budget, name) for name in POWER_OF_TWO_FIELDS})


def default_table(accelerator: AcceleratorConfig, cache_dir: Path | str | None = None) -> EstimateTable:
    """A table for `accelerator`'s technology over the tensor cores of the default candidate space,
    persisted in `cache_dir` (default `default_cache_dir()`)."""
    directory = Path(default_cache_dir() if cache_dir is None else cache_dir)
    return EstimateTable(accelerator, candidate_space(budget_template(accelerator)).tc_cores, directory)


def prepare_layer(graph: OpGraph, layer: int, direction: str, table: EstimateTable,
                  kernels: KernelOptions = PLAIN_KERNELS) -> PreparedLayer:
    """The prepared layer, fused and derived once per (graph, layer, direction, kernels) and table."""
    key = (layer, direction, kernels)
    prepared = table.prepared_layer(graph, key)
    if prepared is None:
        if layer not in graph.layers:
            raise ValueError(f"layer: {layer!r} is not a layer of the graph; layers: {graph.layers}")
        (fused,) = fuse_layers(graph, (layer,))
        prepared = table.keep_prepared_layer(graph, key, PreparedLayer(graph, fused, direction, table, kernels))
    return prepared


def layer_workload(op_graph: OpGraph, layer: int, direction: str, accelerator: AcceleratorConfig,
                   table: EstimateTable | None = None, kernels: KernelOptions = PLAIN_KERNELS) -> FusedLayer:
    """The fused operators of `layer` in `direction` priced for `accelerator` (see `FusedLayer`)."""
    table = table or default_table(accelerator)
    return prepare_layer(op_graph, layer, direction, table, kernels).on(accelerator)


def _graph_and_layers(model: object) -> tuple[OpGraph, tuple[int, ...]]:
    """An OpGraph (all layers) or an extracted model (the representative of each repeat group)."""
    if isinstance(model, OpGraph):
        return model, model.layers
    graph, groups = getattr(model, "op_graph", None), getattr(model, "repeat_groups", None)
    if not isinstance(graph, OpGraph) or groups is None:
        raise ValueError(f"models: expected OpGraph or an extracted model, got {type(model).__name__}")
    return graph, tuple(group[0] for group in groups)


def prepopulate(models: Iterable[object], template: AcceleratorConfig | None = None,
                cache_dir: Path | str | None = None, progress: bool = True,
                area_budget: float | None = None, call: Call | None = None) -> EstimateTable:
    """Fill the estimate table with every GEMM of the models' layers, both directions, on every
    tensor-core configuration of the candidate space (which holds every single-core version too).

    `models`: OpGraphs or extracted models (e.g. one per tensor-parallel width); `template`: the
    budget accelerator and technology (default TPUv4-like); `area_budget` [µm²]: default the
    template's area; `cache_dir`: where estimates persist (default `default_cache_dir()`); what is
    cached is loaded, the rest computed (`progress`: with `phaze_common.progress`; `call`: elsewhere,
    see `EstimateTable.fill`).
    """
    template = template or named_accelerator(DEFAULT_BUDGET)
    table = EstimateTable(template, candidate_space(template, area_budget).tc_cores,
                          default_cache_dir() if cache_dir is None else cache_dir)
    shapes = []
    for model in models:
        graph, layers = _graph_and_layers(model)
        for fused in fuse_layers(graph, layers):
            for op in fused.ops:
                for direction in DIRECTIONS:
                    shapes.extend((g.n, g.c, g.k) for g in fused_work(graph, op, direction).gemms)
    table.fill(shapes, progress=progress, call=call)
    return table


def estimate(model: object, accelerator: AcceleratorConfig | None = None,
             table: EstimateTable | None = None) -> dict[tuple[int, str], FusedLayer]:
    """Every layer of an OpGraph (or representative layer of an extracted model), both directions,
    priced for `accelerator` (default: the TPUv4-like chip): {(layer, direction): FusedLayer}."""
    accelerator = accelerator or named_accelerator(DEFAULT_BUDGET)
    graph, layers = _graph_and_layers(model)
    return {(layer, direction): layer_workload(graph, layer, direction, accelerator, table)
            for layer in layers for direction in DIRECTIONS}
