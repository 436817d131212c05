"""`phaze report DIR`: one table and plots from every run_solver run found under a directory."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table

from phaze import plots, results

COLUMNS = {
    "run": "run",
    "model": "model",
    "micro_batch_size": "mbs",
    "hbm_size_gib": "HBM GiB",
    "feasible": "feasible",
    "throughput": "samples/s",
    "accelerator": "accelerator",
    "area_mm2": "area mm²",
    "system": "system",
    "placement": "p x t x d (v)",
    "recompute": "recompute",
    "speedup_tpuv4_like": "vs TPUv4-like",
    "speedup_fixed_megatron": "vs fixed Megatron",
    "architectures_evaluated": "evaluated",
}


def setting_row(run: str, model: str, setting: dict) -> dict:
    """One (micro-batch, HBM) setting of a run's best.json, flattened."""
    row = {"run": run, "model": model, "micro_batch_size": setting["micro_batch_size"],
           "hbm_size_gib": setting["hbm_size_gib"], "feasible": bool(setting.get("feasible")),
           "throughput": setting.get("throughput", 0.0),
           "architectures_evaluated": setting.get("architectures_evaluated")}
    if row["feasible"]:
        accelerator, placement = setting["accelerator"], setting["placement"]
        row.update(
            accelerator=f"{accelerator['num_tc']}x{accelerator['tc_width']}x{accelerator['tc_depth']} TC, "
            f"{accelerator['num_vc']} VC, {accelerator['glb_bytes'] // 2**20} MiB",
            area_mm2=accelerator["area"] / 1e6,
            system=setting["system"]["name"],
            placement=f"{placement['pipeline_stages']}x{placement['tensor_parallel_width']}x"
            f"{placement['data_parallel_degree']} ({placement['virtual_stages']})",
            recompute=placement["recompute"],
        )
        for name, baseline in setting.get("baselines", {}).items():
            row[f"speedup_{name}"] = baseline.get("speedup")
    return row


def collect(directory: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(one row per setting of every run, every run's evaluation table with its run name)."""
    rows, tables = [], []
    for best_file in sorted(directory.rglob(results.BEST)):
        run = str(best_file.parent.relative_to(directory)) or "."
        best, table = results.read_run(best_file.parent)
        rows.extend(setting_row(run, best["model"], setting) for setting in best["per_setting"])
        if len(table):
            tables.append(table.assign(run=run, model=best["model"]))
    return pd.DataFrame(rows, columns=list(COLUMNS)), pd.concat(tables) if tables else pd.DataFrame()


def main(arguments: list[str]) -> int:
    if len(arguments) != 1 or not Path(arguments[0]).is_dir():
        print("usage: phaze report DIR   (a run or multirun directory of phaze run_solver)", file=sys.stderr)
        return 2
    directory = Path(arguments[0])
    summary, evaluations = collect(directory)
    if summary.empty:
        print(f"phaze: error: DIR: no {results.BEST} under {directory}", file=sys.stderr)
        return 2
    results.write_frame(directory, "report", summary)
    if len(evaluations):
        evaluations = evaluations.assign(series=evaluations["run"] + ": " + plots.series_label(evaluations))
        plots.plot_throughput_vs_area(evaluations, {}, directory / "report_throughput_vs_area.png",
                                      f"{len(summary)} settings")
    table = Table(title=f"phaze report: {directory}")
    for header in COLUMNS.values():
        table.add_column(header, no_wrap=True)
    for row in summary.to_dict("records"):
        table.add_row(*("" if pd.isna(v) else f"{v:.3g}" if isinstance(v, float) else str(v) for v in row.values()))
    Console(width=max(Console().width, 200)).print(table)
    print(f"wrote {directory / 'report.csv'}")
    return 0
