"""Tensor-core latency: the tiling cost model of Sunstone, the original program's mapper, vectorised.

Sunstone: Olyaiy et al., "Sunstone: A Scalable and Versatile Scheduler for Mapping Tensor Algebra on
Spatial Accelerators", ISPASS 2023; the copy the original runs is in msr-fiddle/phaze at fed7cde
(`third_party_for_phaze/sunstone/src/tiling.py` `get_accesses`, `src/optimization_utils.py`
`get_cost_edp_bypass`), driven by `Estimator/utils/tc_estimator.py`.

A GEMM [N x C]·[C x K] (N rows, C reduced, K columns) is tiled at four levels: a register tile per
MAC, the PE array (spatial), a per-core tile held in the core buffer, the core array (spatial) and
a tile held in the global buffer (GLB). Every word that crosses a boundary is counted as Sunstone
counts it: a tensor is re-fetched once per step of its "full-reuse"
dimension (K for inputs, N for weights, C for outputs) outside the tile below the boundary, and
partial outputs are read back except on their first write. Latency is the slowest of compute and
the traffic of each boundary divided by its bandwidth:

    cycles = max(MACs_padded / active PEs, traffic_reg<-core / (64 w/c · active cores),
                 traffic_core<-GLB / (256 w/c · active cores), traffic_GLB<-DRAM / HBM words/cycle)

Tiles are powers of two; dimensions they do not divide are padded. The search is exhaustive for
compute and the register<-core boundary: the per-core tile E is any tile of (register tile ≤ 32
words) x (PE-array unroll ≤ width·depth) x (temporal growth along one dimension, the innermost
loop) whose three operand tiles each fit the core buffer; E alone decides that boundary's traffic.
Using 2^q cores, the chip tile is the multiple of E (2^q of them) with the fewest padded MACs that
fits the GLB; it sets the core<-GLB traffic, which with per-core bandwidths of at least the
register<-core ones never binds. The DRAM boundary takes the best GLB tile on its own (nesting with
the inner tiles relaxed: a lower bound, tight unless the GLB barely holds the chip tile).

Because the admissible tiles only grow with the array, the number of cores and the buffers,
latency never increases when any of them grows.

Capacities are the numbers the original passes to Sunstone (`Estimator/utils/tc_estimator.py`
lines 12-18): byte counts, which Sunstone reads as words, so each buffer holds twice its intended
size; phaze keeps this so that single-core results reproduce Sunstone: a 32-word register file per
MAC, three operand buffers of max(16·width·depth, 1024) words per core, and a GLB of `glb_bytes`
words.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from phaze_hardware import DEFAULT_BUDGET, AcceleratorConfig, named_accelerator

REGISTER_WORDS = 32


def core_buffer_words(pes: np.ndarray | int) -> np.ndarray:
    """Words per operand buffer of one core with `pes` MACs (the original's L2_Buffer).

    The original sets it in `Estimator/utils/estimator_wrapper.py` lines 127-130 (msr-fiddle/phaze at fed7cde)."""
    return np.maximum(16 * np.asarray(pes, dtype=np.float64), 1024.0)


def _ceil_log2(value: int) -> int:
    return max(int(value) - 1, 0).bit_length()


@dataclass(frozen=True)
class MemorySystem:
    """Bandwidths of the three boundaries [words/cycle]: the first two per active core."""

    core_buffer_words_per_cycle: float
    glb_words_per_cycle: float
    dram_words_per_cycle: float

    @classmethod
    def of(cls, accelerator: AcceleratorConfig) -> MemorySystem:
        """The memory system of an `AcceleratorConfig`."""
        return cls(accelerator.core_buffer_words_per_cycle, accelerator.glb_words_per_cycle,
                   accelerator.dram_words_per_cycle)


@dataclass(frozen=True)
class GemmCost:
    """Cycles and words moved per boundary of one GEMM on each of a list of core configurations;
    `chip_cycles` without the DRAM boundary (a GEMM whose operands stay on chip, as inside a fused
    attention kernel); `dram_bound_words` the larger of the words read and written across the
    DRAM boundary, so cycles = max(chip cycles, dram_bound_words / HBM words a cycle) at any HBM
    bandwidth (`at`)."""

    macs: int
    cycles: np.ndarray
    core_buffer_words: np.ndarray
    glb_words: np.ndarray
    dram_words: np.ndarray
    chip_cycles: np.ndarray
    dram_bound_words: np.ndarray

    #: The fields that do not depend on the HBM's bandwidth (what the cache stores).
    STORED = ("core_buffer_words", "glb_words", "dram_words", "chip_cycles", "dram_bound_words")

    @classmethod
    def at(cls, macs: int, dram_words_per_cycle: float, **stored: np.ndarray) -> GemmCost:
        """The cost with `STORED` fields at an HBM bandwidth of `dram_words_per_cycle`."""
        cycles = np.maximum(stored["chip_cycles"], stored["dram_bound_words"] / dram_words_per_cycle)
        return cls(macs, cycles, **stored)

    def rows(self, index: int) -> GemmCost:
        """The cost on configuration `index` alone (arrays of one row)."""
        return GemmCost(self.macs, *(getattr(self, item)[index:index + 1] for item in self.__dataclass_fields__
                                     if item != "macs"))


class GemmTiles:
    """Every power-of-two tile of one GEMM shape, with its traffic, footprint and padded work.

    Arrays are indexed [n, c, k] by the log2 extents of the tile along N, C, K.
    """

    def __init__(self, n: int, c: int, k: int) -> None:
        self.dims = (n, c, k)
        self.top = tuple(_ceil_log2(d) for d in self.dims)
        self.shape = tuple(t + 1 for t in self.top)
        axes = [np.arange(size).reshape([-1 if a == axis else 1 for a in range(3)])
                for axis, size in enumerate(self.shape)]
        self.exps = np.broadcast_arrays(*axes)
        self.log_volume = sum(axes)
        extent = [2.0 ** axis for axis in axes]
        size = [np.minimum(e, d) for e, d in zip(extent, self.dims)]
        steps = [np.ceil(d / e) for e, d in zip(extent, self.dims)]
        in_tile, w_tile, out_tile = size[0] * size[1], size[1] * size[2], size[0] * size[2]
        self.largest_operand = np.maximum(np.maximum(in_tile, w_tile), out_tile)
        self.footprint = in_tile + w_tile + out_tile
        self.padded_macs = (steps[0] * extent[0]) * (steps[1] * extent[1]) * (steps[2] * extent[2])
        self._steps = steps

    def traffic(self, steps: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """(reads, writes) across a boundary whose tile below has these fetch counts per dimension."""
        n, c, k = self.dims
        writes = n * k * steps[1]
        reads = n * c * steps[2] + c * k * steps[0] + writes - n * k
        return reads, writes

    @cached_property
    def inner_traffic(self) -> tuple[np.ndarray, np.ndarray]:
        """Traffic when the tile is the one below the boundary (register<-core, core<-GLB)."""
        return self.traffic(self._steps)

    @cached_property
    def min_log_unroll(self) -> np.ndarray:
        """Fewest log2 PEs per core that build each tile as (register tile) x (unroll) x (one loop).

        A tile E is reachable on 2^p PEs when, after removing its innermost temporal dimension,
        the rest splits into a register tile of ≤ 32 words and a spatial unroll of ≤ p bits.
        """
        fits = np.full(self.shape, -np.inf)  # the largest log2 register tile that fits inside each tile
        for rn in range(min(self.top[0], 5) + 1):
            for rc in range(min(self.top[1], 5) + 1):
                for rk in range(min(self.top[2], 5) + 1):
                    a, b, c = (min(2**r, d) for r, d in zip((rn, rc, rk), self.dims))
                    if a * b + b * c + a * c <= REGISTER_WORDS:
                        inside = (self.exps[0] >= rn) & (self.exps[1] >= rc) & (self.exps[2] >= rk)
                        fits = np.where(inside, np.maximum(fits, rn + rc + rk), fits)
        needed = []
        for axis in range(3):
            spatial = [slice(None)] * 3
            spatial[axis] = slice(0, 1)
            needed.append(self.log_volume - self.exps[axis] - fits[tuple(spatial)])
        return np.minimum(np.minimum(needed[0], needed[1]), needed[2])

    def chip_tiles(self, glb_words: float, max_log_cores: int) -> tuple[np.ndarray, np.ndarray]:
        """For each per-core tile and q = 0..max_log_cores: the fewest padded MACs of a chip tile
        made of 2^q per-core tiles that fits the GLB, and that chip tile's flat index (ties: smaller
        footprint). Shapes (q, n, c, k); inf where no chip tile fits."""
        best = np.where(self.footprint <= glb_words, self.padded_macs, np.inf)
        chosen = np.arange(best.size).reshape(self.shape)
        values, choices = [best], [chosen]
        footprint = self.footprint.ravel()
        for _ in range(max_log_cores):
            new_best = np.full(self.shape, np.inf)
            new_chosen = np.zeros(self.shape, dtype=np.int64)
            for axis in range(3):
                below = [slice(None)] * 3
                above = [slice(None)] * 3
                below[axis], above[axis] = slice(0, -1), slice(1, None)
                value, choice = best[tuple(above)], chosen[tuple(above)]
                current, current_choice = new_best[tuple(below)], new_chosen[tuple(below)]
                better = (value < current) | ((value == current) & (footprint[choice] < footprint[current_choice]))
                new_best[tuple(below)] = np.where(better, value, current)
                new_chosen[tuple(below)] = np.where(better, choice, current_choice)
            best, chosen = new_best, new_chosen
            values.append(best)
            choices.append(chosen)
        return np.stack(values), np.stack(choices)

    def dram_traffic(self, glb_words: float) -> tuple[float, float]:
        """(max(reads, writes), reads + writes) across GLB<-DRAM with the best GLB tile."""
        best_time, best_total = np.inf, np.inf
        fits = self.footprint <= glb_words
        for axis in range(3):  # the dimension iterated innermost around the GLB tile is fully reused
            steps = list(self._steps)
            steps[axis] = np.ones_like(steps[axis])
            reads, writes = self.traffic(steps)
            time = np.where(fits, np.maximum(reads, writes), np.inf)
            index = np.unravel_index(np.argmin(time), self.shape)
            if time[index] < best_time:
                best_time, best_total = float(time[index]), float(np.broadcast_to(reads + writes, self.shape)[index])
        return best_time, best_total


def gemm_cost(n: int, c: int, k: int, pes: np.ndarray, num: np.ndarray, glb_words: np.ndarray,
              memory: MemorySystem) -> GemmCost:
    """Cost of [n x c]·[c x k] on each configuration (`pes` = width·depth per core, `num` cores and
    a GLB of `glb_words`; all powers of two, equally shaped arrays)."""
    tiles = GemmTiles(n, c, k)
    pes, num, glb_words = (np.asarray(a, dtype=np.int64).ravel() for a in (pes, num, glb_words))
    log_pes, log_num = np.log2(pes).astype(int), np.log2(num).astype(int)
    reads, writes = tiles.inner_traffic
    inner_time = np.broadcast_to(np.maximum(reads, writes), tiles.shape).ravel()
    inner_total = np.broadcast_to(reads + writes, tiles.shape).ravel()
    log_volume = np.broadcast_to(tiles.log_volume, tiles.shape).ravel()
    core_words, glb_moved, dram_words, chip_cycles, dram_bound = (np.empty(len(pes)) for _ in range(5))
    for glb in np.unique(glb_words):
        at_glb = glb_words == glb
        padded, chosen = tiles.chip_tiles(float(glb), int(log_num[at_glb].max()))
        padded, chosen = padded.reshape(len(padded), -1), chosen.reshape(len(chosen), -1)
        cores = 2.0 ** np.arange(len(padded))[:, None]
        traffic_time = np.maximum(inner_time / (memory.core_buffer_words_per_cycle * cores),
                                  inner_time[chosen] / (memory.glb_words_per_cycle * cores))
        dram_time, dram_total = tiles.dram_traffic(float(glb))
        for log_p in np.unique(log_pes[at_glb]):
            at_p = at_glb & (log_pes == log_p)
            q_max = int(log_num[at_p].max())
            usable = np.flatnonzero(((tiles.min_log_unroll <= log_p)
                                     & (tiles.largest_operand <= core_buffer_words(2**log_p))).ravel())
            active = 2.0 ** np.minimum(log_volume[usable], log_p) * cores[: q_max + 1]
            time = np.maximum(padded[: q_max + 1, usable] / active, traffic_time[: q_max + 1, usable])
            best = np.argmin(time, axis=1)
            best_time = time[np.arange(q_max + 1), best]
            for log_n in np.unique(log_num[at_p]):
                q = int(np.argmin(best_time[: log_n + 1]))
                tile = usable[best[q]]
                rows = at_p & (log_num == log_n)
                chip_cycles[rows] = best_time[q]
                core_words[rows] = inner_total[tile]
                glb_moved[rows] = inner_total[chosen[q, tile]]
                dram_words[rows] = dram_total
                dram_bound[rows] = dram_time
    return GemmCost.at(n * c * k, memory.dram_words_per_cycle, core_buffer_words=core_words, glb_words=glb_moved,
                       dram_words=dram_words, chip_cycles=chip_cycles, dram_bound_words=dram_bound)


def tc_gemm_cycles(n: int, c: int, k: int, num_tc: int, width: int, depth: int, glb_bytes: int,
                   accelerator: AcceleratorConfig | None = None) -> float:
    """Cycles of the forward GEMM [n x c]·[c x k] on `num_tc` tensor cores of `width` x `depth`
    MACs sharing a `glb_bytes` global buffer, with the bandwidths of `accelerator` (default: the
    TPUv4-like template)."""
    for name, value in dict(n=n, c=c, k=k, num_tc=num_tc, width=width, depth=depth, glb_bytes=glb_bytes).items():
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name}: must be a positive integer, got {value!r}")
        if name not in ("n", "c", "k") and value & (value - 1):
            raise ValueError(f"{name}: must be a power of two (1, 2, 4, ...), got {value!r}")
    memory = MemorySystem.of(accelerator or named_accelerator(DEFAULT_BUDGET))
    return float(gemm_cost(n, c, k, [width * depth], [num_tc], [glb_bytes], memory).cycles[0])
