"""`phaze report DIR` over real runs, some interrupted, failed or damaged on disk."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_module

import solver.search.driver as driver
from phaze import results
from phaze.search_run import execute
from phaze.settings import settings_from_config
from tests.conftest import TINY

REPOSITORY = Path(__file__).resolve().parents[1]
FAST = ["n_jobs=1", "schedule.backend=heuristic"]
FAILED = "micro_batch_size: global_batch_size=64 is not a multiple of micro_batch_size x data_parallel_width"


def settings(cache_dir: Path, *overrides):
    with initialize_config_module("phaze.conf", version_base="1.3"):
        cfg = compose("config", overrides=["mode=run_solver", f"cache_dir={cache_dir}", *TINY, *FAST, *overrides])
    return settings_from_config(cfg)


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory):
    """Run directories of real tiny runs: complete (two micro-batch sizes), interrupted, failed, and on a
    known chip (no area)."""
    root = tmp_path_factory.mktemp("runs")
    cache = root / "cache"
    for name in ("complete", "interrupted", "failed", "a100"):
        (root / name).mkdir()
    execute(settings(cache, "candidate_sample=4", "micro_batch_size=[1,2]"), root / "complete")
    real, calls = driver.evaluate_candidates, []

    def interrupt_on_second_batch(*arguments):
        calls.append(arguments)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*arguments)

    driver.evaluate_candidates = interrupt_on_second_batch
    try:
        execute(settings(cache, "search=exhaustive", "candidate_sample=24"), root / "interrupted")
    finally:
        driver.evaluate_candidates = real
    # what a job of a -m sweep that failed leaves
    results.write_best(root / "failed", {"model": "megatrongpt3", "error": FAILED, "per_setting": [], "complete": False})
    execute(settings(cache, "chip=a100_80gb", "system=dgx_a100"), root / "a100")
    shutil.rmtree(cache)
    return root


@pytest.fixture
def runs(real_runs, tmp_path):
    """A fresh copy of the real runs to damage, under tmp_path/runs."""
    return Path(shutil.copytree(real_runs, tmp_path / "runs"))


def report(directory, *options) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": str(REPOSITORY)}
    return subprocess.run([sys.executable, "-m", "phaze", "report", str(directory), *map(str, options)],
                          capture_output=True, text=True, env=environment)


def best_of(directory: Path) -> dict:
    return json.loads((directory / "best.json").read_text())


def read_report(directory: Path) -> pd.DataFrame:
    return pd.read_csv(directory / "report.csv")


def test_complete_interrupted_failed_and_known_chip_runs(runs):
    result = report(runs)
    assert result.returncode == 0, result.stderr
    frame = read_report(runs)
    assert sorted(set(frame["run"])) == ["a100", "complete", "failed", "interrupted"]
    complete = frame[frame["run"] == "complete"]
    written = best_of(runs / "complete")["per_setting"]
    assert complete["status"].tolist() == ["complete"] * len(written) == ["complete"] * 2
    assert complete["micro_batch_size"].tolist() == [s["micro_batch_size"] for s in written] == [1, 2]
    assert complete["throughput"].tolist() == pytest.approx([s["throughput"] for s in written])
    assert complete["speedup_fixed_megatron"].tolist() == pytest.approx(
        [s["baselines"]["fixed_megatron"]["speedup"] for s in written])
    interrupted = frame[frame["run"] == "interrupted"]
    assert best_of(runs / "interrupted")["complete"] is False
    assert interrupted["status"].tolist() == ["interrupted"]
    assert interrupted["throughput"].item() == pytest.approx(best_of(runs / "interrupted")["throughput"])
    failed = frame[frame["run"] == "failed"]
    assert failed["status"].tolist() == ["failed"] and failed["reason"].item() == FAILED
    a100 = frame[frame["run"] == "a100"]
    assert a100["accelerator"].tolist() == ["a100_80gb"] and a100["area_mm2"].isna().all()
    assert a100["status"].tolist() == ["complete"]
    assert "skipped" not in result.stdout and (runs / "report_throughput_vs_area.png").exists()
    for status in ("complete", "interrupted", "failed"):
        assert f"│ {status} " in result.stdout
    assert FAILED[:50] in result.stdout  # the reason column wraps


def damage_truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def without(path: Path, *keys) -> None:
    """best.json without a top-level key, or (two keys) a key of its first setting."""
    best = json.loads(path.read_text())
    if len(keys) == 1:
        del best[keys[0]]
    else:
        del best[keys[0]][0][keys[1]]
    path.write_text(json.dumps(best))


def test_damaged_runs_are_skipped_and_listed_after_the_table(runs):
    damaged = {
        "truncated": (damage_truncate, "best.json is truncated or not JSON ("),
        "no_status": (lambda path: without(path, "complete"), "best.json has no 'complete' (bool)"),
        "no_chip": (lambda path: without(path, "per_setting", "accelerator"),
                    "best.json per_setting[0] has no 'accelerator' (dict)"),
        "binary": (lambda path: path.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe"), "best.json is truncated or not JSON ("),
        "empty": (lambda path: path.write_text(""), "best.json is truncated or not JSON ("),
    }
    for name, (damage, _) in damaged.items():
        shutil.copytree(runs / "complete", runs / name)
        damage(runs / name / "best.json")
    result = report(runs)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    table_end = max(index for index, line in enumerate(lines) if line.startswith("└"))
    skipped = [line for line in lines if line.startswith("skipped ")]
    assert len(skipped) == len(damaged)
    for name, (_, reason) in damaged.items():
        line = next(line for line in skipped if line.startswith(f"skipped {name}: "))
        assert line.startswith(f"skipped {name}: {reason}") and lines.index(line) > table_end
    frame = read_report(runs)
    rows = frame[frame["status"] == "skipped"].set_index("run")
    assert sorted(rows.index) == sorted(damaged)
    assert all(rows.loc[name, "reason"].startswith(reason) for name, (_, reason) in damaged.items())
    assert frame[frame["status"] != "skipped"]["run"].nunique() == 4  # the intact runs are all reported
    assert frame[frame["run"] == "complete"]["throughput"].tolist() == pytest.approx(
        [s["throughput"] for s in best_of(runs / "complete")["per_setting"]])


def test_an_unreadable_results_table_leaves_the_run_summarised_from_best_json(runs):
    shutil.copytree(runs / "complete", runs / "no_table")
    damage_truncate(runs / "no_table/results.parquet")
    result = report(runs)
    assert result.returncode == 0, result.stderr
    frame = read_report(runs)
    assert frame[frame["run"] == "no_table"]["throughput"].tolist() == pytest.approx(
        frame[frame["run"] == "complete"]["throughput"].tolist())
    assert frame[frame["run"] == "no_table"]["status"].tolist() == ["complete", "complete"]
    notes = [line for line in result.stdout.splitlines() if line.startswith("no_table: ")]
    assert len(notes) == 1
    assert notes[0].startswith("no_table: results.parquet cannot be read (")
    assert notes[0].endswith("): summarised from best.json alone")
    assert (runs / "report_throughput_vs_area.png").exists()  # from the other tables


def test_a_results_table_without_its_columns_is_unreadable(runs):
    table = pd.read_parquet(runs / "complete/results.parquet").drop(columns="throughput")
    table.to_parquet(runs / "complete/results.parquet")
    result = report(runs / "complete")
    assert result.returncode == 0, result.stderr
    assert ".: results.parquet has no column 'throughput': summarised from best.json alone" in result.stdout


@pytest.mark.parametrize("name", ["missing", "a_file"])
def test_dir_must_be_a_directory(tmp_path, name):
    (tmp_path / "a_file").write_text("")
    result = report(tmp_path / name)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == f"phaze: error: DIR: {tmp_path / name} is not a directory\n"


def test_a_directory_without_runs_is_one_line_error(tmp_path):
    (tmp_path / "empty").mkdir()
    result = report(tmp_path / "empty")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == f"phaze: error: DIR: no run under {tmp_path / 'empty'} (no best.json of phaze run_solver)\n"
    assert list((tmp_path / "empty").iterdir()) == []


def test_only_damaged_runs_lists_them_and_fails(runs):
    for name in ("complete", "interrupted", "a100"):
        shutil.rmtree(runs / name)
    damage_truncate(runs / "failed/best.json")
    result = report(runs)
    assert result.returncode == 2
    assert result.stdout.startswith("skipped failed: best.json is truncated or not JSON (")
    assert result.stdout.count("\n") == 1
    assert result.stderr == f"phaze: error: DIR: none of the 1 runs under {runs} can be read\n"
    assert not (runs / "report.csv").exists()


@pytest.mark.slow
def test_a_read_only_dir_is_one_line_and_out_writes_elsewhere(runs, read_only, tmp_path):
    """report.csv and the plot go in DIR unless --out names another folder (created if need be)."""
    read_only(runs)
    result = report(runs)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (f"phaze: error: DIR: {runs} is not writable; report.csv cannot be written there, give "
                             "another folder with --out FOLDER\n")
    assert not list(runs.glob("report*"))
    elsewhere = tmp_path / "reports" / "first"
    result = report(runs, "--out", elsewhere)
    assert result.returncode == 0, result.stderr
    assert sorted(path.name for path in elsewhere.iterdir()) == ["report.csv", "report.parquet",
                                                                 "report_throughput_vs_area.png"]
    assert set(read_report(elsewhere)["run"]) == {"complete", "interrupted", "failed", "a100"}
    assert not list(runs.glob("report*"))
    result = report(runs, f"--out={elsewhere / 'report.csv' / 'x'}")
    assert result.returncode == 2
    assert result.stderr == (f"phaze: error: --out: {elsewhere / 'report.csv' / 'x'}: {elsewhere / 'report.csv'} is a "
                             "file; report.csv cannot be written there, give another folder with --out FOLDER\n")


def test_the_report_plot_names_its_models_and_the_table_orders_widths_t_p_d(real_runs, tmp_path, monkeypatch):
    """The plot's title (read from the call, not the pixels) names the model; the layout column reads
    t, p, d, v as everything else does, as each run's best.json states its widths."""
    from phaze import plots, report as report_module

    drawn = []
    monkeypatch.setattr(plots, "plot_throughput_vs_area", lambda frame, marks, path, title: drawn.append(title))
    found = report_module.collect(real_runs)
    report_module.write(found, tmp_path)
    assert drawn == [f"megatrongpt3: {len(found.shown)} settings"]
    placement = best_of(real_runs / "complete")["per_setting"][0]["placement"]
    row = found.summary[found.summary["run"] == "complete"].iloc[0]
    assert row["placement"] == (f"t={placement['tensor_parallel_width']} p={placement['pipeline_parallel_width']} "
                                f"d={placement['data_parallel_width']} v={placement['virtual_stages']}")


def test_placement_plot_labels_each_devices_chunks_and_titles_every_width(monkeypatch, tmp_path):
    """An interleaved placement (t 4, c 2, p 4, d 2, v 2 of 16 blocks): device 0 holds blocks 0-1 and
    8-9, not "0-9"; the title gives t, c, p, d, v and t·c·p·d = 64 devices."""
    from types import SimpleNamespace

    from phaze import plots, search_run

    drawn = {}
    monkeypatch.setattr(plots, "plot_stages",
                        lambda loads, labels, path, title: drawn.update(loads=loads, labels=labels, title=title))
    stages = [{"layers": [2 * device, 2 * device + 1, 8 + 2 * device, 9 + 2 * device]} for device in range(4)]
    placement = {"tensor_parallel_width": 4, "context_parallel_width": 2, "pipeline_parallel_width": 4,
                 "data_parallel_width": 2, "virtual_stages": 2, "expert_parallel_width": 1, "stages": stages}
    costs = {4: {layer: SimpleNamespace(forward=1e-3 * layer, backward=2e-3 * layer) for layer in range(16)}}
    search_run.plot_stages(SimpleNamespace(spec=SimpleNamespace(name="tiny")), {"placement": placement}, costs,
                           tmp_path)
    assert drawn["labels"] == ["0-1, 8-9", "2-3, 10-11", "4-5, 12-13", "6-7, 14-15"]
    assert drawn["title"] == "tiny: t=4 c=2 p=4 d=2 v=2: 64 devices"
    assert drawn["loads"] == pytest.approx([3e-3 * sum(stage["layers"]) for stage in stages])
    figure = plots.stages_figure(drawn["loads"], drawn["labels"], drawn["title"])
    (axes,) = figure.axes
    assert [label.get_text() for label in axes.get_xticklabels()] == drawn["labels"]
    assert axes.get_title() == drawn["title"]
