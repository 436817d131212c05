"""The fixed Megatron baseline: a pipeline with a stage holding no block is infeasible, with why."""

import pytest

from graph_extract import extract
from phaze.modes.run_solver import report
from phaze.search_run import execute
from solver.evaluate import fixed_baseline

FAST = ("n_jobs=1", "candidate_sample=4", "schedule.backend=heuristic")
#: the tiny model (2 blocks, 16 devices) with Megatron's fixed placement on 4 stages x width 2 x 2 replicas
FOUR_STAGES = ("model.fixed_megatron.pipeline_parallel_width=4", "model.fixed_megatron.data_parallel_width=2")


@pytest.mark.parametrize("system", ["tpuv4_pod", "original"])
def test_more_stages_than_blocks_is_infeasible_and_says_why(tmp_path, tiny_settings, capsys, system):
    settings = tiny_settings(tmp_path / "cache", *FAST, f"system={system}", *FOUR_STAGES)
    summary = execute(settings, tmp_path)
    fixed = summary["baselines"]["fixed_megatron"]
    reason = "4 pipeline stages but megatrongpt3 has 2 blocks: a stage would be empty"
    assert summary["feasible"] and summary["throughput"] > 0
    assert fixed["feasible"] is False and fixed["speedup"] is None and fixed["throughput"] == 0.0
    assert fixed["infeasible_reason"] == reason
    assert summary["per_setting"][0]["baselines"]["fixed_megatron"] == fixed
    report(summary, tmp_path)
    printed = " ".join(capsys.readouterr().out.split())
    assert f"vs fixed_megatron: infeasible ({reason})" in printed


@pytest.mark.parametrize("system", ["tpuv4_pod", "original"])
def test_a_fixed_pipeline_with_a_block_per_stage_is_compared(tmp_path, tiny_settings, capsys, system):
    summary = execute(tiny_settings(tmp_path / "cache", *FAST, f"system={system}"), tmp_path)  # 2 stages, 2 blocks
    fixed = summary["baselines"]["fixed_megatron"]
    assert fixed["feasible"] is True and fixed["infeasible_reason"] is None
    assert fixed["speedup"] == pytest.approx(summary["throughput"] / fixed["throughput"])
    assert fixed["speedup"] >= 1  # the search's space holds the fixed placement
    report(summary, tmp_path)
    assert f"vs fixed_megatron: {fixed['speedup']:.2f}x" in capsys.readouterr().out


@pytest.mark.parametrize(
    "blocks, stages, system, reason",
    [
        (2, 3, "tpuv4_pod", "3 pipeline stages but megatrongpt3 has 2 blocks: a stage would be empty"),
        # the original's layout puts ceil(7 / 6) = 2 blocks on each stage: stages 0-3 hold the 7, stage 5
        # the layers after them, stage 4 nothing
        (7, 6, "original", "6 pipeline stages of ceil(7 / 6) = 2 of the 7 blocks of megatrongpt3 (the original's "
                           "layout): stage 4 would be empty"),
        (7, 6, "tpuv4_pod", None),  # Megatron's even split refuses 7 blocks on 6 stages for another reason
        (6, 6, "original", None),
        (8, 4, "original", None),
    ],
)
def test_empty_stage(tmp_path, tiny_settings, blocks, stages, system, reason):
    settings = tiny_settings(tmp_path, f"system={system}", f"model.overrides.num_layers={blocks}",
                             f"model.fixed_megatron.pipeline_parallel_width={stages}",
                             "model.fixed_megatron.data_parallel_width=1")
    axes = settings.axes.at(micro_batch_size=1)
    graphs = {width: extract(settings.spec, 1, settings.question.sequence_length, width, cache_dir=tmp_path)
              for width in axes.tensor_parallel_widths}
    _, why = fixed_baseline(settings.question, axes, graphs, settings.accelerator, None)
    if reason is None:  # no empty stage (it may not fit, or Megatron's even split may refuse it)
        assert why is None or "empty" not in why
    else:
        assert why == reason


def test_the_fixed_baseline_fills_the_runs_cluster(tmp_path, tiny_settings):
    """The model's fixed (t, p) = (2, 2) with d = 4 is written for 16 devices; on 32 it takes d = 8, so
    that the search and the baseline are compared on the same devices."""
    settings = tiny_settings(tmp_path / "cache", *FAST, "num_devices=32")
    assert settings.question.baseline.devices == 32 and settings.question.baseline.data_parallel_width == 8
    summary = execute(settings, tmp_path)
    fixed = summary["baselines"]["fixed_megatron"]
    assert fixed["placement"]["data_parallel_width"] == 8 and fixed["feasible"]
    assert tiny_settings(tmp_path / "cache").question.baseline.data_parallel_width == 4  # as written on 16
