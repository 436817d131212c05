"""Accelerator template, area model and candidate space against the original's numbers.

The original (msr-fiddle/phaze at fed7cde) generates its candidates in `Estimator/architecture.py`
lines 83-113, sums their areas from Accelergy in `third_party_for_phaze/wham/initialize.py` lines
388-417 and ships the result as `Estimator/arch_configs/cores.json`.
"""

from __future__ import annotations

import numpy as np
import pytest

from estimator import candidate_space
from phaze_hardware import AcceleratorConfig, area_um2, named_accelerator

MIB = 2**20


@pytest.fixture(scope="module")
def space():
    return candidate_space()


def test_space_has_the_originals_size_and_extreme_areas(space):
    assert len(space) == 29_360
    assert space.area.min() == pytest.approx(3_355_047.77325, rel=1e-12)
    assert space.area.max() == pytest.approx(278_826_676.31216, rel=1e-12)


def test_space_is_in_the_originals_order_and_composition(space):
    first = space[0]
    assert (first.num_tc, first.num_vc, first.tc_width, first.tc_depth, first.vc_width, first.glb_bytes) == (
        4096, 4096, 16, 2, 16, 32 * MIB)  # the first line of cores.json
    counts = [int(np.sum(space.num_tc == 2**x)) for x in range(13)]
    assert counts == [5570, 2300, 2352, 2386, 2398, 2362, 2297, 2202, 2049, 1793, 1468, 1223, 960]
    assert [int(np.sum(space.glb_bytes == 2**g * MIB)) for g in range(1, 8)] == [2968, 3010, 3066, 3224, 3918, 7029, 6145]
    assert int(np.sum((space.num_tc == 1) | (space.num_vc == 1))) == 9308
    assert np.all(np.diff(np.lexsort((-space.glb_bytes, -space.depth, -space.width, -space.num_vc, -space.num_tc))) == 1)


def test_distinct_core_configurations(space):
    assert len(space.tc_cores) == 4186
    assert len(space.vc_cores) == 697
    assert space.tc_cores[0].num == 4096 and space.tc_cores[0].width == 16 and space.tc_cores[0].depth == 2
    for i in (0, 1234, 29_359):
        accelerator = space[i]
        assert space.tc_cores[space.tc_index[i]] == accelerator.tc_core
        assert space.vc_cores[space.vc_index[i]] == accelerator.vc_core


@pytest.mark.parametrize("config, expected", [
    ((1, 1, 2, 2, 2 * MIB), 3_355_047.77325),
    ((4096, 4096, 16, 2, 32 * MIB), 246_416_424.736),
    ((8, 2, 128, 128, 128 * MIB), 278_826_676.31216),
    ((64, 64, 32, 32, 32 * MIB), 100_978_978.24384),
])
def test_worked_area_examples(config, expected):
    num_tc, num_vc, width, depth, glb = config
    assert float(area_um2(num_tc, num_vc, width, depth, width, glb)) == pytest.approx(expected, rel=1e-6)


def test_area_by_components():
    # TC 4x4 MACs, 1 KiB SRAM; VC 4 lanes, 1 KiB; GLB 4 MiB -- summed by hand from the tables
    expected = 3 * 16 * 760.041386 + 3 * 6133.98 + 5 * 4 * 759.823853 + 5 * 6133.98 + 6_078_640
    assert float(area_um2(3, 5, 4, 4, 4, 4 * MIB)) == pytest.approx(expected, rel=1e-12)


def test_every_candidate_is_within_the_budget(space):
    budget = named_accelerator("tpuv4_like").area
    assert np.all(space.area <= budget)
    multi = (space.num_tc > 1) & (space.num_vc > 1)
    assert np.all(space.area[multi] >= 0.3 * budget)
    assert space[17].area == pytest.approx(space.area[17], rel=1e-12)


def test_tpuv4_like_preset():
    chip = named_accelerator("tpuv4_like")
    assert (chip.num_tc, chip.num_vc, chip.tc_width, chip.tc_depth, chip.vc_width, chip.glb_bytes) == (
        8, 2, 128, 128, 128, 128 * MIB)
    assert chip.clock_hz == 1.05e9 and chip.bytes_per_element == 2
    assert chip == AcceleratorConfig(8, 2, 128, 128, 128, 128 * MIB)  # the preset states the defaults
    assert chip.area == pytest.approx(278_826_676.31216, rel=1e-12)


def test_a_smaller_budget_gives_a_subset():
    small = candidate_space(area_budget=50e6)
    assert 0 < len(small) < 29_360
    assert np.all(small.area <= 50e6)


def test_budget_admitting_nothing_is_an_error():
    with pytest.raises(ValueError, match="area_budget.*admits no accelerator"):
        candidate_space(area_budget=1e6)


@pytest.mark.parametrize("field, value", [("tc_width", 96), ("num_tc", 0), ("glb_bytes", 3 * MIB), ("vc_width", -4)])
def test_non_power_of_two_dimension_is_an_error(field, value):
    with pytest.raises(ValueError, match=f"accelerator.{field}: must be a positive power of two"):
        named_accelerator("tpuv4_like", **{field: value})


def test_non_numeric_technology_value_is_an_error():
    with pytest.raises(ValueError, match="accelerator.clock_hz: must be a finite number > 0, got 'fast'"):
        named_accelerator("tpuv4_like", clock_hz="fast")


def test_non_positive_technology_value_is_an_error():
    with pytest.raises(ValueError, match="accelerator.hbm_bandwidth: must be a finite number > 0"):
        named_accelerator("tpuv4_like", hbm_bandwidth=0)
    with pytest.raises(ValueError, match="accelerator.energy.dram: must be a finite number > 0"):
        AcceleratorConfig.from_dict({**named_accelerator("tpuv4_like").to_dict(), "energy": {"dram": -1.0}})


def test_unknown_field_and_unknown_name_are_errors():
    with pytest.raises(ValueError, match="accelerator: unknown field 'frequency'"):
        named_accelerator("tpuv4_like", frequency=1e9)
    with pytest.raises(ValueError, match="accelerator: unknown template 'tpu9'; allowed: tpuv4, tpuv4_like, tpuv5e, tpuv5p"):
        named_accelerator("tpu9")


def test_round_trip_through_a_dict():
    chip = named_accelerator("tpuv4_like", hbm_bandwidth=2e12)
    assert AcceleratorConfig.from_dict(chip.to_dict()) == chip


def test_area_outside_the_tables_is_an_error():
    with pytest.raises(ValueError, match="glb_bytes: no area data for 268435456 bytes"):
        named_accelerator("tpuv4_like", glb_bytes=256 * MIB).area
