"""`phaze report DIR`: one table and plots from every run_solver run found under a directory.

Each run is complete, interrupted (its best.json says `"complete": false`: the best of what was
evaluated) or failed (a job of a sweep that stopped with an error: best.json states it). A run
whose best.json cannot be used (truncated, not JSON, lacking fields) is skipped and listed with why
after the table; report.csv has a row for it too (status `skipped`), so it alone accounts for every
run under DIR. A run whose results.parquet cannot be read is summarised from best.json alone. A
sweep job of run_solver that left no best.json (its process or node died, or it still runs) is
listed as failed, with its failure.txt when it wrote one, so a sweep's report names every job.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from phaze import plots, results, rundir, sweep
from solver import pareto
from solver.layout import Layout

COLUMNS = {
    "run": "run",
    "model": "model",
    "status": "status",
    "micro_batch_size": "mbs",
    "hbm_size_gib": "HBM GiB",
    "feasible": "feasible",
    "throughput": "samples/s",
    "accelerator": "accelerator",
    "area_mm2": "area mm²",
    "system": "system",
    "placement": "layout",
    "recompute": "recompute",
    "power_w": "peak W",
    "cost_usd": "chip $",
    "speedup_tpuv4_like": "vs TPUv4-like",
    "speedup_tpuv4": "vs TPU v4",
    "speedup_fixed_megatron": "vs fixed Megatron",
    "architectures_evaluated": "evaluated",
    "reason": "reason",
}
SKIPPED = "skipped"
REASON_WIDTH = 60  # characters of the reason column per line


def accelerator_text(accelerator: dict) -> str:
    """A known chip's name, or a candidate's cores and buffer (and, in the system space, its HBM
    stacks and links)."""
    if "name" in accelerator:
        return accelerator["name"]
    text = (f"{accelerator['num_tc']}x{accelerator['tc_width']}x{accelerator['tc_depth']} TC, "
            f"{accelerator['num_vc']} VC, {accelerator['glb_bytes'] // 2**20} MiB")
    if "hbm_generation" in accelerator:
        text += (f", {accelerator['hbm_stacks']}x {accelerator['hbm_generation']}, "
                 f"{accelerator['links']}x {accelerator['link_generation']}")
    return text


def setting_row(run: str, best: dict, setting: dict) -> dict:
    """One (micro-batch, HBM) setting of a run's best.json, flattened."""
    complete = best["complete"] and setting.get("complete", True)
    row = {"run": run, "model": best["model"], "status": "complete" if complete else "interrupted",
           "micro_batch_size": setting["micro_batch_size"], "hbm_size_gib": setting["hbm_size_gib"],
           "feasible": setting["feasible"], "throughput": setting.get("throughput", 0.0),
           "architectures_evaluated": setting.get("architectures_evaluated"), "reason": setting.get("reason")}
    if row["feasible"]:
        accelerator, placement = setting["accelerator"], setting["placement"]
        row.update(
            accelerator=accelerator_text(accelerator),
            area_mm2=accelerator["area"] / 1e6 if "area" in accelerator else None,
            system=setting["system"].get("name"),
            placement=Layout(**{name: placement[name] for name in results.LAYOUT_FIELDS if name in placement}).text(),
            recompute=placement["recompute"],
            power_w=setting.get("power_w"),
            cost_usd=setting.get("cost_usd"),
        )
        for name, baseline in setting.get("baselines", {}).items():
            row[f"speedup_{name}"] = baseline.get("speedup")
    return row


def run_rows(run: str, best: dict) -> list[dict]:
    """The rows of one readable run: one per setting, or one saying why it has none."""
    if "error" in best:
        return [{"run": run, "model": best.get("model"), "status": "failed", "feasible": False, "reason": best["error"]}]
    if not best["per_setting"]:
        status = "complete" if best["complete"] else "interrupted"
        return [{"run": run, "model": best["model"], "status": status, "feasible": False,
                 "reason": "no setting finished"}]
    return [setting_row(run, best, setting) for setting in best["per_setting"]]


def unfinished_jobs(directory: Path) -> list[Path]:
    """The run_solver jobs under `directory` (hydra's `.hydra` in them) without a best.json."""
    jobs = []
    for hydra in directory.rglob(".hydra"):
        job = hydra.parent
        if (job / results.BEST).exists():
            continue
        try:
            overrides = (hydra / "overrides.yaml").read_text().splitlines()
        except OSError:
            continue
        if "- mode=run_solver" in overrides:
            jobs.append(job)
    return sorted(jobs, key=sweep.job_order)


def unfinished_row(run: str, job: Path) -> dict:
    """A job that wrote no best.json: why it failed if it said so, else that it did not finish."""
    try:
        why = (job / sweep.FAILURE).read_text().strip()
    except OSError:
        why = f"no {results.BEST}: the job did not finish (see its phaze.log)"
    return {"run": run, "status": "failed", "feasible": False, "reason": why}


@dataclass(frozen=True)
class Collected:
    """What `phaze report` found under a directory."""

    summary: pd.DataFrame  # one row per setting of every run (COLUMNS), skipped runs included
    evaluations: pd.DataFrame  # every readable results table, with its run and model
    notes: tuple[str, ...]  # runs summarised without their results table, and why
    fronts: pd.DataFrame = field(default_factory=pd.DataFrame)  # the Pareto fronts of system-space runs (pareto.parquet), with their run

    @property
    def skipped(self) -> pd.DataFrame:
        return self.summary[self.summary["status"] == SKIPPED]

    @property
    def shown(self) -> pd.DataFrame:
        return self.summary[self.summary["status"] != SKIPPED]


def collect(directory: Path) -> Collected:
    """Every run under `directory`: its rows, its evaluation table, or why it was skipped."""
    rows, tables, notes, fronts = [], [], [], []
    for best_file in sorted(directory.rglob(results.BEST)):
        run = str(best_file.parent.relative_to(directory))
        try:
            best = results.read_best(best_file.parent)
        except results.DamagedRun as damage:
            rows.append({"run": run, "status": SKIPPED, "feasible": False, "reason": str(damage)})
            continue
        rows.extend(run_rows(run, best))
        for read, found, extra, without in (
                (results.read_table, tables, {"model": best.get("model")}, f"summarised from {results.BEST} alone"),
                (results.read_pareto, fronts, {}, "its Pareto front is not shown")):
            try:
                frame = read(best_file.parent)
            except results.DamagedRun as damage:
                notes.append(f"{run}: {damage}: {without}")
                continue
            if len(frame):
                found.append(frame.assign(run=run, **extra))
    rows += [unfinished_row(str(job.relative_to(directory)), job) for job in unfinished_jobs(directory)]
    return Collected(pd.DataFrame(rows, columns=list(COLUMNS)), pd.concat(tables) if tables else pd.DataFrame(),
                     tuple(notes), pd.concat(fronts, ignore_index=True) if fronts else pd.DataFrame())


def cell(value) -> Text:
    """A table cell, as plain text (a reason's brackets are not markup)."""
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return Text("")
    return Text(f"{value:.3g}" if isinstance(value, float) else str(value))


def print_report(directory: Path, found: Collected) -> None:
    """The table of the runs read, then one line per run skipped or read without its table."""
    console = Console()
    if len(found.shown):
        table = Table(title=f"phaze report: {directory}")
        for key, header in COLUMNS.items():
            table.add_column(header, no_wrap=key != "reason", max_width=REASON_WIDTH if key == "reason" else None)
        for row in found.shown.to_dict("records"):
            table.add_row(*(cell(value) for value in row.values()))
        console.width = max(console.width, Measurement.get(console, console.options.update_width(10**6), table).maximum)
        console.print(table)
    if len(found.fronts):
        front = Table(title="Pareto front of the system space: no chip evaluated is faster, lower in peak power "
                            "and cheaper at once")
        for header in ("run", "mbs", "accelerator", "samples/s", "peak W", "chip $"):
            front.add_column(header, no_wrap=True)
        for row in found.fronts.to_dict("records"):
            front.add_row(*(cell(value) for value in (row["run"], row["micro_batch_size"], accelerator_text(row),
                                                     row["throughput"], row["power_w"], row["cost_usd"])))
        console.print(front)
    for row in found.skipped.to_dict("records"):
        console.print(f"skipped {row['run']}: {row['reason']}", soft_wrap=True, markup=False)
    for note in found.notes:
        console.print(note, soft_wrap=True, markup=False)


def report_title(found: Collected) -> str:
    """The report plot's title: the models of the settings shown and their count."""
    models = ", ".join(dict.fromkeys(str(model) for model in found.shown["model"].dropna()))
    return f"{models}: {len(found.shown)} settings" if models else f"{len(found.shown)} settings"


def write(found: Collected, out: Path) -> list[Path]:
    """report.csv, report.parquet and the plot of throughput against area in `out`; the files written."""
    results.write_frame(out, "report", found.summary)
    written = [out / "report.csv", out / "report.parquet"]
    evaluations = found.evaluations
    if "area" in evaluations:  # known chips have no area to plot against
        evaluations = evaluations[evaluations["area"].notna()]
        if len(evaluations):
            evaluations = evaluations.assign(series=evaluations["run"] + ": " + plots.series_label(evaluations))
            plots.plot_throughput_vs_area(evaluations, {}, out / "report_throughput_vs_area.png",
                                          report_title(found))
            written.append(out / "report_throughput_vs_area.png")
    if len(found.fronts):
        results.write_frame(out, "report_pareto", found.fronts)
        fronts = found.fronts
        overall = fronts.iloc[pareto.front([fronts[name] for name in results.PARETO_OBJECTIVES],
                                           list(results.PARETO_OBJECTIVES.values()))]
        plots.plot_pareto(overall, out / "report_pareto.png",
                          f"the front over the fronts of {fronts['run'].nunique()} runs", fronts, "the runs' fronts")
        written += [out / "report_pareto.csv", out / "report_pareto.parquet", out / "report_pareto.png"]
    return written


USAGE = ("usage: phaze report DIR [--out FOLDER]   (DIR: a run or multirun directory of phaze run_solver; "
         "report.csv and its plot go to FOLDER, by default DIR)")


def _arguments(arguments: list[str]) -> tuple[Path, Path | None] | None:
    """DIR and --out's FOLDER (None: DIR), or None if the arguments are not those."""
    rest, out = list(arguments), None
    for index, argument in enumerate(rest):
        if argument == "--out" and index + 1 < len(rest):
            out = Path(rest[index + 1])
            del rest[index:index + 2]
            break
        if argument.startswith("--out="):
            out = Path(argument.removeprefix("--out="))
            del rest[index]
            break
    if len(rest) != 1 or rest[0].startswith("-") or out == Path(""):
        return None
    return Path(rest[0]), out


def main(arguments: list[str]) -> int:
    parsed = _arguments(arguments)
    if parsed is None:
        print(USAGE, file=sys.stderr)
        return 2
    directory, out = parsed
    if not directory.is_dir():
        print(f"phaze: error: DIR: {directory} is not a directory", file=sys.stderr)
        return 2
    option, out = ("DIR", directory) if out is None else ("--out", out)
    if problem := rundir.folder_problem(out):
        print(f"phaze: error: {option}: {problem}; report.csv cannot be written there, give another folder with "
              "--out FOLDER", file=sys.stderr)
        return 2
    found = collect(directory)
    if found.summary.empty:
        print(f"phaze: error: DIR: no run under {directory} (no {results.BEST} of phaze run_solver)", file=sys.stderr)
        return 2
    if found.shown.empty:
        print_report(directory, found)
        print(f"phaze: error: DIR: none of the {len(found.skipped)} runs under {directory} can be read", file=sys.stderr)
        return 2
    try:
        written = write(found, out)
    except OSError as error:  # the folder changed meanwhile, or is full; each file is written whole or not at all
        print(f"phaze: error: {option}: cannot write {error.filename or 'in ' + str(out)} ({error.strerror}); give "
              "another folder with --out FOLDER", file=sys.stderr)
        return 2
    print_report(directory, found)
    print(f"wrote {', '.join(str(path) for path in written)}")
    return 0
