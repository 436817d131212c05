"""The hardware of 2025-26: NVLink domains of 72 (groups laid on the blocks in Megatron's rank order,
partial last domains), fully connected nodes (MI300X), the v6e's 16 x 16 torus, the most specific
chip name, and a user's chip and system given by path (read and checked as the packaged files)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from phaze_common.checks import InputError
from phaze_hardware import SYSTEMS, Cluster, FullyConnected, Group, system_of
from phaze_hardware.chips import chip_of, read_chip
from phaze_hardware.cluster import counted_placements
from solver.layout import Layout

REPOSITORY = Path(__file__).resolve().parents[1]
S = 1e9  # bytes per device
NVLINK5 = 900e9 * 0.8  # gb200_nvl72: bytes/s per GPU per direction x efficiency
NDR = 50e9 * 0.94
NVLINK_STEP, NETWORK_STEP = 3.4e-6, 14e-6  # NCCL's ring steps; a ring leaving the domain: at least 3 us


def whole_domains(devices: int) -> Cluster:
    """gb200_nvl72 with every GPU of a domain in the job (`ranks: 72`, as a user's system file sets it)."""
    system = SYSTEMS["gb200_nvl72"]
    return Cluster.build(system.name, devices, system.node_size, [dict(system.tiers[0], ranks=72), *system.tiers[1:]])


def test_the_packaged_nvl72_lays_a_job_on_64_gpus_a_domain():
    """NVIDIA's GB200 runs use 16 of a rack's 18 trays: 256 GPUs are 4 domains of 64, so the data group
    of t = 8, d = 32 (stride 8) holds 8 members in each domain: rings of 8, then a ring of 4 domains on
    S/8; latency 32 − 4 = 28 steps inside and 3 across, each way."""
    cluster = SYSTEMS["gb200_nvl72"].cluster(256)
    assert [tier.devices for tier in cluster.tiers] == [64, 256]
    data = Layout(8, data_parallel_width=32).groups()["data"]
    expected = 2 * 7 / 8 * S / NVLINK5 + 2 * 3 / 4 * (S / 8) / NDR + 2 * 28 * NVLINK_STEP + 2 * 3 * NETWORK_STEP
    assert cluster.all_reduce(data).scalar(S) == pytest.approx(expected, rel=1e-12)
    with pytest.raises(InputError, match=r"system.tiers\[0\].ranks"):
        Cluster.build("test", 256, 4, [dict(name="nvlink", devices=72, ranks=80, bandwidth=1e9), dict(bandwidth=1e9)])


def test_an_all_reduce_of_72_gpus_in_one_nvl72_domain():
    # one tier: a ring of 72 over NVLink5, 2·71/72·S/B + 2·71·λ
    domain = whole_domains(72)
    expected = 2 * 71 / 72 * S / NVLINK5 + 2 * 71 * NVLINK_STEP
    assert domain.all_reduce(Group(72, 1)).scalar(S) == pytest.approx(expected, rel=1e-12)
    assert domain.tier_joining(Group(72, 1)) == 0


def test_a_data_parallel_group_of_16_at_stride_8_over_two_domains():
    """Two domains of 72 (144 GPUs), t = 8, d = 16: the group at offset r0 holds ranks r0, r0 + 8, ...,
    r0 + 120; r0 + 8j < 72 for j = 0..8 (every r0 < 8): 9 members in the first domain, 7 in the second.
    Inside the domains: rings of 9 and 7, the 9's the slower, 2·8/9·S/B_nvlink. Across: a ring of 2
    domains on the share of the domain of fewest members, S/7: 2·1/2·(S/7)/B_ib. Latency: NCCL's flat
    ring of 16, 16 − 2 = 14 steps inside the domains (at least the network's 3 us: 3.4 us), 2 − 1 = 1
    across, each way."""
    cluster = whole_domains(144)
    data = Layout(8, data_parallel_width=16).groups()["data"]
    assert data == Group(16, 8) and not cluster.even(data)
    expected = (2 * 8 / 9 * S / NVLINK5 + 2 * 1 / 2 * (S / 7) / NDR
                + 2 * 14 * NVLINK_STEP + 2 * 1 * NETWORK_STEP)
    assert cluster.all_reduce(data).scalar(S) == pytest.approx(expected, rel=1e-12)
    assert cluster.reduce_scatter(data).scalar(S) == pytest.approx(expected / 2, rel=1e-12)


def test_256_gpus_on_nvl72_three_full_domains_and_one_of_40():
    """Ranks fill the domains in order: 0-71, 72-143, 144-215, and 216-255 (40). The data group of
    t = 8, d = 32 (stride 8) holds 9 members in each full domain and 5 in the last (r0 + 8j ≥ 216 for
    j = 27..31). Inside: rings of 9 (the slower, 2·8/9) and 5; across: a ring of 4 domains on the
    share of the 5-member domain, 2·3/4·(S/5)/B_ib. Latency: 32 − 4 = 28 steps inside, 4 − 1 = 3
    across, each way."""
    cluster = whole_domains(256)
    assert [tier.devices for tier in cluster.tiers] == [72, 256]
    data = Layout(8, data_parallel_width=32).groups()["data"]
    expected = (2 * 8 / 9 * S / NVLINK5 + 2 * 3 / 4 * (S / 5) / NDR
                + 2 * 28 * NVLINK_STEP + 2 * 3 * NETWORK_STEP)
    assert cluster.all_reduce(data).scalar(S) == pytest.approx(expected, rel=1e-12)
    # tensor groups of 8 consecutive ranks never straddle a domain (72 = 9 x 8): NVLink only
    assert cluster.tier_joining(Group(8, 1)) == 0
    assert cluster.all_reduce(Group(8, 1)).scalar(S) == pytest.approx(2 * 7 / 8 * S / NVLINK5 + 2 * 7 * NVLINK_STEP,
                                                                      rel=1e-12)
    # groups of 5 at stride 8 (40 ranks) straddle the domain boundary at 72 for some offsets
    assert cluster.tier_joining(Group(5, 8)) == 1 and cluster.tier_joining(Group(9, 8)) == 0


def test_counting_ranks_agrees_with_the_closed_form_on_even_groups():
    # brute force: every group counted rank by rank prices as the closed form g_k = min(n, N_k // σ)
    cluster = Cluster.build("test", 64, 8, [dict(name="nvlink", bandwidth=300e9, latency=3e-6),
                                            dict(name="ib", bandwidth=25e9, latency=6e-6, step_overhead=4e-6)])
    sizes = tuple(tier.devices for tier in cluster.tiers)
    for group in (Group(4, 1), Group(8, 1), Group(4, 4), Group(16, 1), Group(8, 8), Group(4, 16), Group(2, 32)):
        assert cluster.even(group)
        (counted,) = counted_placements(sizes, cluster.num_devices, group)
        for counted_cost, closed_form in ((cluster._all_reduce(counted), cluster.all_reduce(group)),
                                          (cluster._exchange(group.size, counted), cluster.all_to_all(group))):
            assert (counted_cost.per_byte, counted_cost.fixed) == pytest.approx(
                (closed_form.per_byte, closed_form.fixed), rel=1e-15)


MI300X_LINK = 64e9 * 0.8  # mi300x_platform: one Infinity Fabric link per direction x efficiency


def test_fully_connected_mi300x_node():
    """Each pair of GPUs on its own link: an all-reduce of g in the node sends 2·S/g to each of the
    g − 1 others at once, 2·S/g / B_link, in one step per half (2λ); a group of 2 uses its one link;
    an all-to-all sends S/8 to each peer at once: S/8 / B_link, one step."""
    node = SYSTEMS["mi300x_platform"].cluster(8)
    assert isinstance(node, FullyConnected)
    assert node.all_reduce(Group(8, 1)).scalar(S) == pytest.approx(2 * S / 8 / MI300X_LINK + 2 * 3.4e-6, rel=1e-12)
    assert node.all_reduce(Group(2, 1)).scalar(S) == pytest.approx(S / MI300X_LINK + 2 * 3.4e-6, rel=1e-12)
    assert node.all_to_all(Group(8, 1)).scalar(S) == pytest.approx(S / 8 / MI300X_LINK + 3.4e-6, rel=1e-12)
    # a pipeline transfer takes one link
    assert node.send(0).scalar(S) == pytest.approx(S / MI300X_LINK + 3.4e-6, rel=1e-12)
    # 16 GPUs over two nodes: 2·S/8 inside each node, then a ring of 2 nodes on S/8 over the 400G NICs
    # (at least the AMD host's 6 us a step), one step inside each way and 1 across
    two = SYSTEMS["mi300x_platform"].cluster(16)
    expected = 2 * S / 8 / MI300X_LINK + 2 * 1 / 2 * (S / 8) / (50e9 * 0.94) + 2 * 1 * 6e-6 + 2 * 1 * 14e-6
    assert two.all_reduce(Group(16, 1)).scalar(S) == pytest.approx(expected, rel=1e-12)


def test_an_all_reduce_on_the_v6e_16x16_torus():
    """A 256-chip v6e slice is a 16 x 16 torus, both axes wrapping (16 is a multiple of 16): 2 links
    per direction per chip on each ring, 2 x 90 GB/s x 0.8. A reduce-scatter over both axes at once:
    phase 1 half the data on each axis, (1/2)(15/16)/B; phase 2 the 1/16 left of each half on the
    other axis, (1/16)(1/2)(15/16)/B; 15 steps of 5 us a phase. The all-reduce twice that."""
    torus = SYSTEMS["tpuv6e_pod"].cluster(256)
    assert torus.shape == (16, 16) and torus.wraps == (True, True)
    ring = 2 * 90e9 * 0.8
    reduce_scatter = 1 / 2 * 15 / 16 / ring + 1 / 16 * 1 / 2 * 15 / 16 / ring
    expected = 2 * (reduce_scatter * S + 2 * 15 * 5e-6)
    assert torus.all_reduce(Group(256, 1)).scalar(S) == pytest.approx(expected, rel=1e-12)


def test_published_runs_name_the_most_specific_chip():
    assert system_of("GB200 NVL72").name == "gb200_nvl72"  # contains "B200": the longest name wins
    assert system_of("DGX B200").name == "dgx_b200"
    assert system_of("H200 SXM 141GB").name == "dgx_h200" and system_of("H100 SXM5 80GB").name == "dgx_h100"
    assert system_of("AMD Instinct MI300X").name == "mi300x_platform"
    assert system_of("TPU v6e").name == "tpuv6e_pod" and system_of("TPU v5e").name == "tpuv5e_pod"


def user_chip(folder: Path, **changes) -> Path:
    """The H100's file copied as a user's chip with 141 GB at 4.8 TB/s, and `changes`."""
    entry = yaml.safe_load((REPOSITORY / "phaze_hardware" / "chips" / "h100_sxm.yaml").read_text())
    entry["hbm_capacity"] = {"value": 141e9, "source": "a user's H100 with 141 GB"}
    entry["hbm_bandwidth"] = {"value": 4.8e12, "source": "a user's H100 at 4.8 TB/s"}
    entry.update(changes)
    path = folder / "my_h100.yaml"
    path.write_text(yaml.safe_dump(entry))
    return path


@pytest.mark.parametrize("change, message", [
    ({"hbm_capacity": {"value": -141e9, "source": "negative"}},
     "my_h100.yaml: hbm_capacity.value must be a positive number, got -141000000000.0"),
    ({"hbm_bandwidth": {"value": 4.8e12}}, "my_h100.yaml: hbm_bandwidth must be {value, source} with a source"),
    ({"peak_flops": None}, "my_h100.yaml: peak_flops must be {value, source} with a source"),
    ({"matrix_efficiency": {"value": 1.5, "source": "x"}},
     "my_h100.yaml: matrix_efficiency.value must be a fraction of the peak in (0, 1], got 1.5"),
    ({"mxfp8_peak_flops": {"value": 4.5e15, "source": "x"}, "mxfp8_matrix_efficiency": {"value": 1.2, "source": "x"}},
     "my_h100.yaml: mxfp8_matrix_efficiency.value must be a fraction of the peak in (0, 1], got 1.2"),
    ({"mxfp8_peak_flops": {"value": 4.5e15, "source": "x"}},
     "my_h100.yaml: mxfp8_peak_flops and mxfp8_matrix_efficiency go together (MXFP8 tensor cores); give both "
     "or neither"),
])
def test_a_bad_chip_file_is_one_line_naming_the_file_and_the_field(tmp_path, change, message):
    with pytest.raises(InputError) as raised:
        chip_of(str(user_chip(tmp_path, **change)))
    assert str(raised.value) == message


def test_a_missing_figure_is_named(tmp_path):
    path = user_chip(tmp_path)
    entry = yaml.safe_load(path.read_text())
    del entry["streaming_multiprocessors"]
    path.write_text(yaml.safe_dump(entry))
    with pytest.raises(InputError, match="^my_h100.yaml: streaming_multiprocessors missing; a roofline chip states"):
        read_chip(path)


def test_a_system_file_names_a_chip_file(tmp_path):
    import phaze.api

    user_chip(tmp_path)
    system = tmp_path / "my_dgx.yaml"
    system.write_text(yaml.safe_dump({"name": "my_dgx", "chip": "my_h100.yaml", "node_size": 8,
                                      "tiers": [{"name": "nvlink4", "bandwidth": 450e9},
                                                {"name": "ib", "bandwidth": 50e9}]}))
    checked = phaze.api.settings("predict", "bertlarge", system=str(system), num_devices=8, tensor_parallel_width=8,
                                 pipeline_parallel_width=1, data_parallel_width=1, global_batch_size=8,
                                 cache_dir=str(tmp_path / "cache"))
    assert checked.known_chip.name == "my_h100" and checked.known_chip.hbm_capacity == 141e9
    assert [tier.bandwidth for tier in checked.question.cluster.tiers] == [450e9, 50e9]
    system.write_text(system.read_text().replace("my_h100.yaml", "no_such_chip.yaml"))
    with pytest.raises(InputError, match=r"^my_dgx.yaml: chip: no such chip file '.*no_such_chip.yaml'"):
        phaze.api.settings("predict", "bertlarge", system=str(system), num_devices=8, tensor_parallel_width=8,
                           pipeline_parallel_width=1, data_parallel_width=1, global_batch_size=8)


def phaze(*arguments, cwd):
    environment = {**os.environ, "PYTHONPATH": str(REPOSITORY)}
    return subprocess.run([sys.executable, "-m", "phaze", *arguments], cwd=cwd, capture_output=True, text=True,
                          env=environment)


# 12.6e9 parameters (40 blocks of 12·5120²) at t = p = 1, d = 8 with the distributed optimizer: 2 + 4
# bytes of 16-bit weights and fp32 gradients per parameter and 12/8 of Adam's state, 7.5 bytes:
# about 94e9 bytes, more than the H100's 80 GiB (85.9e9), less than 141e9
LARGE = ["model=megatrongpt3", "+model.overrides.num_layers=40", "+model.overrides.hidden_size=5120",
         "+model.overrides.num_heads=40", "+model.overrides.ffn_hidden_size=20480", "+model.overrides.vocab_size=1024",
         "+model.overrides.max_position_embeddings=128", "sequence_length=128", "system=dgx_h100", "num_devices=8",
         "tensor_parallel_width=1", "pipeline_parallel_width=1", "data_parallel_width=8", "global_batch_size=8",
         "micro_batch_size=1", "recompute=none"]


def test_a_users_chip_by_path_on_the_command_line(tmp_path):
    path = user_chip(tmp_path)
    packaged = phaze("predict", *LARGE, f"hydra.run.dir={tmp_path / 'h100'}", cwd=tmp_path)
    assert packaged.returncode == 2 and "does not fit" in packaged.stderr and "80 GiB available" in packaged.stderr
    users = phaze("predict", *LARGE, f"chip={path.name}", f"hydra.run.dir={tmp_path / 'mine'}", cwd=tmp_path)
    assert users.returncode == 0, users.stderr
    assert "my_h100" in users.stdout


def test_a_bad_chip_file_on_the_command_line_is_one_line_and_exit_2(tmp_path):
    path = user_chip(tmp_path, hbm_bandwidth={"value": -4.8e12, "source": "negative"})
    run = phaze("predict", *LARGE, f"chip={path}", cwd=tmp_path)
    assert run.returncode == 2 and run.stderr.count("\n") == 1
    assert "my_h100.yaml: hbm_bandwidth.value must be a positive number" in run.stderr
