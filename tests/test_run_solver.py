"""run_solver end to end on a tiny model: strategies agree, files are complete, runs resume."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import solver.search.driver as driver
from phaze import results
from phaze.search_run import execute
from tests.conftest import TINY

REPOSITORY = Path(__file__).resolve().parents[1]



@pytest.fixture
def run_in(tmp_path, tiny_settings):
    """run_in(name, *overrides): execute run_solver in tmp_path/name, sharing one cache."""

    def run(name, *overrides):
        directory = tmp_path / name
        directory.mkdir()
        return execute(tiny_settings(tmp_path / "cache", "n_jobs=1", *overrides), directory), directory

    return run


@pytest.mark.slow
def test_bounded_agrees_with_exhaustive_and_evaluates_fewer(run_in):
    exhaustive, _ = run_in("exhaustive", "search=exhaustive", "candidate_sample=80")
    bounded, _ = run_in("bounded", "search=bounded", "candidate_sample=80")
    assert exhaustive["architectures_evaluated"] == 80
    assert bounded["accelerator"] == exhaustive["accelerator"]
    assert bounded["throughput"] == exhaustive["throughput"]
    assert bounded["architectures_evaluated"] < 80
    phaze_sweep, _ = run_in("phaze", "search=phaze", "candidate_sample=80")
    assert phaze_sweep["architectures_evaluated"] <= 80
    assert phaze_sweep["throughput"] <= exhaustive["throughput"]


def test_interrupted_run_leaves_complete_files_and_resumes(run_in, monkeypatch):
    real = driver.evaluate_candidates
    calls = []

    def interrupt_on_third_batch(*arguments):
        calls.append(arguments)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*arguments)

    monkeypatch.setattr(driver, "evaluate_candidates", interrupt_on_third_batch)
    partial, directory = run_in("interrupted", "search=exhaustive", "candidate_sample=40")
    assert partial["complete"] is False
    best, table = results.read_run(directory)
    assert best == partial and best["per_setting"][0]["complete"] is False
    evaluated = sorted(set(table["candidate_index"]))
    assert len(evaluated) == 16 == best["architectures_evaluated"]  # two batches of 8
    assert len(table) == 3 * len(evaluated)  # recomputation none, selective and full
    assert (directory / "results.csv").read_text().count("\n") == len(table) + 1

    monkeypatch.setattr(driver, "evaluate_candidates", real)
    resumed, directory = run_in("resumed", "search=exhaustive", "candidate_sample=40")
    assert resumed["complete"] is True and resumed["architectures_evaluated"] == 40
    again = results.read_run(directory)[1].set_index(["candidate_index", "placement.recompute"])
    before = table.set_index(["candidate_index", "placement.recompute"])
    assert again.loc[before.index, "throughput"].tolist() == before["throughput"].tolist()


@pytest.mark.parametrize("system", ["original", "dgx_h100"])
def test_other_clusters_and_the_original_model(run_in, system):
    summary, _ = run_in(system, f"system={system}", "candidate_sample=12")
    assert summary["system"]["name"] == system and summary["feasible"]
    assert summary["optimizer"] == ("sgd" if system == "original" else "adam")
    assert sum(summary["breakdown_s"].values()) == pytest.approx(summary["time_per_batch_s"], rel=1e-9)
    assert summary["placement"]["recompute"] in (("none", "full") if system == "original" else
                                                 ("none", "selective", "full"))
    if system == "original":  # the original charges no optimizer step and the first stage's sync
        assert summary["breakdown_s"]["optimizer"] == 0.0


def phaze_command(*arguments, cwd):
    environment = {**os.environ, "PYTHONPATH": str(REPOSITORY)}
    return subprocess.run([sys.executable, "-m", "phaze", *arguments], cwd=cwd, capture_output=True, text=True,
                          env=environment)


@pytest.mark.slow
def test_run_solver_end_to_end_files_and_report(tmp_path):
    result = phaze_command("run_solver", *TINY, "candidate_sample=50", "n_jobs=2", "micro_batch_size=[1,2]",
                           "hbm_size=[1,2]", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    (run,) = (tmp_path / "outputs" / "runs").glob("*/*")
    best = json.loads((run / "best.json").read_text())
    for key in ("model", "micro_batch_size", "hbm_size_gib", "throughput", "time_per_batch_s",
                "architectures_evaluated", "system", "optimizer", "data_parallel_sharding", "sequence_parallel",
                "memory_capacity_bytes",
                "breakdown_s"):
        assert key in best
    assert set(best["accelerator"]) >= {"num_tc", "num_vc", "tc_width", "tc_depth", "vc_width", "glb_bytes", "area"}
    assert set(best["placement"]) >= {"pipeline_parallel_width", "tensor_parallel_width", "data_parallel_width",
                                      "virtual_stages", "recompute", "stages"}
    for name in ("tpuv4_like", "fixed_megatron"):
        assert best["baselines"][name]["throughput"] > 0 and best["baselines"][name]["speedup"] > 0
    assert len(best["per_setting"]) == 4
    assert best["throughput"] == max(setting["throughput"] for setting in best["per_setting"])
    assert abs(best["time_per_batch_s"] * best["throughput"] - 64) < 1e-6  # samples per batch
    _, table = results.read_run(run)
    assert set(table["micro_batch_size"]) == {1, 2} and set(table["hbm_size_gib"]) == {1.0, 2.0}
    for plot in ("throughput_vs_area.png", "placement.png", "gantt.png"):
        assert (run / plot).stat().st_size > 0
    report = phaze_command("report", str(tmp_path / "outputs"), cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert (tmp_path / "outputs" / "report.csv").read_text().count("\n") == 1 + 4


def test_hbm_that_fits_nothing_is_reported_with_exit_code_2(tmp_path):
    result = phaze_command("run_solver", *TINY, "hbm_size=0.0001", "candidate_sample=5", "n_jobs=1", cwd=tmp_path)
    assert result.returncode == 2
    assert "hbm_size: no placement of megatrongpt3 fits in 0.0001 GiB" in result.stderr
    (best_file,) = (tmp_path / "outputs" / "runs").glob("*/*/best.json")
    best = json.loads(best_file.read_text())
    assert best["per_setting"][0]["feasible"] is False and "no placement" in best["per_setting"][0]["reason"]
    assert best["hbm_size_gib"] == 0.0001  # as written, although 0.0001 GiB is not a whole number of bytes


def test_micro_batch_that_does_not_divide_the_batch(tmp_path):
    result = phaze_command("run_solver", *TINY, "micro_batch_size=3", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == "phaze: error: micro_batch_size: 3 does not divide global_batch_size=64"
    assert list(tmp_path.iterdir()) == []


def test_a_finished_run_reruns_from_the_caches_alone(run_in, monkeypatch):
    """Everything a finished run computed is read back: the rerun solves no layer schedule and
    searches no placement (placement results are cached per chip and HBM size), same answers."""
    import solver.schedule.cache
    import solver.step_models

    first, _ = run_in("first", "hbm_size=[1,2]", "micro_batch_size=[1,2]", "candidate_sample=24")

    def computed(*arguments, **options):
        raise AssertionError("computed again instead of read from the cache")

    monkeypatch.setattr(solver.schedule.cache, "solve", computed)
    monkeypatch.setattr(solver.step_models, "best_placement", computed)
    again, _ = run_in("again", "hbm_size=[1,2]", "micro_batch_size=[1,2]", "candidate_sample=24")
    assert again["complete"] and again["per_setting"] == first["per_setting"]


def test_the_validated_tpu_v4_is_a_baseline_on_the_same_system(run_in):
    searched, _ = run_in("searched", "candidate_sample=12")
    known, _ = run_in("tpuv4", "chip=tpuv4", "hbm_size=32")  # the chip itself, with its own 32 GiB
    baseline = searched["baselines"]["tpuv4"]
    assert baseline["accelerator"]["name"] == "tpuv4" and searched["system"] == known["system"]
    assert baseline["throughput"] == known["throughput"] and baseline["placement"] == known["placement"]
    assert baseline["speedup"] == pytest.approx(searched["throughput"] / known["throughput"], rel=1e-12)
