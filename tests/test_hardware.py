"""Hardware in one place: chips and systems are data files with a source for every figure, a system names
its chip, a new system is a file, and the command line's `system` group is the hardware's systems."""

import pytest
import yaml
from hydra import compose, initialize_config_module

from phaze_common.checks import InputError
from phaze_hardware import KNOWN_CHIPS, SYSTEMS, Cluster, Group, cluster, system_of
from phaze_hardware.chips import read_chip
from phaze_hardware.systems import read_system


def test_every_figure_names_its_source(tmp_path):
    for chip in KNOWN_CHIPS.values():
        assert chip.sources and all(source.strip() for source in chip.sources.values()), chip.name
    with pytest.raises(InputError, match="^bad.yaml: peak_flops must be {value, source} with a source$"):
        read_chip(write(tmp_path / "bad.yaml", {"cost_model": "roofline", "peak_flops": {"value": 1e15}}))


def write(path, data):
    path.write_text(yaml.safe_dump(data))
    return path


def test_every_system_names_a_chip_that_exists():
    assert {name: system.chip for name, system in SYSTEMS.items()} == {
        "dgx_a100": "a100_80gb", "dgx_h100": "h100_sxm", "tpuv4_pod": "tpuv4", "deepseek_h800": "h800_sxm",
        "tpuv5e_pod": "tpuv5e", "tpuv5p_pod": "tpuv5p", "dgx_h200": "h200_sxm", "dgx_b200": "b200",
        "gb200_nvl72": "gb200", "mi300x_platform": "mi300x", "tpuv6e_pod": "tpuv6e"}
    assert system_of("A100 SXM 80GB").name == "dgx_a100" and system_of("H100 (DGX-H100)").name == "dgx_h100"
    assert system_of("H800 SXM5").name == "deepseek_h800"
    assert system_of("TPU v5e").name == "tpuv5e_pod" and system_of("TPU v4").name == "tpuv4_pod"
    assert system_of("V100 (DGX-2)") is None


def test_a_new_system_is_a_data_file(tmp_path):
    path = write(tmp_path / "hgx_h100_ib200.yaml", {
        "name": "hgx_h100_ib200", "chip": "h100_sxm", "node_size": 8,
        "tiers": [{"name": "nvlink4", "bandwidth": 450e9, "latency": 3e-6, "efficiency": 0.8},
                  {"name": "infiniband_hdr", "bandwidth": 25e9, "latency": 6e-6, "efficiency": 0.85}]})
    built = read_system(path).cluster(32)
    assert isinstance(built, Cluster) and [tier.devices for tier in built.tiers] == [8, 32]
    # 16 consecutive GPUs: 8 per node on NVLink, the 2 nodes on 25 GB/s x 0.85
    size = 1e9
    expected = 2 * 7 / 8 * size / (450e9 * 0.8) + 2 * 1 / 2 * (size / 8) / (25e9 * 0.85) + 2 * 14 * 3e-6 + 2 * 6e-6
    assert built.all_reduce(Group(16, 1)).scalar(size) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("change, message", [
    ({"chip": "b300"}, "a.yaml: chip: unknown 'b300'; allowed: a100_80gb, b200, gb200, h100_sxm, h200_sxm, h800_sxm, "
                       "mi300x, tpuv4, tpuv5e, tpuv5p, tpuv6e"),
    ({"topology": "dragonfly"}, "a.yaml: topology: unknown 'dragonfly'; allowed: tiers, torus, fully_connected"),
    ({"name": "b"}, "a.yaml: name must be the file's name 'a', got 'b'"),
    ({"links": 2}, "a.yaml: unknown field 'links'; allowed: name, chip, node_size, topology, tiers, slices"),
    ({"tiers": [{"bandwidth": 0}]}, "system.tiers[0].bandwidth: must be a finite number > 0, got 0"),
])
def test_a_bad_system_file_is_one_line(tmp_path, change, message):
    path = write(tmp_path / "a.yaml", {"name": "a", "chip": "h100_sxm", "node_size": 8,
                                       "tiers": [{"bandwidth": 1e9}], **change})
    with pytest.raises(InputError) as raised:
        read_system(path)
    assert str(raised.value) == message


def test_the_command_lines_systems_are_the_hardwares():
    with initialize_config_module("phaze.conf", version_base="1.3"):
        for name, system in SYSTEMS.items():
            composed = compose("config", overrides=["mode=predict", f"system={name}"])
            assert dict(composed.system) | {"tiers": [dict(t) for t in composed.system.tiers]} == system.record()
    assert cluster("dgx_h100", 64).num_devices == 64
