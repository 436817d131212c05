"""The tensor-core model against Sunstone's cycles, hand calculations and its monotonicity."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from estimator import MemorySystem, gemm_cost, tc_gemm_cycles
from phaze_hardware import named_accelerator

SUNSTONE = Path(__file__).parent / "data" / "estimator" / "sunstone_tc_latency.csv"
MIB = 2**20


@pytest.fixture(scope="module")
def sunstone() -> pd.DataFrame:
    table = pd.read_csv(SUNSTONE)
    table["ours"] = [tc_gemm_cycles(int(r.N), int(r.C), int(r.K), int(r.num_tc), int(r.width), int(r.depth),
                                    int(r.glb_mb) * MIB) for r in table.itertuples()]
    return table


def test_single_core_rows_reproduce_sunstone(sunstone):
    single = sunstone[sunstone.num_tc == 1]
    assert len(single) == 35
    ratio = single.ours / single.sunstone_latency_cycles
    assert np.mean(np.abs(ratio - 1) <= 0.15) >= 0.80
    assert np.all(single.ours >= single.N * single.C * single.K / (single.width * single.depth) * (1 - 1e-12))


def test_multi_core_rows_are_never_slower_than_sunstone(sunstone):
    # per-core bandwidths grow with the cores (Sunstone's are chip-wide), so never slower, never below ideal
    multi = sunstone[sunstone.num_tc > 1]
    assert np.all(multi.ours <= multi.sunstone_latency_cycles)
    assert np.all(multi.ours >= multi.N * multi.C * multi.K / (multi.num_tc * multi.width * multi.depth) * (1 - 1e-12))


def test_hand_calculated_register_bound_gemm():
    # 2048x1024x1024 on one 128x128 core: best core tile 512x512x512 (each operand 2^18 words = the
    # core buffer). Reads from the core buffer: inputs (2M words) once per 512 columns (2x), weights
    # (1M) once per 512 rows (4x), partial outputs (2M) once per 512 reduced (2x) less the first write,
    # at 64 words/cycle; compute alone would take 2^31 / 2^14 = 131,072 cycles.
    reads = 2 * 2**21 + 4 * 2**20 + 2 * 2**21 - 2**21
    assert tc_gemm_cycles(2048, 1024, 1024, 1, 128, 128, 32 * MIB) == reads / 64


def test_small_arrays_are_compute_bound():
    assert tc_gemm_cycles(1024, 1024, 1024, 1, 2, 2, 2 * MIB) == 2**30 / 4


def test_a_vector_product_is_bound_by_memory():
    # n = 1: every weight is used once. On 8 cores the core buffers feed 8 x 64 words/cycle, less than
    # HBM (571 words/cycle): all weights cross that boundary once, and the input once per core tile.
    chip = named_accelerator("tpuv4_like")
    assert tc_gemm_cycles(1, 8192, 8192, 8, 128, 128, 128 * MIB) >= 8192 * 8192 / (8 * 64)
    # On 64 cores they feed 4,096 words/cycle: HBM binds, the GLB holds everything, each word is read once.
    cycles = tc_gemm_cycles(1, 8192, 8192, 64, 32, 32, 128 * MIB)
    assert cycles == pytest.approx((8192 * 8192 + 8192) / chip.dram_words_per_cycle, rel=1e-12)


def test_padding_for_dimensions_tiles_do_not_divide():
    # 3 x 5 x 7 on a 2x2 core: whatever the tiling, at least ceil-padded work; never below MACs / PEs
    cycles = tc_gemm_cycles(3, 5, 7, 1, 2, 2, 2 * MIB)
    assert 3 * 5 * 7 / 4 <= cycles <= 4 * 6 * 8 / 4


def test_vectorised_equals_one_by_one():
    memory = MemorySystem.of(named_accelerator("tpuv4_like"))
    rng = np.random.default_rng(7)
    pes = 2 ** rng.integers(2, 17, 40)
    num = 2 ** rng.integers(0, 13, 40)
    glb = 2 ** rng.integers(1, 8, 40) * MIB
    together = gemm_cost(2048, 768, 3000, pes, num, glb, memory)
    for i in range(40):
        alone = gemm_cost(2048, 768, 3000, pes[i:i + 1], num[i:i + 1], glb[i:i + 1], memory)
        assert alone.cycles[0] == together.cycles[i]
        assert alone.dram_words[0] == together.dram_words[i]


def test_width_and_depth_are_interchangeable():
    assert tc_gemm_cycles(2048, 4096, 1024, 4, 256, 16, 32 * MIB) == tc_gemm_cycles(2048, 4096, 1024, 4, 16, 256, 32 * MIB)


@pytest.mark.parametrize("field, value", [("width", 3), ("num_tc", 6), ("glb_bytes", 3 * MIB), ("n", 0)])
def test_bad_arguments_are_errors(field, value):
    arguments = dict(n=64, c=64, k=64, num_tc=1, width=4, depth=4, glb_bytes=2 * MIB)
    arguments[field] = value
    with pytest.raises(ValueError, match=field):
        tc_gemm_cycles(**arguments)


dims = st.integers(1, 6000)
log2 = st.integers


@settings(max_examples=25, deadline=None)
@given(n=dims, c=dims, k=dims, num=log2(0, 11), width=log2(1, 7), depth=log2(1, 7), glb=log2(1, 6),
       grow=st.sampled_from(["num_tc", "width", "depth", "glb_bytes"]))
def test_latency_never_grows_with_resources(n, c, k, num, width, depth, glb, grow):
    base = dict(num_tc=2**num, width=2**width, depth=2**depth, glb_bytes=2**glb * MIB)
    bigger = {**base, grow: 2 * base[grow]}
    assert tc_gemm_cycles(n, c, k, **bigger) <= tc_gemm_cycles(n, c, k, **base)
