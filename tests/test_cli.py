"""The `phaze` command: modes, multirun sweeps, one-line errors with exit code 2."""

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[1]


def phaze(*arguments, cwd):
    """Run `phaze` in `cwd` (as the console script does, whether or not the package is installed)."""
    environment = {**os.environ, "PYTHONPATH": str(REPOSITORY)}
    return subprocess.run(
        [sys.executable, "-m", "phaze", *arguments], cwd=cwd, capture_output=True, text=True, env=environment
    )


@pytest.mark.parametrize(
    "arguments, field",
    [
        (["model=gpt5"], "model: unknown 'gpt5'; allowed: bertbase"),
        (["micro_batch_size=0"], "micro_batch_size"),
        (["sequence_length=-1"], "sequence_length"),
        (["model=megatrongpt2-54", "tensor_parallel_width=8"], "tensor_parallel_width: 8 does not divide the 20 heads"),
        (["model=megatrongpt3", "tensor_parallel_width=16"], "tensor_parallel_width: 16 exceeds"),
        (["-m", "model=bertlarge,gpt5"], "model: unknown 'gpt5'"),
        (["-m", "model=bertlarge", "micro_batch_size=1,-2"], "micro_batch_size"),
        (["accelerator.tc_width=96"], "accelerator.tc_width: must be a positive power of two"),
        (["accelerator.num_vc=0"], "accelerator.num_vc: must be a positive power of two"),
        (["area_budget=1000"], "area_budget: 1,000.00 µm² admits no accelerator configuration"),
        (["system=dgx_a200"], "system: unknown 'dgx_a200'; allowed: deepseek_h800, dgx_a100, dgx_b200, dgx_h100, dgx_h200, "
                               "gb200_nvl72, mi300x_platform, original, tpuv4_pod, tpuv5e_pod, tpuv5p_pod, tpuv6e_pod "
                               "or a system file's path"),
        (["-m", "system=dgx_a100,dgx_a200"], "system: unknown 'dgx_a200'"),
        (["system=dgx_a100", "num_devices=1028"], "num_devices: 1028 is not a multiple of system.node_size=8; "
                                                  "allowed: a multiple of 8"),
        (["system.tiers.0.bandwidth=0"], "system.tiers[0].bandwidth: must be a finite number > 0, got 0"),
        (["virtual_stages=5"], "virtual_stages: 5 divides no pipeline of two or more stages of the 24 blocks of "
                               "bertlarge; allowed: 1, 2, 3, 4, 6, 8, 12"),
        (["optimizer=lamb"], "optimizer: unknown 'lamb'; allowed: adam, sgd"),
        (["recompute=[none,partial]"], "recompute: unknown 'partial'; allowed: none, selective, full"),
        (["system=original", "recompute=selective"], "recompute (system=original: the original's off or on): unknown 'selective'; allowed: none, full"),
        (["data_parallel_sharding=maybe"], "data_parallel_sharding: unknown 'maybe'; allowed: none, optimizer"),
        (["flash_attention=maybe"], "flash_attention: must be true or false, got 'maybe'"),
        (["precision=fp4"], "precision: unknown 'fp4'; allowed: bf16, fp16, fp8"),
        (["chip=a100_80gb", "precision=fp8"], "precision: a100_80gb has no FP8 tensor cores"),
        (["precision=fp8"], "precision: a template chip prices 16-bit multiply-accumulates only; allowed: bf16, fp16"),
        (["chip=h100_sxm", "precision=mxfp8"], "precision: h100_sxm has no MXFP8 tensor cores (no mxfp8_peak_flops "
                                               "and mxfp8_matrix_efficiency figures); allowed: bf16, fp16, fp8"),
        (["fp8_recipe=current"], "fp8_recipe: current applies to precision=fp8 only"),
        (["fp8_parameters=true"], "fp8_parameters: needs precision=fp8"),
        (["grad_reduce_in_bf16=2"], "grad_reduce_in_bf16: must be true or false, got 2"),
        (["activation_offload=some"], "activation_offload: unknown 'some'; allowed: none, layers"),
        (["weight_dtype=fp16"], "weight_dtype: unknown 'fp16'; allowed: mixed, float32, bfloat16"),
        (["weight_dtype=float32", "master_weight_remainders=true"],
         "master_weight_remainders: applies to weight_dtype=mixed (a master copy beside 16-bit weights), not float32; "
         "allowed here: false"),
        (["activation_offload=layers"], "activation_offload: a searched chip has no host link figure; allowed: none"),
        (["chip=h800_sxm", "system=deepseek_h800", "activation_offload=layers"],
         "activation_offload: h800_sxm states no host_link_bandwidth; allowed: none"),
        (["overlap_param_gather=true"], "overlap_param_gather: needs data_parallel_sharding=optimizer or gradients and "
                                        "overlap_grad_reduce=true"),
        (["sequence_parallel=false", "tensor_parallel_overlap=true"], "tensor_parallel_overlap: needs "
                                                                      "sequence_parallel=true"),
        (["overlap_pipeline_transfers=yes"], "overlap_pipeline_transfers: must be true or false, got 'yes'"),
        (["master_weight_remainders=1"], "master_weight_remainders: must be true or false, got 1"),
        (["framework_reserve_gb=-1"], "framework_reserve_gb: must be a finite number >= 0, got -1"),
        (["data_parallel_sharding=zero3"], "data_parallel_sharding: unknown 'zero3'; allowed: none, optimizer, "
                                           "gradients, full"),
        (["data_parallel_shard_width=0"], "data_parallel_shard_width: must be a positive integer"),
        (["reshard_after_forward=maybe"], "reshard_after_forward: must be true or false, got 'maybe'"),
        (["context_parallel_width=3"], "context_parallel_width: 3 does not split the 512-token sequences into 2 x 3 "
                                       "equal chunks"),
        (["context_parallel_width=2", "flash_attention=false"], "context_parallel_width: 2 needs flash_attention=true"),
        (["max_context_parallel_width=0"], "max_context_parallel_width: must be a positive integer"),
        (["system=original", "flash_attention=true"], "flash_attention: system=original has no cost for it; "
                                                      "allowed: false"),
    ],
)
def test_bad_input_is_one_line_exit_2_nothing_written(arguments, field, tmp_path):
    result = phaze("extract_graph", *arguments, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and field in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_unknown_mode_shows_usage(tmp_path):
    result = phaze("train", cwd=tmp_path)
    assert result.returncode == 2 and "extract_graph" in result.stderr


@pytest.mark.slow
def test_multirun_sweep_writes_one_summary_per_job(tmp_path, user_cache):
    result = phaze("extract_graph", "-m", "model=bertlarge,gpt2", "micro_batch_size=1,2", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    summaries = sorted(tmp_path.glob("outputs/multirun/*/*/*/extract_summary.csv"))
    assert len(summaries) == 4
    rows = [next(csv.DictReader(path.open())) for path in summaries]
    assert [row["parameters"] for row in rows] == ["335141888"] * 2 + ["1557611200"] * 2
    assert len(list(user_cache.glob("graphs/*.json"))) == 4 and not (tmp_path / "outputs" / "cache").exists()


@pytest.mark.slow
def test_widths_and_cache_reuse(tmp_path, user_cache):
    arguments = ["model=megatrongpt3", "+model.overrides.num_layers=1", "micro_batch_size=1"]
    first = phaze("extract_graph", *arguments, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    for width in ("1", "2", "4", "8"):
        assert f"│           1 │     {width} │" in first.stdout
    cached = sorted(path.name for path in user_cache.glob("graphs/*.json"))
    assert [name.split("_")[3] for name in cached] == ["tp1", "tp2", "tp4", "tp8"]
    again = phaze("extract_graph", *arguments, cwd=tmp_path)
    assert again.returncode == 0 and again.stdout == first.stdout


@pytest.mark.slow
def test_prepopulate_estimates_fills_then_reuses_the_cache(tmp_path):
    first = phaze("prepopulate_estimates", "model=bertlarge", "micro_batch_size=1", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "11 GEMM shapes x 4,186 tensor-core configurations: 11 computed, 0 cached" in first.stdout
    again = phaze("prepopulate_estimates", "model=bertlarge", "micro_batch_size=1", cwd=tmp_path)
    assert "0 computed, 11 cached" in again.stdout
