"""The system architecture space (`architecture_space=system`): a candidate's memory, links, power and
cost by hand, the bounded search against the exhaustive one on a sample, the written Pareto front
against every chip evaluated, and bad settings as one line."""

from __future__ import annotations

import dataclasses
import math

import pandas as pd
import pytest

from phaze_common.checks import InputError
from hydra import compose, initialize_config_module

from phaze import report, results
from phaze.settings import settings_from_config
from phaze.search_run import execute
from solver.search.outcomes import evaluate_accelerator
from solver.search.resources import Resources
from solver.system_search import SystemSearch, chip_figures
from tests.test_cli import phaze

#: A small system space: 2 HBM generations x 2 stack counts x 2 link generations.
SMALL = ["architecture_space=system", "hbm_size=null", "n_jobs=1", "system_space.hbm_generations=[hbm2,hbm3e]",
         "system_space.hbm_stacks=[1,4]", "system_space.link_generations=[ici_v4,nvlink5]", "system_space.links=[6]"]


def test_a_candidates_memory_links_power_and_cost_by_hand(tiny_settings, tmp_path):
    settings = tiny_settings(tmp_path, "architecture_space=system", "hbm_size=null", "system_space.hbm_stacks=[4]",
                             "system_space.hbm_generations=[hbm3e]", "system_space.link_generations=[nvlink5]",
                             "system_space.links=[12]")
    design = settings.system_design
    (option,) = design.options
    # 4 HBM3E stacks of 1 TB/s and 24 GB; 12 NVLink5 links of 50 GB/s a direction
    assert (option.memory.bandwidth, option.memory.capacity) == (4e12, 96e9)
    assert option.links.bandwidth == 600e9
    # the TPU v4 pod's torus links (45 GB/s, measured by its 6 ICI links of 50 GB/s) scaled by 600 / 300
    assert option.cluster.link.bandwidth == pytest.approx(45e9 * 600 / 300, rel=1e-12)
    # the default die budget: tpuv4_like's compute and TPU v4's 4 HBM2 stacks and 6 ICI links
    interfaces_v4 = 4 * (10.45e6 + 5.74e6) + 6 * (1.888e6 + 0.775e6)
    assert design.budgets.area == pytest.approx(settings.accelerator.area + interfaces_v4, rel=1e-12)
    space = SystemSearch(settings.search_context(1), design).option_outcome(0).resources.space
    figures = chip_figures(space, design, option)
    index = int(figures.admitted.nonzero()[0][0])
    chip = space[index]
    interfaces = 4 * (10.45e6 + 5.74e6) + 12 * (0.965e6 + 0.9e6)
    die = chip.area + interfaces
    assert figures.die_area[index] == pytest.approx(die, rel=1e-12)
    # peak power at 7 nm (TPUv4i's figures): idle 1.375e-7 W/µm² and 8 W a stack; MACs 0.59 pJ, vector
    # ops 1.69 pJ, 16-bit words from the core buffers (64 a cycle a core) at 0.133 pJ/bit and from the
    # global buffer (256 a cycle a core) at 0.219 pJ/bit; HBM 4 TB/s at 4.3 pJ/bit; links 600 GB/s at 5.6
    clock = 1.05e9
    peak = (1.375e-7 * die + 4 * 8.0 + chip.num_tc * chip.tc_width * chip.tc_depth * clock * 0.59e-12
            + chip.num_vc * chip.vc_width * clock * 1.69e-12 + chip.num_tc * 64 * clock * 16 * 0.133e-12
            + chip.num_tc * 256 * clock * 16 * 0.219e-12 + 8 * 4e12 * 4.3e-12 + 8 * 600e9 * 5.6e-12)
    assert figures.peak_power[index] == pytest.approx(peak, rel=1e-9)
    assert figures.idle_power[index] == pytest.approx(1.375e-7 * die + 32.0, rel=1e-12)
    # cost: a 300 mm wafer of $9,346 at 0.09 defects per cm² (negative binomial, α = 3), HBM3E at
    # $15.1 a GB, a $750 package
    dies = math.pi * 150e3**2 / die - math.pi * 300e3 / math.sqrt(2 * die)
    good = (1 + die * 9e-10 / 3) ** -3
    assert figures.cost[index] == pytest.approx(9346 / (dies * good) + 96 * 15.1 + 750, rel=1e-9)


def outcome(settings, strategy, step=2003):
    search = SystemSearch(settings.search_context(1), settings.system_design, candidates=range(0, 29360, step))
    found, evaluated = search.run(strategy)
    return (found.option, found.best.index, found.value), evaluated


@pytest.mark.slow
def test_bounded_returns_what_exhaustive_returns_on_the_default_model(tmp_path):
    # bertlarge on 1,024 chips of the TPU v4 pod, every 1,000th compute candidate with 8 memories and links
    with initialize_config_module("phaze.conf", version_base="1.3"):
        config = compose("config", overrides=["mode=run_solver", f"cache_dir={tmp_path}", *SMALL])
    settings = settings_from_config(config)
    exhaustive, every = outcome(settings, "exhaustive", 1000)
    bounded, fewer = outcome(settings, "bounded", 1000)
    assert bounded == exhaustive
    assert fewer < every


@pytest.mark.slow
@pytest.mark.parametrize("extra", [[], ["objective=tokens_per_dollar", "power_budget=400"],
                                   ["objective=tokens_per_joule", "cost_budget=2500"]])
def test_bounded_returns_what_exhaustive_returns_on_a_sample_of_the_system_space(tiny_settings, tmp_path, extra):
    settings = tiny_settings(tmp_path, *SMALL, *extra)
    exhaustive, every = outcome(settings, "exhaustive")
    bounded, fewer = outcome(settings, "bounded")
    assert bounded == exhaustive
    assert fewer < every


@pytest.mark.slow
def test_the_written_front_is_the_non_dominated_chips_and_best_json_states_the_chip(tiny_settings, tmp_path):
    settings = tiny_settings(tmp_path / "cache", *SMALL, "search=exhaustive", "candidate_sample=12")
    summary = execute(settings, tmp_path)
    front = pd.read_parquet(tmp_path / "pareto.parquet")
    table = results.read_table(tmp_path)
    chips = table[table["feasible"]].groupby(["hbm_generation", "hbm_stacks", "link_generation", "links",
                                              "candidate_index"], as_index=False).agg(
        throughput=("throughput", "max"), power_w=("power_w", "first"), cost_usd=("cost_usd", "first"))
    assert len(chips) == summary["pareto_front"] + (len(chips) - len(front)) and len(front) >= 1

    def dominated(row):
        better = ((chips["throughput"] >= row.throughput) & (chips["power_w"] <= row.power_w)
                  & (chips["cost_usd"] <= row.cost_usd))
        strictly = ((chips["throughput"] > row.throughput) | (chips["power_w"] < row.power_w)
                    | (chips["cost_usd"] < row.cost_usd))
        return bool((better & strictly).any())

    on_front = {tuple(row) for row in front[["throughput", "power_w", "cost_usd"]].itertuples(index=False)}
    for row in chips.itertuples(index=False):
        assert dominated(row) != ((row.throughput, row.power_w, row.cost_usd) in on_front)
    setting = summary["per_setting"][0]
    accelerator = setting["accelerator"]
    assert {"hbm_generation", "hbm_stacks", "hbm_bandwidth", "hbm_capacity", "link_generation", "links",
            "link_bandwidth"} <= set(accelerator)
    assert setting["throughput"] == chips["throughput"].max()
    assert setting["power_w"] > 0 and setting["cost_usd"] > 0 and setting["energy_per_token_j"] > 0
    assert setting["hbm_size_gib"] == pytest.approx(accelerator["hbm_capacity"] / 2**30)
    # phaze report shows the front and draws it with the others'
    found = report.collect(tmp_path)
    assert len(found.fronts) == len(front) and set(found.fronts["throughput"]) == set(front["throughput"])
    out = tmp_path / "report"
    out.mkdir()
    assert out / "report_pareto.png" in report.write(found, out)
    assert "x hbm" in found.shown["accelerator"].iloc[0] and found.shown["power_w"].iloc[0] == setting["power_w"]
    # a damaged results table leaves the run's front shown (its summary from best.json alone)
    (tmp_path / "results.parquet").write_bytes(b"not parquet")
    damaged = report.collect(tmp_path)
    assert len(damaged.fronts) == len(front) and damaged.evaluations.empty
    assert any("summarised from best.json alone" in note for note in damaged.notes)


@pytest.mark.parametrize("arguments, message", [
    (["architecture_space=system", "power_budget=-5"], "power_budget: must be a finite positive number of W or null, got -5"),
    (["architecture_space=system", "cost_budget=free"], "cost_budget: must be a finite positive number of US dollars or null, got 'free'"),
    (["architecture_space=chips"], "architecture_space: unknown 'chips'; allowed: original, system"),
    (["architecture_space=system", "objective=speed"],
     "objective: unknown 'speed'; allowed: throughput, tokens_per_joule, tokens_per_dollar"),
    (["architecture_space=system", "system_space.hbm_generations=[hbm4]"],
     "system_space.hbm_generations: unknown 'hbm4'; allowed: hbm2, hbm2e, hbm3, hbm3e"),
    (["architecture_space=system", "system_space.link_generations=[nvlink6]"],
     "system_space.link_generations: unknown 'nvlink6'; allowed: nvlink3, nvlink4, nvlink5, ici_v4"),
    (["architecture_space=system", "system_space.hbm_stacks=[9]"], "system_space.hbm_stacks: must be an integer"),
    (["power_budget=300"], "power_budget: needs architecture_space=system"),
    (["objective=tokens_per_joule"], "objective: tokens_per_joule needs architecture_space=system"),
    (["architecture_space=system", "search=phaze"], "search: architecture_space=system searches with bounded or "
                                                    "exhaustive; got phaze"),
    (["architecture_space=system", "chip=h100_sxm"], "architecture_space: h100_sxm is a chip that exists"),
    (["architecture_space=system", "hbm_size=64"], "hbm_size: architecture_space=system takes the HBM capacity"),
    (["architecture_space=system", "system=tpuv5e_pod"], "architecture_space: system 'tpuv5e_pod' has no reference"),
])
def test_bad_system_settings_are_one_line(arguments, message, tiny_settings, tmp_path):
    if not any(argument.startswith("hbm_size=") for argument in arguments):
        arguments = ["hbm_size=null", *arguments]  # the tiny configuration's 1 GiB is a swept setting
    with pytest.raises(InputError) as raised:
        tiny_settings(tmp_path, *arguments)
    assert message in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize("argument, message", [
    ("power_budget=-5", "power_budget: must be a finite positive number of W or null, got -5"),
    ("system_space.hbm_generations=[hbm4]", "system_space.hbm_generations: unknown 'hbm4'; allowed: hbm2, hbm2e, "
                                            "hbm3, hbm3e"),
])
def test_bad_system_settings_on_the_command_line_are_one_line_exit_2_and_write_nothing(argument, message, tmp_path):
    result = phaze("run_solver", "architecture_space=system", argument, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == f"phaze: error: {message}"
    assert not any(tmp_path.rglob("best.json"))


def test_the_reference_option_prices_the_systems_own_cluster(tiny_settings, tmp_path):
    settings = tiny_settings(tmp_path, "architecture_space=system", "hbm_size=null", "system_space.hbm_stacks=[4]",
                             "system_space.hbm_generations=[hbm2]", "system_space.link_generations=[ici_v4]",
                             "system_space.links=[6]")
    (option,) = settings.system_design.options
    assert option.cluster.to_dict() == settings.question.cluster.to_dict()
    assert dataclasses.astuple(option.memory) == dataclasses.astuple(settings.system_design.reference.memory)


def test_each_option_is_priced_on_its_own_cluster(tiny_settings, tmp_path):
    # one chip with 6 and with 18 ICI links: the search's shared state (graphs, group bounds, placement
    # memo) gives each what a search of that option alone gives, and the links change the answer
    settings = tiny_settings(tmp_path / "shared", "architecture_space=system", "hbm_size=null",
                             "system_space.hbm_stacks=[4]", "system_space.hbm_generations=[hbm3e]",
                             "system_space.link_generations=[ici_v4]", "system_space.links=[6,18]",
                             "num_devices=256", "global_batch_size=256")
    search = SystemSearch(settings.search_context(1), settings.system_design)
    throughputs = []
    for position in (0, 1):
        found = search.option_outcome(position)
        capacity, index = int(found.option.memory.capacity), 1000
        shared = evaluate_accelerator(found.resources, found.resources.space[index], index).best(capacity)
        alone_context = dataclasses.replace(found.resources.context, cache_dir=tmp_path / f"alone{position}")
        alone = Resources.build(alone_context)
        assert shared.throughput == evaluate_accelerator(alone, alone.space[index], index).best(capacity).throughput
        throughputs.append(shared.throughput)
    assert throughputs[0] != throughputs[1]
