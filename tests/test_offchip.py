"""A chip's HBM and scale-up links as designed quantities, and its manufacturing cost: figures by
hand, against the chips and systems that exist, and against a published die breakdown."""

from __future__ import annotations

import dataclasses
import math

import pytest

from phaze_common.checks import InputError
from phaze_hardware import KNOWN_CHIPS, SYSTEMS
from phaze_hardware.cost import cost_model
from phaze_hardware.offchip import Memory, ScaleUp, hbm_generations, link_generations
from phaze_hardware.power import power_model


def test_a_candidates_hbm_by_hand():
    memory = Memory.of("hbm3", 5)  # H100 SXM's five stacks
    assert memory.bandwidth == pytest.approx(5 * 670e9, rel=1e-12)
    assert memory.capacity == 5 * 16e9
    assert memory.area == pytest.approx(5 * (10.45e6 + 5.74e6), rel=1e-12)  # µm²
    assert memory.cost == pytest.approx(80 * 17.0, rel=1e-12)  # $17 a GB
    assert memory.energy(1e9) == pytest.approx(8e9 * 4.3e-12, rel=1e-12)  # a GB moved: 34 mJ
    assert memory.record() == {"hbm_generation": "hbm3", "hbm_stacks": 5, "hbm_bandwidth": memory.bandwidth,
                               "hbm_capacity": memory.capacity}


@pytest.mark.parametrize("chip, generation, stacks", [("h100_sxm", "hbm3", 5), ("a100_80gb", "hbm2e", 5),
                                                      ("tpuv4", "hbm2", 4)])
def test_stacks_give_the_chips_that_exist_their_bandwidth_and_capacity(chip, generation, stacks):
    memory, known = Memory.of(generation, stacks), KNOWN_CHIPS[chip]
    assert memory.bandwidth == pytest.approx(known.hbm_bandwidth, rel=0.005)
    assert memory.capacity == pytest.approx(known.hbm_capacity, rel=0.075)  # 80 GB sold as 80 GiB


def test_a_candidates_links_by_hand():
    links = ScaleUp.of("nvlink4", 18, 8)  # H100's 18 NVLink4 links in an 8-GPU NVSwitch node
    assert links.bandwidth == pytest.approx(18 * 25e9, rel=1e-12)
    # the same as the DGX H100 system's NVLink tier, taken from NVIDIA's per-GPU figure
    nvlink = SYSTEMS["dgx_h100"].cluster(8).tiers[0]
    assert links.bandwidth == pytest.approx(nvlink.bandwidth, rel=1e-12)
    tier = links.tier(nvlink)
    assert (tier.devices, tier.latency, tier.efficiency) == (8, nvlink.latency, nvlink.efficiency)
    assert links.area == pytest.approx(18 * (0.965e6 + 0.900e6), rel=1e-12)
    assert links.energy(1e9) == pytest.approx(8e9 * 5.4e-12, rel=1e-12)


def test_the_a100s_interfaces_against_its_die():
    # GA100's die (LLMCompass, 'Real GA100': 58 mm² of memory PHY, 31.77 of memory controllers and
    # 20.95 of NVLink PHY on 826): its 6 HBM2e sites and 12 NVLink3 links priced by the per-unit figures
    hbm, nvlink = hbm_generations()["hbm2e"], link_generations()["nvlink3"]
    assert 6 * hbm.phy_area_per_stack == pytest.approx(58e6, rel=0.10)
    assert 6 * hbm.controller_area_per_stack == pytest.approx(31.77e6, rel=0.10)
    assert 12 * nvlink.phy_area_per_link == pytest.approx(20.95e6, rel=0.10)


def test_a_dies_cost_by_hand():
    model = cost_model()
    area = 826e6  # µm²: GA100's size, at 7 nm
    per_wafer = math.pi * 150_000**2 / area - math.pi * 300_000 / math.sqrt(2 * area)
    assert model.dies_per_wafer(area) == pytest.approx(per_wafer, rel=1e-12) and 62 < per_wafer < 63
    good = (1 + 8.26 * 0.09 / 3) ** -3  # 8.26 cm² at 0.09 defects/cm², α = 3
    assert model.die_yield(area, "n7") == pytest.approx(good, rel=1e-12)
    assert model.die_cost(area, "n7") == pytest.approx(9346 / (per_wafer * good), rel=1e-12)
    assert 285 < model.die_cost(area, "n7") < 295
    memory = Memory.of("hbm3", 5)
    assert model.chip_cost(area, "n7", memory) == pytest.approx(model.die_cost(area, "n7") + 1360 + 750, rel=1e-12)
    # a larger die costs more per mm²: fewer per wafer and a lower yield
    assert model.die_cost(2 * area, "n7") > 2 * model.die_cost(area, "n7")


@pytest.mark.parametrize("make, message", [
    (lambda: Memory.of("hbm4", 4), "hbm_generation: unknown 'hbm4'; allowed: hbm2, hbm2e, hbm3, hbm3e"),
    (lambda: Memory.of("hbm3", 9), "hbm_stacks: must be an integer in [1, 8], got 9"),
    (lambda: Memory.of("hbm3", 0), "hbm_stacks: must be an integer in [1, 8], got 0"),
    (lambda: ScaleUp.of("nvlink6", 18, 8), "link_generation: unknown 'nvlink6'; allowed: nvlink3, nvlink4, nvlink5, "
                                            "ici_v4"),
    (lambda: ScaleUp.of("nvlink4", 0, 8), "links: must be a positive integer at most 64, got 0"),
    (lambda: cost_model().die_cost(1e8, "n3"), "technology_node: unknown 'n3'; allowed: n7, n5"),
])
def test_bad_generations_are_one_line(make, message):
    with pytest.raises(InputError) as raised:
        make()
    assert str(raised.value) == message



def tpu_v4_parts():
    return KNOWN_CHIPS["tpuv4"].template, Memory.of("hbm2", 4), ScaleUp.of("ici_v4", 6, 64)


def test_a_chips_peak_power_by_hand():
    chip, memory, links = tpu_v4_parts()
    power = power_model().peak_power(chip, "n7", memory, links)
    area = chip.area + 4 * (10.45e6 + 5.74e6) + 6 * (1.888e6 + 0.775e6)  # µm²
    expected = {
        "idle": 55 / 400e6 * area + 4 * 8.0,  # TPUv4i's idle per µm², 8 W of refresh a stack
        "tensor_cores": 8 * 128 * 128 * 1.05e9 * 0.59e-12,  # 137.6 T MAC/s at 0.59 pJ
        "vector_cores": 2 * 2048 * 1.05e9 * 1.69e-12,
        "core_buffers": 8 * 256 * 1.05e9 * 16 * 0.133e-12,  # 256 words a cycle into each MXU
        "global_buffer": 8 * 256 * 1.05e9 * 16 * 0.219e-12,
        "hbm": 1.2e12 * 8 * 3.97e-12,
        "links": 6 * 50e9 * 8 * 5.4e-12,
    }
    for part, watts in expected.items():
        assert power[part] == pytest.approx(watts, rel=1e-9), part
    assert power["total"] == pytest.approx(sum(expected.values()), rel=1e-12)


def test_tpu_v4s_power_against_its_measurements():
    # Jouppi et al., ISCA 2023, Table 4: idle 90 W; min/mean/max 121/170/192 W (ASIC and HBM running
    # production applications). The model's idle within 10 %; its peak (every unit busy at once, what a
    # power budget bounds) above the measured maximum but by less than a third.
    chip, memory, links = tpu_v4_parts()
    model = power_model()
    assert model.idle_power(chip, "n7", memory, links) == pytest.approx(90, rel=0.10)
    assert 192 < model.peak_power(chip, "n7", memory, links)["total"] < 192 * 4 / 3


def test_the_estimators_energies_at_a_node():
    chip, memory, _ = tpu_v4_parts()
    costs = power_model().energy_costs(chip, "n7", memory)
    assert (costs.mac, costs.core_buffer, costs.global_buffer, costs.dram) == pytest.approx(
        (0.59e-12, 16 * 0.133e-12, 16 * 0.219e-12, 16 * 3.97e-12), rel=1e-12)
    assert costs.register == chip.energy.register
    with pytest.raises(InputError, match="technology_node: unknown 'n3'; allowed: n7, n5"):
        power_model().node("n3")


def test_h100s_power_against_its_700_w():
    # H100 SXM's parts at 5 nm (TSMC 4N, a 5 nm-class node): 132 SMs of 4 tensor cores, 2,048 dense
    # bf16 MACs a clock per SM at 1.83 GHz (989 TFLOP/s), 814 mm² of die, 5 HBM3 stacks at 3.35 TB/s,
    # 18 NVLink4 links. The model's MACs, HBM, links and idle power take 490 W, 70 % of its 700 W
    # TDP (NVIDIA H100 datasheet), leaving 210 W for its register files, shared memory, L2 and CUDA
    # cores, which the template's buffers (a systolic array's feed) do not describe.
    template = dataclasses.replace(KNOWN_CHIPS["tpuv4"].template, clock_hz=1.83e9)
    model, memory, links = power_model(), Memory.of("hbm3", 5), ScaleUp.of("nvlink4", 18, 8)
    macs = model.busy_cores(template, "n5", 132 * 4, 16, 32, 0, 0)["tensor_cores"]
    assert 2 * 132 * 4 * 16 * 32 * 1.83e9 == pytest.approx(989e12, rel=0.001)
    idle = model.node("n5").idle_per_area * 814e6 + 5 * model.hbm_idle_per_stack
    parts = idle + macs + memory.energy(memory.bandwidth) + links.energy(links.bandwidth)
    assert parts == pytest.approx(0.70 * 700, rel=0.05)
